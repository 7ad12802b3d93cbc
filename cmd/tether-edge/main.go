// Command tether-edge is the Tether agent: it joins a hub once, then keeps an
// outbound tunnel to it. This package only parses flags and wires packages.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
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
	if err := newRoot().Execute(ctx, os.Args[1:], os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "tether-edge:", err)
		code := exitStatus(err)
		if errors.Is(err, edgecli.ErrUsage) {
			code = exitUsage
		}
		os.Exit(code)
	}
}

// exitUsage is the exit status of a command-line mistake (an unknown command
// or flag, a flag value that does not parse, a wrong number of arguments), as
// the tether CLI has it: scripts and unit files tell it from a run that failed.
const exitUsage = 2

var logLevel string

func newRoot() *edgecli.Command {
	root := edgecli.New("tether-edge", "Tether edge agent: joins a hub and keeps this machine reachable through it")
	root.Long = `tether-edge dials out to a Tether hub (QUIC, or TLS over TCP where UDP is
blocked) and serves the streams the hub opens: SSH to the local sshd or to an
embedded SSH server, and TCP to ports you allow. No inbound port is opened.

Typical unit file line (joins on first boot only, then just connects):

  tether-edge run --join "$JOIN" --state-dir /var/lib/tether-edge`
	root.Version = edge.Version
	root.Persistent.StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.Add(newJoinCmd(), newRunCmd(), newStatusCmd(), newVersionCmd(), onboardcmd.New(interactiveOnboard),
		newUpgradeCmd(), newConfirmCmd())
	return root
}

func newLogger() (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})), nil
}

func defaultStateDir() string { return edgecli.DefaultStateDir() }
