// Command tether is the Tether hub (`tether hub`) and the admin/operator CLI.
// This package only parses flags and wires packages together.
package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRoot()
	if err := root.ExecuteContext(ctx); err != nil {
		msg := err.Error()
		if ce := (codedError{}); errors.As(err, &ce) {
			msg = ce.msg
		}
		if msg != "" {
			fmt.Fprintln(os.Stderr, "tether:", msg)
		}
		os.Exit(exitCode(err))
	}
}

// exitCode is the exit status for an error a command returned: a
// codedError's or exitError's own code, else 1.
func exitCode(err error) int {
	var ce codedError
	if errors.As(err, &ce) {
		return ce.code
	}
	var ee exitError
	if errors.As(err, &ee) {
		return int(ee)
	}
	return 1
}

type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// codedError ends the program with code after printing msg (if any).
type codedError struct {
	code int
	msg  string
}

func (e codedError) Error() string { return e.msg }

// exitUsage is the exit status of a command-line mistake: an unknown command
// or flag, a missing or extra argument, a required flag left out, a flag value
// that does not parse or is out of range. Scripts tell it from 1, a command
// that ran and failed.
const exitUsage = 2

// usageErrorf is a command-line mistake (exitUsage), its message saying what
// was wrong.
func usageErrorf(format string, a ...any) error {
	return codedError{exitUsage, fmt.Sprintf(format, a...)}
}

// usageError turns an error cobra or pflag found in c's command line into a
// usage error that points at c's help.
func usageError(c *cobra.Command, err error) error {
	return usageErrorf("%v (see %s --help)", err, c.CommandPath())
}

// markUsageErrors makes every command-line mistake cobra finds exit with
// exitUsage. Cobra's own errors are plain, so each place it reports one is
// wrapped: flag parsing (FlagErrorFunc), argument checks (every command's
// Args), required and grouped flags (checked here before cobra does, in the
// root's PersistentPreRunE), and unknown subcommands of a command that only
// groups others, which cobra would answer with its help and status 0.
func markUsageErrors(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	root.SetFlagErrorFunc(usageError)
	root.PersistentPreRunE = func(c *cobra.Command, _ []string) error {
		if err := c.ValidateRequiredFlags(); err != nil {
			return usageError(c, err)
		}
		if err := c.ValidateFlagGroups(); err != nil {
			return usageError(c, err)
		}
		return nil
	}
	var walk func(c *cobra.Command)
	walk = func(c *cobra.Command) {
		switch check := c.Args; {
		case c.HasSubCommands() && !c.Runnable():
			c.Args = cobra.ArbitraryArgs
			c.RunE = func(c *cobra.Command, args []string) error {
				if len(args) == 0 {
					return c.Help()
				}
				msg := fmt.Sprintf("unknown command %q for %q", args[0], c.CommandPath())
				if s := c.SuggestionsFor(args[0]); len(s) > 0 {
					msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, " or "))
				}
				return usageError(c, errors.New(msg))
			}
		case check != nil:
			c.Args = func(c *cobra.Command, args []string) error {
				if err := check(c, args); err != nil {
					return usageError(c, err)
				}
				return nil
			}
		}
		for _, sub := range c.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

var logLevel string

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "tether",
		Short: "Tether: reverse-tunnel hub and SSH bastion for fleets of edge machines",
		Long: `Tether keeps one outbound tunnel (QUIC, or TLS+TCP where UDP is blocked) from
every edge node to the hub, and lets operators reach any node with plain OpenSSH,
the hub and the node verified by certificate (no host-key prompt):

  tether login --hub HUB:7443 --ca-pin sha256:PIN --user alice   (PIN: 'tether ca pin' on the hub)
  ssh -F ~/.tether/ssh_config root@NODE.tether

Run the hub with 'tether hub'. The other commands administer it; on the hub's
machine they need only --data-dir (or TETHER_DATA_DIR; default /var/lib/tether),
elsewhere a 'tether login' as an operator with the admin role (they then use the
hub logged in to, or --hub ADDR). Run right after 'tether hub &', they wait for
the hub to start (--wait).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       hub.Version,
	}
	root.SetVersionTemplate("tether {{.Version}}\n") // as the version command prints it
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.AddCommand(newHubCmd(), newTokenCmd(), newOperatorCmd(), newNodesCmd(), newRoleCmd(), newAuditCmd(),
		newConfigCmd(), newLoginCmd(), newCACmd(),
		newRunCmd(), newJobsCmd(), newClusterCmd(), newKubeOneCmd(), newAPITokenCmd(), newVersionCmd(), newInventoryCmd(),
		newOnboardingCmd(), newOSProfileCmd(), newOnboardCmd(), newUpgradeCmd(), newMissionCmd())
	root.AddCommand(newArtifactCmd())
	root.AddCommand(newReplicasCmd())
	root.AddCommand(newServiceCmd())
	root.AddCommand(newSiteCmd(), newSitesCmd())
	root.AddCommand(newUICmd())
	markUsageErrors(root)
	return root
}

func newLogger() (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})), nil
}
