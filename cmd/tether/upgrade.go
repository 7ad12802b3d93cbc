package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

func newUpgradeCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "upgrade",
		Short: "Over-the-air upgrades of the agent and of node software: create, list, show, pause, resume, cancel, confirm",
		Long: `Roll an artifact out to nodes: the tether-edge agent itself (a multi-arch OCI
artifact pushed with 'tether artifact push agent') or a bundle of an install
script and files ('tether artifact push bundle').

The hub resolves the reference to a digest once, at creation, and nodes get
exactly that: the hub fetches the blobs once (verified), pushes them through
the tunnels, and each node checks every file against the pinned digests before
anything runs. Each node goes pending -> [awaiting_confirmation ->] downloading
-> verifying -> installing -> health_check -> succeeded, or failed / rolled_back
with a reason; skipped (already at the target) and cancelled (not reached) are
the hub's. A new agent that does not reconnect within --health-timeout is
switched back to the previous version by the node itself.`,
	}
	cmd.AddCommand(newUpgradeCreateCmd(), newUpgradeListCmd(), newUpgradeShowCmd(),
		newUpgradeActionCmd("pause", "Stop starting nodes (drives under way finish)"),
		newUpgradeActionCmd("resume", "Continue a paused rollout"),
		newUpgradeActionCmd("cancel", "End a rollout: nodes not reached, or waiting for a confirmation, are cancelled"),
		newUpgradeConfirmCmd())
	return cmd
}

func newUpgradeCreateCmd() *cobra.Command {
	var cf clientFlags
	var req apitype.UpgradeCreateRequest
	var deadline, output string
	var health, timeout time.Duration
	var wait bool
	cmd := &cobra.Command{
		Use:   "create NAME --artifact oci://HOST/REPO:TAG (-l SELECTOR | --nodes a,b)",
		Short: "Pin an artifact by digest and roll it out to nodes in batches",
		Long: `Create an upgrade: the artifact reference is resolved to its digest now, once
(a reference by digest is used as given), and the rollout starts.

Batches: --batch N or P% of the targets at a time, after an optional --canary
batch of N nodes that every later batch waits for. --max-unavailable bounds
the nodes being upgraded at once (default: the batch size). The rollout halts
when more nodes fail than --failure-tolerance (N or P%; default: none may fail);
each failure's reason is in 'tether upgrade show'. Nodes already at the
target version are skipped; going back to an older agent needs
--allow-downgrade. Offline nodes wait, until --deadline (a duration from now,
or an RFC 3339 time) when given. --require-confirmation makes each node wait
in awaiting_confirmation until 'tether upgrade confirm' or 'tether-edge confirm'
on the node. Creating upgrades is for the hub admin.`,
		Example: `  tether upgrade create edge-1.4 --artifact oci://registry.example:5000/tether/edge:v1.4.0 \
      -l site=berlin --batch 10% --max-unavailable 2 --failure-tolerance 5% --require-confirmation
  tether upgrade create os-patch-42 --artifact oci://registry.example:5000/patches/openssl:42 -l os=debian-12 --watch`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output %q: want text or json", output)
			}
			req.Name = args[0]
			if deadline != "" {
				t, err := parseDeadline(deadline, time.Now())
				if err != nil {
					return err
				}
				req.Deadline = t
			}
			req.HealthTimeoutSeconds = int(health / time.Second)
			req.TimeoutSeconds = int(timeout / time.Second)
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			d, err := c.CreateUpgrade(cmd.Context(), req)
			if err != nil {
				return err
			}
			if !wait {
				if output == "json" {
					return printJSON(os.Stdout, d)
				}
				fmt.Fprintf(os.Stderr,
					"upgrade %s: %s %s pinned at %s, %d nodes; follow it with 'tether upgrade show %s --watch'\n",
					d.Name, d.Kind, d.Version, d.Digest, d.Total, d.Name)
				return nil
			}
			return watchUpgrade(cmd.Context(), c, d.Name, output)
		},
	}
	cf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&req.Artifact, "artifact", "",
		"oci://HOST[:PORT]/REPO:TAG or @sha256:DIGEST of the agent or bundle (required)")
	f.StringVarP(&req.Selector, "selector", "l", "", "target the nodes matching this label selector (\"*\" for all)")
	f.StringSliceVar(&req.Nodes, "nodes", nil, "target these nodes by name")
	f.StringVar(&req.Batch, "batch", "",
		"nodes per batch: a count (10) or a percentage of the targets (10%); default all at once")
	f.IntVar(&req.Canary, "canary", 0, "a first batch of N nodes that every other batch waits for")
	f.IntVar(&req.MaxUnavailable, "max-unavailable", 0, "at most N nodes being upgraded at once (default: the batch size)")
	f.StringVar(&req.FailureTolerance, "failure-tolerance", "",
		"halt when more than N (or P%) of the targets failed (default: at the first failure)")
	f.BoolVar(&req.RequireConfirmation, "require-confirmation", false,
		"each node waits for a person: 'tether upgrade confirm' or 'tether-edge confirm' on the node")
	f.BoolVar(&req.AllowDowngrade, "allow-downgrade", false, "allow going back to an older agent version")
	f.StringVar(&deadline, "deadline", "",
		"offline nodes wait until then and fail after: a duration (24h) or a time (2026-12-01T06:00:00Z)")
	f.DurationVar(&health, "health-timeout", upgradeproto.DefaultHealthTimeout,
		"a new agent must reconnect within this, or the node switches back by itself")
	f.DurationVar(&timeout, "timeout", 30*time.Minute, "bound on one node's offer, file push and install")
	f.BoolVar(&wait, "watch", false, "follow the rollout until it ends (a progress bar on a terminal)")
	f.StringVarP(&output, "output", "o", "text", "output format: text or json")
	_ = cmd.MarkFlagRequired("artifact")
	_ = cmd.RegisterFlagCompletionFunc("nodes", completeNodeList(&cf))
	return cmd
}

