package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tether-dev/tether/cmd/internal/edgecli"
	"github.com/tether-dev/tether/edge/upgrade"
)

func newConfirmCmd() *edgecli.Command {
	var stateDir string
	var list bool
	cmd := &edgecli.Command{
		Use:   "confirm [NAME]",
		Short: "Confirm an upgrade waiting on this node (as root)",
		Long: `Upgrades created with --require-confirmation wait on the node in
awaiting_confirmation, across agent and hub restarts, until someone with
the right says yes: an operator on the hub (tether upgrade confirm), or root
on the node with this command.

It talks to the running agent over its unix socket (STATE_DIR/upgrade.sock,
mode 0600; the agent also checks the caller is uid 0), which records
"root@HOSTNAME (on the node)" as who confirmed and reports it to the hub.

  tether-edge confirm --list     what waits: name, from -> to version, digest
  tether-edge confirm NAME       confirm that upgrade
  tether-edge confirm            confirm the one waiting upgrade (an error if several wait)`,
		Args: edgecli.MaximumArgs(1),
		Run: func(ctx context.Context, cmd *edgecli.Command, args []string) error {
			ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
			defer cancel()
			waiting, err := upgrade.Ask(ctx, stateDir, upgrade.SocketRequest{Op: "list"})
			if err != nil {
				return err
			}
			if list {
				printWaiting(os.Stdout, waiting)
				return nil
			}
			name := ""
			switch {
			case len(args) == 1:
				name = args[0]
			case len(waiting) == 0:
				fmt.Println("no upgrade awaits confirmation on this node")
				return nil
			case len(waiting) == 1:
				name = waiting[0].Name
			default:
				printWaiting(os.Stderr, waiting)
				return fmt.Errorf("%d upgrades await confirmation: name the one to confirm (tether-edge confirm NAME)",
					len(waiting))
			}
			done, err := upgrade.Ask(ctx, stateDir, upgrade.SocketRequest{Op: "confirm", Name: name})
			if err != nil {
				return err
			}
			for _, s := range done {
				fmt.Printf("confirmed %s (%s -> %s, %s) as %s\n", s.Name, orDash(s.FromVersion), s.ToVersion, s.Digest,
					s.ConfirmedBy)
			}
			return nil
		},
	}
	cmd.Flags.StringVar(&stateDir, "state-dir", defaultStateDir(), "the agent's state directory (env TETHER_STATE_DIR)")
	cmd.Flags.BoolVar(&list, "list", false, "list the upgrades awaiting confirmation and confirm nothing")
	return cmd
}

func printWaiting(w io.Writer, l []upgrade.State) {
	if len(l) == 0 {
		fmt.Fprintln(w, "no upgrade awaits confirmation on this node")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tVERSION\tDIGEST\tWAITING SINCE")
	for _, s := range l {
		fmt.Fprintf(tw, "%s\t%s\t%s -> %s\t%s\t%s\n", s.Name, s.Kind, orDash(s.FromVersion), s.ToVersion, s.Digest,
			s.UpdatedAt.Format(time.RFC3339))
	}
	tw.Flush()
}

func orDash(s string) string {
	if strings.TrimSpace(s) == "" {
		return "-"
	}
	return s
}
