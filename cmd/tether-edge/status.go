package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"

	"github.com/tether-dev/tether/cmd/internal/edgecli"
	"github.com/tether-dev/tether/edge"
)

func newStatusCmd() *edgecli.Command {
	var stateDir, output string
	cmd := &edgecli.Command{
		Use:   "status",
		Short: "Show this node's identity and connection state",
		Args:  edgecli.NoArgs,
		Run: func(ctx context.Context, cmd *edgecli.Command, _ []string) error {
			id, err := edge.LoadIdentity(stateDir)
			if err != nil {
				return err
			}
			st, err := edge.ReadStatus(stateDir)
			if errors.Is(err, os.ErrNotExist) {
				st = edge.Status{State: stateNeverRan}
			} else if err != nil {
				return fmt.Errorf("read status: %w", err)
			}
			// The identity files are the truth about who this node is and
			// how long its certificate lasts.
			st.Name, st.NodeID, st.CertExpires = id.Config.Name, id.Config.NodeID, id.Cert.Leaf.NotAfter
			gone := agentGone(st)
			switch output {
			case "json":
				if gone {
					st.State = stateExited
				}
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			case "text":
			default:
				return fmt.Errorf("--output %q: want text or json", output)
			}
			printStatus(os.Stdout, st, id.Config.Hubs, gone, time.Now())
			return nil
		},
	}
	cmd.Flags.StringVar(&stateDir, "state-dir", defaultStateDir(), "node identity directory (env TETHER_STATE_DIR)")
	cmd.Flags.StringVar(&output, "output", "text", "output format: text or json")
	cmd.Alias("o", "output")
	return cmd
}

// States `tether-edge status` shows besides the agent's own (see
// edge.Status): no agent has written a status in this state dir yet, or the
// agent that wrote it is gone without saying it stopped (killed, crashed).
const (
	stateNeverRan = "not running"
	stateExited   = "not running (agent exited)"
)

// stateHubSilent is the agent's state while its hub answers neither its
// keepalive nor the probes after it: the session is up on the agent's
// side only as far as it knows.
const stateHubSilent = "hub-silent"

// agentGone reports whether st is the status of a running agent whose
// process is gone (killed, crashed) without saying that it stopped.
func agentGone(st edge.Status) bool {
	// ESRCH only: EPERM means the process runs, as another user.
	return st.PID != 0 && (st.State == "connected" || st.State == stateHubSilent || st.State == "connecting") &&
		errors.Is(syscall.Kill(st.PID, 0), syscall.ESRCH)
}

// printStatus writes the text form of `tether-edge status`; gone is
// agentGone(st). A time that is not known (no agent has run here yet) is
// left out rather than shown as the zero time.
func printStatus(w io.Writer, st edge.Status, hubs []string, gone bool, now time.Time) {
	fmt.Fprintf(w, "node:         %s (id %s)\n", st.Name, st.NodeID)
	fmt.Fprintf(w, "hubs:         %s\n", strings.Join(hubs, ", "))
	switch {
	case st.State == stateNeverRan && st.PID == 0:
		fmt.Fprintf(w, "state:        %s (no agent has run with this state dir yet: start `tether-edge run`)\n", st.State)
	case gone:
		fmt.Fprintf(w, "state:        not running (agent pid %d exited; it was %s %s)\n", st.PID, st.State,
			whenText(st.Since, now))
	case st.State == stateHubSilent:
		fmt.Fprintf(w, "state:        %s %s (no answer from the hub to the keepalive and the probes since; "+
			"the agent reconnects if it stays silent)\n", st.State, whenText(st.Since, now))
	default:
		fmt.Fprintf(w, "state:        %s %s\n", st.State, whenText(st.Since, now))
	}
	if st.Transport != "" && !gone {
		if st.State == stateHubSilent {
			fmt.Fprintf(w, "session:      %s over %s, not answering\n", st.Hub, st.Transport)
		} else if st.TransportWhy != "" {
			fmt.Fprintf(w, "connected to: %s over %s (%s)\n", st.Hub, st.Transport, st.TransportWhy)
		} else {
			fmt.Fprintf(w, "connected to: %s over %s\n", st.Hub, st.Transport)
		}
	}
	if st.LastError != "" {
		fmt.Fprintf(w, "last error:   %s\n", st.LastError)
	}
	fmt.Fprintf(w, "certificate:  valid until %s\n", st.CertExpires.Local().Format(time.RFC3339))
}

// whenText is "since TIME (AGE ago)", or "since an unknown time" for the
// zero time.
func whenText(t, now time.Time) string {
	if t.IsZero() {
		return "since an unknown time"
	}
	return fmt.Sprintf("since %s (%s ago)", t.Local().Format(time.RFC3339), now.Sub(t).Round(time.Second))
}

func newVersionCmd() *edgecli.Command {
	return &edgecli.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  edgecli.NoArgs,
		Run: func(context.Context, *edgecli.Command, []string) error {
			fmt.Println("tether-edge", edge.Version)
			return nil
		},
	}
}
