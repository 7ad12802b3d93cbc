//go:build noform

package main

import (
	"context"
	"fmt"
	"os"
	"syscall"

	"github.com/tether-dev/tether/cmd/internal/onboardcmd"
	"github.com/tether-dev/tether/edge/onboard"
)

// interactiveOnboard runs the same command line in the sibling executable,
// which asks the questions and does the onboarding; it returns only on an
// error.
func interactiveOnboard(_ context.Context, _ *onboard.Config, _ bool) error {
	self, err := os.Executable()
	if err != nil {
		return err
	}
	path, err := findSibling(self)
	if err != nil {
		return err
	}
	env := append(os.Environ(), onboardcmd.EnvAgentExe+"="+self)
	if err := syscall.Exec(path, append([]string{path}, os.Args[1:]...), env); err != nil {
		return fmt.Errorf("run the onboarding form %s: %w", path, err)
	}
	return nil
}