// parseDeadline reads --deadline: a duration from now or an RFC 3339 time.
func parseDeadline(s string, now time.Time) (time.Time, error) {
	if d, err := time.ParseDuration(s); err == nil {
		if d <= 0 {
			return time.Time{}, fmt.Errorf("--deadline %q: want a positive duration", s)
		}
		return now.Add(d).UTC(), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("--deadline %q: want a duration (24h) or an RFC 3339 time (2026-12-01T06:00:00Z)", s)
	}
	return t.UTC(), nil
}

func newUpgradeListCmd() *cobra.Command {
	return listCommand(&cobra.Command{Use: "list", Short: "List upgrades (newest first) with their nodes by step"},
		(*apiclient.Client).ListUpgrades, "NAME\tKIND\tVERSION\tSTATE\tNODES\tDONE\tFAILED\tWAITING\tDIGEST",
		func(u apitype.Upgrade) string {
			done := u.Counts[apitype.StepSucceeded] + u.Counts[apitype.StepSkipped]
			failed := u.Counts[apitype.StepFailed] + u.Counts[apitype.StepRolledBack]
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s", u.Name, u.Kind, u.Version, u.State, u.Total, done, failed,
				u.Counts[apitype.StepAwaitingConfirmation], shortDigest(u.Digest))
		})
}

func shortDigest(d string) string {
	if len(d) > 19 {
		return d[:19] + "…"
	}
	return d
}

