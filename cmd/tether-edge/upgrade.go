package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"text/tabwriter"
	"time"

	"github.com/tether-dev/tether/cmd/internal/edgecli"
	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/edge/upgrade"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// exitUpgradeEnded is the exit status of an upgrade verb whose record
// ended failed or rolled_back (the record is still printed on stdout).
const exitUpgradeEnded = 3

// statusError carries an exit status other than 1.
type statusError struct {
	code int
	msg  string
}

func (e *statusError) Error() string { return e.msg }

// envLauncher names the launcher in the environment of the installed
// version it execs: the agent announces it as the executable the hub
// runs for upgrades, and the installed version does not launch again.
const envLauncher = "TETHER_EDGE_LAUNCHER"

// upgradeNode is the node-side updater on stateDir, run from this
// executable (the launcher, when the hub calls the verbs).
func upgradeNode(stateDir string) (*upgrade.Node, error) {
	log, err := newLogger()
	if err != nil {
		return nil, err
	}
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	if l := os.Getenv(envLauncher); filepath.IsAbs(l) {
		exe = l
	}
	dir, err := filepath.Abs(stateDir)
	if err != nil {
		return nil, err
	}
	return &upgrade.Node{Dir: dir, Version: edge.Version, Exe: exe, Log: log, Stderr: os.Stderr}, nil
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// printState prints the record; one that ended failed or rolled_back
// exits exitUpgradeEnded.
func printState(s *upgrade.State, err error) error {
	if s != nil {
		if perr := printJSON(os.Stdout, s); perr != nil {
			return perr
		}
	}
	if err != nil {
		return err
	}
	if s.Step == upgradeproto.StepFailed || s.Step == upgradeproto.StepRolledBack {
		return &statusError{code: exitUpgradeEnded, msg: fmt.Sprintf("upgrade %s %s: %s", s.Name, s.Step, s.Reason)}
	}
	return nil
}

func newUpgradeCmd() *edgecli.Command {
	var stateDir string
	cmd := &edgecli.Command{
		Use:   "upgrade",
		Short: "The node side of over-the-air upgrades (called by the hub over SSH)",
		Long: `The node side of over-the-air upgrades. The hub's rollout controller calls
these commands over SSH, as the agent's user, with the executable the agent
announced (the launcher); they are also safe to run by hand to look.

  offer   --state-dir DIR         record an upgrade (offer JSON on stdin)
  apply   --state-dir DIR NAME    confirm (--confirmed-by), verify, install
  status  --state-dir DIR [NAME]  the records as JSON (-o text: a table)
  cancel  --state-dir DIR NAME    end an upgrade that has not begun installing
  watch   --state-dir DIR NAME    the updater of an agent upgrade (started by apply)

Each prints the record(s) as JSON on stdout (status -o text: a table). Exit status: 0 when the
record moved on (or is as far as it can be now), 3 when it ended failed or
rolled_back (the reason is in the record), 1 when the command was refused
or could not run (nothing changed).

Nothing unverified runs: apply checks that the offer's documents hash to the
pinned digest and that every file received in
DIR/upgrades/NAME/incoming/<hex digest> hashes to its manifest digest before
anything runs or is switched in; a mismatch ends the upgrade
"failed: digest mismatch (want sha256:…, got sha256:…)" and removes every
file of it.

Agent upgrades: versions are installed side by side under
DIR/agent/versions/<version>/tether-edge; DIR/agent/current and
DIR/agent/previous (the last good version) are symlinks switched atomically.
The updater runs outside the agent (a transient systemd unit, or its own
session), restarts the agent through its service manager (the systemd unit,
or the supervisor of ` + "`tether-edge run --supervise`" + `) and waits for the new
version to be welcomed by the hub within the offer's health timeout
(default 60s). Otherwise, or when the new version exits 3 times in a row,
the node goes back to the previous version by itself: rolled_back(reason).
An offer of the version already running ends skipped ("already at V");
one of an older version fails unless the offer allows downgrades.

Bundles: install.sh, then health.sh if present, run with /bin/sh in the
bundle's directory (output on stderr, each bounded by --script-timeout,
health.sh by the health timeout); a failing health.sh runs rollback.sh if
the bundle has one (rolled_back), else the upgrade fails.`,
	}
	cmd.Persistent.StringVar(&stateDir, "state-dir", defaultStateDir(),
		"the agent's state directory (env TETHER_STATE_DIR)")

	offer := &edgecli.Command{
		Use:   "offer",
		Short: "Record an upgrade offered by the hub (UpgradeOffer JSON on stdin)",
		Args:  edgecli.NoArgs,
		Run: func(ctx context.Context, cmd *edgecli.Command, _ []string) error {
			n, err := upgradeNode(stateDir)
			if err != nil {
				return err
			}
			var o upgradeproto.Offer
			dec := json.NewDecoder(io.LimitReader(os.Stdin, 4*upgradeproto.MaxArtifactManifest))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&o); err != nil {
				return fmt.Errorf("upgrade offer on stdin: %w", err)
			}
			return printState(n.Offer(o))
		},
	}
	var confirmedBy string
	var scriptTimeout = upgrade.DefaultScriptTimeout
	apply := &edgecli.Command{
		Use:   "apply NAME",
		Short: "Move an upgrade on: confirmation, verification, install (a bundle's scripts; an agent's updater)",
		Args:  edgecli.ExactArgs(1),
		Run: func(ctx context.Context, cmd *edgecli.Command, args []string) error {
			n, err := upgradeNode(stateDir)
			if err != nil {
				return err
			}
			n.ScriptTimeout = scriptTimeout
			return printState(n.Apply(ctx, args[0], confirmedBy))
		},
	}
	apply.Flags.StringVar(&confirmedBy, "confirmed-by", "",
		"who confirmed the upgrade on the hub (required while it awaits confirmation)")
	apply.Flags.DurationVar(&scriptTimeout, "script-timeout", scriptTimeout,
		"bound of each bundle script (health.sh: the offer's health timeout)")
	var output string
	status := &edgecli.Command{
		Use:   "status [NAME]",
		Short: "Print the upgrade records (a JSON array, or a table with -o text)",
		Args:  edgecli.MaximumArgs(1),
		Run: func(ctx context.Context, cmd *edgecli.Command, args []string) error {
			if output != "json" && output != "text" {
				return fmt.Errorf("--output %q: want json or text", output)
			}
			n, err := upgradeNode(stateDir)
			if err != nil {
				return err
			}
			name := ""
			if len(args) == 1 {
				name = args[0]
			}
			l, err := n.Status(name)
			if err != nil {
				return err
			}
			if output == "text" {
				printUpgrades(os.Stdout, l)
				return nil
			}
			return printJSON(os.Stdout, l)
		},
	}
	// JSON stays the default: it is what the hub reads over SSH, from agents
	// old and new, and it calls without -o.
	status.Flags.StringVar(&output, "output", "json", "output format: json or text")
	status.Alias("o", "output")
	cancel := &edgecli.Command{
		Use:   "cancel NAME",
		Short: "End an upgrade that has not begun installing and remove its files",
		Args:  edgecli.ExactArgs(1),
		Run: func(ctx context.Context, cmd *edgecli.Command, args []string) error {
			n, err := upgradeNode(stateDir)
			if err != nil {
				return err
			}
			s, err := n.Cancel(args[0])
			if err != nil {
				return err
			}
			return printState(s, nil)
		},
	}
	watch := &edgecli.Command{
		Use:   "watch NAME",
		Short: "The updater of an agent upgrade: switch, restart, wait for health, roll back (started by apply)",
		Args:  edgecli.ExactArgs(1),
		Run: func(ctx context.Context, cmd *edgecli.Command, args []string) error {
			n, err := upgradeNode(stateDir)
			if err != nil {
				return err
			}
			return n.Watch(ctx, args[0])
		},
	}
	cmd.Add(offer, apply, status, cancel, watch)
	return cmd
}

// printUpgrades is the text form of `upgrade status`: one row per record,
// the reason of a step that has one last.
func printUpgrades(w io.Writer, l []upgrade.State) {
	if len(l) == 0 {
		fmt.Fprintln(w, "no upgrade records on this node")
		return
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tKIND\tVERSION\tSTEP\tUPDATED\tREASON")
	for _, s := range l {
		fmt.Fprintf(tw, "%s\t%s\t%s -> %s\t%s\t%s\t%s\n", s.Name, s.Kind, orDash(s.FromVersion), s.ToVersion, s.Step,
			s.UpdatedAt.Local().Format(time.RFC3339), orDash(s.Reason))
	}
	tw.Flush()
}
