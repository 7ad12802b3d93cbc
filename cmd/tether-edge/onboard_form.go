//go:build !noform

package main

import "github.com/tether-dev/tether/cmd/internal/onboardcmd"

// Built with the form (no noform tag: `go build`, `go test`), the agent
// asks the onboarding questions itself.
var interactiveOnboard onboardcmd.Interactive = onboardcmd.Form