func newUpgradeShowCmd() *cobra.Command {
	var cf clientFlags
	var output string
	var watch bool
	cmd := &cobra.Command{
		Use:   "show NAME [-o json] [--watch]",
		Short: "Show an upgrade and each node's step, reason and history",
		Long: `Show an upgrade: the pinned digest, the rollout's state and reason, and each
node's step with its reason and who confirmed it. -o json adds each node's
history: every step with its time and reason. --watch follows the rollout until
it ends (a progress bar on a terminal); Ctrl-C stops watching, not the rollout.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" && output != "text" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			if watch {
				return watchUpgrade(cmd.Context(), c, args[0], output)
			}
			d, err := c.GetUpgrade(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if output == "json" {
				return printJSON(os.Stdout, d)
			}
			return printUpgrade(os.Stdout, d)
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().BoolVar(&watch, "watch", false, "follow the rollout until it ends")
	return cmd
}

func printUpgrade(w io.Writer, d apitype.UpgradeDetail) error {
	fmt.Fprintf(w, "upgrade %s: %s %s, %s\n", d.Name, d.Kind, d.Version, d.State)
	fmt.Fprintf(w, "  artifact %s pinned at %s\n", d.Reference, d.Digest)
	fmt.Fprintf(w, "  created %s by %s", d.CreatedAt.Local().Format(time.DateTime), d.CreatedBy)
	if d.Spec.Batch != "" {
		fmt.Fprintf(w, ", batch %s", d.Spec.Batch)
	}
	if d.Spec.Canary > 0 {
		fmt.Fprintf(w, ", canary %d", d.Spec.Canary)
	}
	if d.Spec.MaxUnavailable > 0 {
		fmt.Fprintf(w, ", max-unavailable %d", d.Spec.MaxUnavailable)
	}
	if d.Spec.FailureTolerance != "" {
		fmt.Fprintf(w, ", failure-tolerance %s", d.Spec.FailureTolerance)
	}
	if d.Spec.RequireConfirmation {
		fmt.Fprint(w, ", confirmation required")
	}
	fmt.Fprintln(w)
	if d.Reason != "" {
		fmt.Fprintf(w, "  %s\n", d.Reason)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tBATCH\tSTEP\tSINCE\tFROM\tCONFIRMED BY\tJOB\tREASON")
	for _, n := range d.Nodes {
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\n", n.Node, n.Batch, n.Step,
			n.UpdatedAt.Local().Format(time.TimeOnly), dash(n.FromVersion), dash(n.ConfirmedBy), dash(n.JobID), n.Reason)
	}
	return tw.Flush()
}

func dash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// watchUpgrade follows a rollout until it ends: a progress bar on a
// terminal, a line per change otherwise, the final table (or JSON). The
// exit status says whether every node ended well.
func watchUpgrade(ctx context.Context, c *apiclient.Client, name, output string) error {
	tty := output != "json" && term.IsTerminal(int(os.Stderr.Fd()))
	last := ""
	var d apitype.UpgradeDetail
	var err error
	for {
		d, err = c.GetUpgrade(ctx, name)
		if err != nil {
			if ctx.Err() != nil {
				fmt.Fprintf(os.Stderr, "\nstopped watching; the rollout goes on (tether upgrade show %s)\n", name)
				return nil
			}
			return err
		}
		line := progressLine(d.Upgrade, tty)
		if tty {
			fmt.Fprint(os.Stderr, "\r\033[K"+line)
		} else if line != last && output != "json" {
			fmt.Fprintln(os.Stderr, line)
		}
		last = line
		if d.State == apitype.UpgradeDone || d.State == apitype.UpgradeHalted || d.State == apitype.UpgradeCancelled {
			break
		}
		select {
		case <-ctx.Done():
			fmt.Fprintf(os.Stderr, "\nstopped watching; the rollout goes on (tether upgrade show %s)\n", name)
			return nil
		case <-time.After(time.Second):
		}
	}
	if tty {
		fmt.Fprintln(os.Stderr)
	}
	if output == "json" {
		err = printJSON(os.Stdout, d)
	} else {
		err = printUpgrade(os.Stdout, d)
	}
	if err != nil {
		return err
	}
	if bad := d.Counts[apitype.StepFailed] + d.Counts[apitype.StepRolledBack]; bad > 0 || d.State != apitype.UpgradeDone {
		return codedError{exitFailed, fmt.Sprintf("upgrade %s %s: %d nodes failed or rolled back", name, d.State, bad)}
	}
	return nil
}

// progressLine is the rollout's progress: a bar of the nodes that ended,
// then the counts by step.
func progressLine(u apitype.Upgrade, bar bool) string {
	ended := 0
	var parts []string
	for _, s := range []apitype.UpgradeStep{
		apitype.StepSucceeded, apitype.StepSkipped, apitype.StepFailed, apitype.StepRolledBack, apitype.StepCancelled,
		apitype.StepAwaitingConfirmation, apitype.StepDownloading, apitype.StepVerifying, apitype.StepInstalling,
		apitype.StepHealthCheck, apitype.StepPending,
	} {
		n := u.Counts[s]
		if n == 0 {
			continue
		}
		if s.Terminal() {
			ended += n
		}
		parts = append(parts, fmt.Sprintf("%d %s", n, s))
	}
	out := fmt.Sprintf("%s %s %d/%d: %s", u.Name, u.State, ended, u.Total, strings.Join(parts, ", "))
	if bar && u.Total > 0 {
		const width = 30
		k := ended * width / u.Total
		out = "[" + strings.Repeat("#", k) + strings.Repeat(".", width-k) + "] " + out
	}
	return out
}

func newUpgradeActionCmd(verb, short string) *cobra.Command {
	return argCommand(&cobra.Command{
		Use: verb + " NAME", Short: short,
	}, func(c *apiclient.Client, ctx context.Context, name string) error {
		u, err := c.UpgradeAction(ctx, name, verb)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "upgrade %s: %s\n", u.Name, u.State)
		return nil
	})
}

func newUpgradeConfirmCmd() *cobra.Command {
	var cf clientFlags
	var node string
	cmd := &cobra.Command{
		Use:   "confirm NAME --node NODE",
		Short: "Confirm an upgrade waiting for a person on a node (role permission confirm)",
		Long: `Say yes to an upgrade that waits in awaiting_confirmation on NODE (created with
--require-confirmation); the node then installs it. The admin may confirm
anywhere; an operator or API token needs a role that selects the node and
carries the confirm permission ('tether role create ... --confirm'). Who
confirmed is recorded on the node and in the audit log. On the node itself,
'tether-edge confirm' does the same as root.`,
		Example: `  tether upgrade confirm edge-1.4 --node berlin-7`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			n, err := c.ConfirmUpgrade(cmd.Context(), args[0], node)
			var ae *apitype.Error
			if errors.As(err, &ae) && ae.Status == 409 {
				return fmt.Errorf("%w (see 'tether upgrade show %s')", err, args[0])
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "upgrade %s on %s: confirmed by %s\n", args[0], n.Node, n.ConfirmedBy)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&node, "node", "", "the node whose upgrade to confirm (required)")
	_ = cmd.MarkFlagRequired("node")
	_ = cmd.RegisterFlagCompletionFunc("node", completeNodeFlag(&cf))
	return cmd
}
