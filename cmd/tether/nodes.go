package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/api"
)

func newNodesCmd() *cobra.Command {
	var selector string
	cmd := listCommand(&cobra.Command{
		Use:     "nodes",
		Aliases: []string{"ls"},
		Short:   "List the nodes you may reach (online state comes from the live tunnels)",
		Long: `List registered nodes: all of them for the admin; for an operator (after
'tether login', with --hub ADDR) or an API token, only the nodes their roles
select, as 'tsh ls' does. 'tether ls' is the same command.

LABELS are the hub-set labels (join token, 'tether nodes label'): roles select
on them. REPORTED are the labels the node's agent reports from its labels file
(tether-edge --labels-file): shown only, they never decide who reaches a node.

Nodes below this hub's site hubs are listed too, named NAME.SITE ("n7.berlin",
"n7.sub.berlin"), with the label site=SITE: SITE is the site they are below
("-" for the hub's own nodes); their online state is what their site last
reported. Roles and -l select them by their labels like any node.

-o json prints an array of objects with id, name, site (nodes below a site),
labels, reported_labels, online, transport (quic|tcp, of the live or last
session), agent_version, os, last_seen and more.`,
		Example: `  tether nodes -l env=dev
  tether nodes -l site=berlin,role=pos          # nodes below site berlin
  tether ls --hub hub.example.com:7443      # as an operator, after tether login`,
	}, func(c *api.Client, ctx context.Context) ([]api.Node, error) {
		return c.ListNodesMatching(ctx, selector)
	},
		"NAME\tSITE\tONLINE\tTRANSPORT\tAGENT\tOS\tLAST SEEN\tCLUSTER\tLABELS\tREPORTED",
		func(n api.Node) string {
			seen := lastSeenText(n, time.Now())
			online := fmt.Sprint(n.Online)
			if !n.RevokedAt.IsZero() {
				online = "revoked"
			}
			cluster := "-"
			if n.ClusterState != "" {
				cluster = n.ClusterEngine + ":" + n.ClusterState
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", n.Name, dashIfEmpty(n.Site), online, n.Transport, n.AgentVersion, n.OS, seen, cluster,
				dashIfEmpty(api.FormatLabels(n.Labels)), dashIfEmpty(api.FormatLabels(n.ReportedLabels)))
		})
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "only nodes whose labels match this selector (e.g. env=dev)")
	var rmFlags clientFlags
	rm := &cobra.Command{
		Use:   "rm NAME",
		Short: "Remove a node: its tunnel is closed and it can no longer connect",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := rmFlags.client()
			if err != nil {
				return err
			}
			defer c.Close()
			n, err := c.RemoveNode(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "node %s (%s) removed\n", n.Name, n.ID)
			return nil
		},
	}
	rmFlags.register(rm)
	var revokeFlags clientFlags
	revoke := &cobra.Command{
		Use:   "revoke NAME",
		Short: "Revoke a node: its tunnel closes within a second and reconnects are refused (the record is kept)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := revokeFlags.client()
			if err != nil {
				return err
			}
			defer c.Close()
			n, err := c.RevokeNode(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "node %s (%s) revoked\n", n.Name, n.ID)
			return nil
		},
	}
	revokeFlags.register(revoke)
	cmd.AddCommand(rm, revoke, newNodesLabelCmd())
	return cmd
}

func dashIfEmpty(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newNodesLabelCmd() *cobra.Command {
	var cf clientFlags
	var selector string
	cmd := &cobra.Command{
		Use:   "label (NAME... | -l SELECTOR) KEY=VALUE... KEY-...",
		Short: "Set (KEY=VALUE) or remove (KEY-) hub-set labels of nodes; access follows at once",
		Long: `Change the hub-set labels of the named nodes, or of every node matching
-l SELECTOR. KEY=VALUE sets a label, KEY- removes one. The change is stored
for all targets at once (all or none), audited per node (node_label), and takes
effect at once: roles select on the new labels from the next jump or job, and
connected nodes are pushed the operator keys and principals it gives them.

Labels a node reports itself (REPORTED in 'tether nodes') are not changed here
and never select a node.`,
		Example: `  tether nodes label n1 env=prod tier=edge
  tether nodes label n1 tier-
  tether nodes label -l site=berlin env=prod`,
		Args: cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			req, err := parseLabelArgs(args)
			if err != nil {
				return err
			}
			req.Selector = selector
			if (selector == "") == (len(req.Nodes) == 0) {
				return fmt.Errorf("name the nodes (NAME...) or give -l SELECTOR, not both")
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			nodes, err := c.LabelNodes(cmd.Context(), req)
			if err != nil {
				return err
			}
			for _, n := range nodes {
				fmt.Fprintf(os.Stderr, "node %s: labels %s\n", n.Name, dashIfEmpty(api.FormatLabels(n.Labels)))
			}
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "label all nodes matching this selector (instead of naming them)")
	return cmd
}

// parseLabelArgs sorts `nodes label` arguments into node names, KEY=VALUE
// (set) and KEY- (remove). The hub checks names and labels.
func parseLabelArgs(args []string) (api.NodeLabelRequest, error) {
	var req api.NodeLabelRequest
	for _, a := range args {
		switch k, v, isSet := strings.Cut(a, "="); {
		case isSet:
			if req.Set == nil {
				req.Set = map[string]string{}
			}
			if _, dup := req.Set[k]; dup {
				return req, fmt.Errorf("label %q is given twice", k)
			}
			req.Set[k] = v
		case strings.HasSuffix(a, "-") && len(a) > 1:
			req.Remove = append(req.Remove, strings.TrimSuffix(a, "-"))
		default:
			req.Nodes = append(req.Nodes, a)
		}
	}
	if len(req.Set) == 0 && len(req.Remove) == 0 {
		return req, fmt.Errorf("no label change given: KEY=VALUE sets a label, KEY- removes one")
	}
	return req, nil
}
