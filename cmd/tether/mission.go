package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/mission"
)

func newMissionCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use: "mission",
		Short: "Missions: a script placed down the tree of hubs by site and labels, run once per generation, " +
			"with a state check",
		Long: `A mission is a script (its content) plus a placement (sites by name, nodes by
labels) plus an optional state check run periodically on each node. It is
created at one hub and travels down to every site below it; each hub that
the placement takes runs it on its own matching nodes with its own job
engine, once per generation per node, keeps each node's state, and reports
it up: 'tether mission show' at the origin has every site and every node.

A site stores a mission before it acknowledges it, keeps running it and its
state checks while its uplink is down, and never re-runs work because of a
reconnect or a restart: only a changed spec (the next generation) runs again.
A node whose run was live when its hub was killed is marked failed
(interrupted) and not run again for that generation. Missions are for the
hub admin.`,
	}
	cmd.AddCommand(newMissionCreateCmd(), newMissionShowCmd(), newMissionListCmd(), newMissionDeleteCmd())
	return cmd
}

func newMissionCreateCmd() *cobra.Command {
	var cf clientFlags
	var req apitype.MissionCreateRequest
	var script, check, output string
	var interval, timeout time.Duration
	var labels []string
	cmd := &cobra.Command{
		Use: "create NAME --script FILE [--state-check FILE] [--interval 1m] [--sites berlin,munich] " +
			"[--match-labels role=pos]",
		Aliases: []string{"update"},
		Short:   "Create a mission, or its next generation when the spec changed",
		Long: `Create a mission at this hub. Placement: --sites names sites relative to this
hub ("berlin", "sub.berlin"), each with every site below it; without --sites
the mission runs at every site below this hub and on this hub's own nodes.
--match-labels selects nodes by their labels at their own hub; below this hub
a node also carries site=PATH, as 'tether run -l site=…' selects it here.

Every matching node runs the script once per generation. Creating the same
name again with a changed script, state check, interval or placement makes the
next generation, which runs again everywhere it is placed; the same spec again
changes nothing. --state-check runs every --interval on each node that ran the
mission (exit 0: the node is as it should be).`,
		Example: `  tether mission create pos-agent --script deploy.sh --state-check check.sh \
      --sites berlin,munich --match-labels role=pos
  tether mission create motd --script motd.sh --interval 5m`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output %q: want text or json", output)
			}
			req.Name = args[0]
			b, err := os.ReadFile(script)
			if err != nil {
				return fmt.Errorf("--script: %w", err)
			}
			req.Script, req.ScriptName = string(b), filepath.Base(script)
			if check != "" {
				b, err := os.ReadFile(check)
				if err != nil {
					return fmt.Errorf("--state-check: %w", err)
				}
				req.StateCheck = string(b)
			}
			if cmd.Flags().Changed("interval") {
				if interval%time.Second != 0 || interval <= 0 {
					return fmt.Errorf("--interval %s: want whole seconds, at least %s", interval, mission.MinCheckInterval)
				}
				req.CheckIntervalSeconds = int(interval / time.Second)
			}
			if cmd.Flags().Changed("timeout") {
				req.TimeoutSeconds = int(timeout / time.Second)
			}
			if len(labels) > 0 {
				req.MatchLabels = map[string]string{}
				for _, l := range labels {
					k, v, ok := strings.Cut(l, "=")
					if !ok || k == "" {
						return fmt.Errorf("--match-labels %q: want KEY=VALUE[,KEY=VALUE…]", l)
					}
					req.MatchLabels[k] = v
				}
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			d, err := c.CreateMission(cmd.Context(), req)
			if err != nil {
				return err
			}
			if output == "json" {
				return printJSON(os.Stdout, d)
			}
			if d.Created {
				fmt.Fprintf(os.Stderr, "mission %s: generation %d sent down the tree; follow it with 'tether mission show %s'\n",
					d.Name, d.Generation, d.Name)
			} else {
				fmt.Fprintf(os.Stderr, "mission %s: unchanged (generation %d); nothing runs again\n", d.Name, d.Generation)
			}
			return nil
		},
	}
	cf.register(cmd)
	f := cmd.Flags()
	f.StringVar(&script, "script", "", "the script every matching node runs once per generation (required)")
	f.StringVar(&check, "state-check", "", "a script run periodically on each node that ran the mission; exit 0 means ok")
	f.DurationVar(&interval, "interval", mission.DefaultCheckInterval, "how often the state check runs")
	f.DurationVar(&timeout, "timeout", mission.DefaultTimeout, "bound on one node's run")
	f.StringSliceVar(&req.Sites, "sites", nil,
		"run at these sites (paths relative to this hub, each with its sub-sites); default: everywhere")
	f.StringSliceVar(&labels, "match-labels", nil, "run on nodes with these labels (KEY=VALUE,…)")
	f.StringVarP(&output, "output", "o", "text", "output format: text or json")
	_ = cmd.MarkFlagRequired("script")
	return cmd
}

