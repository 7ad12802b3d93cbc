// Command tether-edge-onboard is the interactive onboarding form of the
// agent: `tether-edge onboard` runs it (the same command line) when it asks
// its questions on a terminal. It is a separate executable so that the
// long-running agent, which never shows the form, does not carry the
// form's terminal UI; the package installs it beside tether-edge. Run
// directly, it is `tether-edge onboard` with the form built in.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/tether-dev/tether/cmd/internal/edgecli"
	"github.com/tether-dev/tether/cmd/internal/onboardcmd"
	"github.com/tether-dev/tether/edge"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	// Named as the agent: its help, errors and usage lines are those of
	// `tether-edge onboard`.
	root := edgecli.New(
		"tether-edge", "The interactive onboarding form of the Tether edge agent (run by `tether-edge onboard`)",
	)
	root.Version = edge.Version
	var logLevel string
	root.Persistent.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.Add(onboardcmd.New(onboardcmd.Form))
	if err := root.Execute(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "tether-edge:", err)
		os.Exit(1)
	}
}
