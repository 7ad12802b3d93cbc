package main

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
)

// siblingName is the executable with the interactive onboarding form.
// `make build` builds the agent without the form (tag noform): the form's
// terminal UI is a fifth of the binary and the long-running agent never
// shows it. The package installs the sibling beside tether-edge.
const siblingName = "tether-edge-onboard"

// errNoSibling is findSibling's error when the form is not installed.
var errNoSibling = errors.New("no onboarding form")

// findSibling looks beside the agent executable, then in PATH.
func findSibling(self string) (string, error) {
	beside := filepath.Join(filepath.Dir(self), siblingName)
	if _, err := os.Stat(beside); err == nil {
		return beside, nil
	}
	if p, err := exec.LookPath(siblingName); err == nil {
		return filepath.Abs(p)
	}
	return "", fmt.Errorf("%w: the interactive onboarding form is the separate executable %s, found neither beside %s "+
		"nor in PATH: install the tether-edge package (it ships both), copy %s from the same build "+
		"(`make build` writes bin/%s) next to tether-edge, "+
		"or onboard without questions: tether-edge onboard --non-interactive --hub HUB --ca-pin PIN --credential @FILE",
		errNoSibling, siblingName, self, siblingName, siblingName)
}