func newMissionShowCmd() *cobra.Command {
	var cf clientFlags
	var output, origin string
	cmd := &cobra.Command{
		Use:   "show NAME [-o json]",
		Short: "Show a mission's state per site and per node, aggregated up the tree",
		Long: `Show a mission: its generation and placement, one line per site below this hub
(connected or stale with how long, the generation it holds and has placed,
its own nodes by phase and state check) and one line per node (named from
this hub: n1.berlin) with its generation, phase (pending, running, applied,
failed), last state check and error. A stale site's lines are the last it
reported.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			d, err := c.GetMission(cmd.Context(), args[0], origin)
			if err != nil {
				return err
			}
			if output == "json" {
				return printJSON(os.Stdout, d)
			}
			return printMission(os.Stdout, d, time.Now())
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().StringVar(&origin, "origin", "",
		"hub ID of the mission's origin, when missions from different hubs share the name")
	return cmd
}

func placementText(p apitype.MissionPlacement) string {
	var parts []string
	if len(p.Sites) > 0 {
		parts = append(parts, "sites "+strings.Join(p.Sites, ","))
	} else {
		parts = append(parts, "every site and this hub's nodes")
	}
	if len(p.MatchLabels) > 0 {
		keys := make([]string, 0, len(p.MatchLabels))
		for k := range p.MatchLabels {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		var l []string
		for _, k := range keys {
			l = append(l, k+"="+p.MatchLabels[k])
		}
		parts = append(parts, "labels "+strings.Join(l, ","))
	}
	return strings.Join(parts, ", ")
}

func countsText(c apitype.MissionCounts) string {
	s := fmt.Sprintf("%d applied, %d failed, %d running, %d pending", c.Applied, c.Failed, c.Running, c.Pending)
	if c.CheckOK+c.CheckFailed > 0 {
		s += fmt.Sprintf("; check %d ok, %d failed", c.CheckOK, c.CheckFailed)
	}
	return s
}

func printMission(w io.Writer, d apitype.MissionDetail, now time.Time) error {
	from := "created here"
	if !d.Local {
		from = "from hub " + shortID(d.Origin)
	}
	fmt.Fprintf(w, "mission %s: generation %d (%s), %s\n", d.Name, d.Generation, from, placementText(d.Spec.Placement))
	check := "no state check"
	if d.Spec.StateCheck != "" {
		check = "state check every " + mission.Spec{
			CheckIntervalSeconds: d.Spec.CheckIntervalSeconds,
		}.CheckInterval().String()
	}
	fmt.Fprintf(w, "  %s, %s; %d nodes: %s\n", dash(d.Spec.ScriptName), check, d.Total.Nodes, countsText(d.Total))
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "SITE\tSTATE\tGEN\tOBSERVED\tPLACED\tNODES\tAPPLIED\tFAILED\tPENDING\tCHECK OK")
	own := d.State.Own
	fmt.Fprintf(tw, "(this hub)\t-\t%d\t%d\t%v\t%d\t%d\t%d\t%d\t%d\n", d.Generation, d.State.ObservedGeneration,
		d.State.Placed, own.Nodes, own.Applied, own.Failed, own.Pending+own.Running, own.CheckOK)
	for _, s := range d.Sites {
		state := "connected"
		switch {
		case s.Stale:
			state = "stale, silent " + ago(s.StaleFor)
		case !s.Connected:
			state = "disconnected"
		}
		if !s.Reported {
			fmt.Fprintf(tw, "%s\t%s\t-\t-\t-\t-\t-\t-\t-\t-\n", s.Path, state)
			continue
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%d\t%v\t%d\t%d\t%d\t%d\t%d\n", s.Path, state, s.Generation, s.ObservedGeneration,
			s.Placed, s.Own.Nodes, s.Own.Applied, s.Own.Failed, s.Own.Pending+s.Own.Running, s.Own.CheckOK)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(d.Nodes) == 0 {
		return nil
	}
	fmt.Fprintln(w)
	tw = tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tGEN\tPHASE\tCHECK\tCHECKED\tERROR")
	for _, n := range d.Nodes {
		checked := "-"
		if !n.CheckedAt.IsZero() {
			checked = ago(now.Sub(n.CheckedAt))
		}
		msg := n.Error
		if n.Check == mission.CheckFailed && n.CheckOutput != "" {
			msg = strings.TrimSpace(msg + " check: " + firstLine(n.CheckOutput))
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%s\t%s\t%s\n", n.Node, n.Generation, n.Phase, dash(n.Check), checked, msg)
	}
	return tw.Flush()
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(strings.TrimSpace(s), "\n")
	if len(s) > 120 {
		s = s[:120] + "…"
	}
	return s
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

func newMissionListCmd() *cobra.Command {
	return listCommand(&cobra.Command{
		Use:   "list",
		Short: "List the missions this hub holds (created here or received from above)",
	},
		(*apiclient.Client).ListMissions, "NAME\tORIGIN\tGEN\tPLACED HERE\tNODES\tAPPLIED\tFAILED\tPENDING\tPLACEMENT",
		func(m apitype.Mission) string {
			origin := "here"
			if !m.Local {
				origin = shortID(m.Origin)
			}
			return fmt.Sprintf("%s\t%s\t%d\t%v\t%d\t%d\t%d\t%d\t%s", m.Name, origin, m.Generation, m.Placed, m.Total.Nodes,
				m.Total.Applied, m.Total.Failed, m.Total.Pending+m.Total.Running, placementText(m.Placement))
		})
}

func newMissionDeleteCmd() *cobra.Command {
	return argCommand(&cobra.Command{
		Use:   "delete NAME",
		Short: "Delete a mission created at this hub: a tombstone goes down the tree (work done on nodes is not undone)",
	}, func(c *apiclient.Client, ctx context.Context, name string) error {
		o, err := c.DeleteMission(ctx, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "mission %s deleted (tombstone at generation %d); sites drop it as it reaches them\n", name,
			o.Generation)
		return nil
	})
}
