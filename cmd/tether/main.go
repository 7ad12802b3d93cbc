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
	"syscall"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	root := newRoot()
	if err := root.ExecuteContext(ctx); err != nil {
		var ce codedError
		if errors.As(err, &ce) {
			if ce.msg != "" {
				fmt.Fprintln(os.Stderr, "tether:", ce.msg)
			}
			os.Exit(ce.code)
		}
		fmt.Fprintln(os.Stderr, "tether:", err)
		var ee exitError
		if errors.As(err, &ee) {
			os.Exit(int(ee))
		}
		os.Exit(1)
	}
}

type exitError int

func (e exitError) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// codedError ends the program with code after printing msg (if any).
type codedError struct {
	code int
	msg  string
}

func (e codedError) Error() string { return e.msg }

var logLevel string

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:   "tether",
		Short: "Tether: reverse-tunnel hub and SSH bastion for fleets of edge machines",
		Long: `Tether keeps one outbound tunnel (QUIC, or TLS+TCP where UDP is blocked) from
every edge node to the hub, and lets operators reach any node with plain OpenSSH:

  ssh -J alice@HUB:2222 root@NODE

Run the hub with 'tether hub'. The other commands administer it; on the hub's
machine they need only --data-dir (or TETHER_DATA_DIR; default /var/lib/tether),
elsewhere --hub ADDR after 'tether login' as an operator with the admin role.
Run right after 'tether hub &', they wait for the hub to start (--wait).`,
		SilenceUsage:  true,
		SilenceErrors: true,
		Version:       hub.Version,
	}
	root.SetVersionTemplate("tether {{.Version}}\n") // as the version command prints it
	root.PersistentFlags().StringVar(&logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.AddCommand(newHubCmd(), newTokenCmd(), newOperatorCmd(), newNodesCmd(), newRoleCmd(), newAuditCmd(), newConfigCmd(), newLoginCmd(), newCACmd(),
		newRunCmd(), newJobsCmd(), newClusterCmd(), newKubeOneCmd(), newAPITokenCmd(), newVersionCmd(), newInventoryCmd(),
		newOnboardingCmd(), newOSProfileCmd(), newOnboardCmd(), newUpgradeCmd(), newMissionCmd())
	root.AddCommand(newArtifactCmd())
	root.AddCommand(newReplicasCmd())
	root.AddCommand(newServiceCmd())
	root.AddCommand(newSiteCmd(), newSitesCmd())
	root.AddCommand(newUICmd())
	return root
}

func newLogger() (*slog.Logger, error) {
	var lvl slog.Level
	if err := lvl.UnmarshalText([]byte(logLevel)); err != nil {
		return nil, fmt.Errorf("--log-level %q: want debug, info, warn or error", logLevel)
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: lvl})), nil
}
