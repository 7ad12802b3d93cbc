package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
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

SITE is a node's site label, as the web console shows it ("-" without one):
what 'tether nodes -l site=berlin' and roles select. Nodes below this hub's
site hubs are listed too, named NAME.SITE ("n7.berlin", "n7.sub.berlin"),
with the label site=SITE, SITE being the site they are below; their online
state is what their site last reported. Roles and -l select them by their
labels like any node.

-o json prints an array of objects with id, name, site (the site label),
labels, reported_labels, online, transport (quic|tcp, of the live or last
session), agent_version, os, last_seen and more.`,
		Example: `  tether nodes -l env=dev
  tether nodes -l site=berlin,role=pos          # nodes below site berlin
  tether ls --hub hub.example.com:7443      # as an operator, after tether login`,
	}, func(c *apiclient.Client, ctx context.Context) ([]apitype.Node, error) {
		return c.ListNodesMatching(ctx, selector)
	},
		"NAME\tSITE\tONLINE\tTRANSPORT\tAGENT\tOS\tLAST SEEN\tCLUSTER\tLABELS\tREPORTED",
		func(n apitype.Node) string {
			seen := lastSeenText(n, time.Now())
			online := fmt.Sprint(n.Online)
			if !n.RevokedAt.IsZero() {
				online = "revoked"
			}
			cluster := "-"
			if n.ClusterState != "" {
				cluster = n.ClusterEngine + ":" + n.ClusterState
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", n.Name, dashIfEmpty(n.Site), online, n.Transport,
				n.AgentVersion, n.OS, seen, cluster,
				dashIfEmpty(apitype.FormatLabels(n.Labels)), dashIfEmpty(apitype.FormatLabels(n.ReportedLabels)))
		})
	cmd.Flags().StringVarP(&selector, "selector", "l", "", "only nodes whose labels match this selector (e.g. env=dev)")
	rm := eachNodeCommand(&cobra.Command{
		Use:   "rm NAME...",
		Short: "Remove nodes: their tunnels are closed and they can no longer connect",
		Example: `  tether nodes rm n1
  tether nodes rm n1 n2 n3`,
	}, "removed", (*apiclient.Client).RemoveNode)
	revoke := eachNodeCommand(&cobra.Command{
		Use:   "revoke NAME...",
		Short: "Revoke nodes: their tunnels close within a second and reconnects are refused (the records are kept)",
	}, "revoked", (*apiclient.Client).RevokeNode)
	cmd.AddCommand(rm, revoke, newNodesLabelCmd())
	return cmd
}

// eachNodeCommand builds a command that calls one client method per named
// node, as `nodes rm` and `nodes revoke` do: each node's outcome is its own
// line (one node failing does not stop the others), and the exit status is
// 1 if any failed.
func eachNodeCommand(cmd *cobra.Command, done string,
	call func(*apiclient.Client, context.Context, string) (apitype.Node, error)) *cobra.Command {
	var cf clientFlags
	cmd.Args = cobra.MinimumNArgs(1)
	cmd.ValidArgsFunction = completeNodeArgs(&cf)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		defer c.Close()
		failed := 0
		for _, name := range args {
			n, err := call(c, cmd.Context(), name)
			if err != nil {
				failed++
				fmt.Fprintf(os.Stderr, "tether: node %s: %v\n", name, err)
				continue
			}
			fmt.Fprintf(os.Stderr, "node %s (%s) %s\n", n.Name, n.ID, done)
		}
		if failed > 0 {
			return codedError{code: 1, msg: fmt.Sprintf("%d of %d nodes not %s", failed, len(args), done)}
		}
		return nil
	}
	cf.register(cmd)
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
				return usageErrorf("%v", err)
			}
			req.Selector = selector
			if (selector == "") == (len(req.Nodes) == 0) {
				return usageErrorf("name the nodes (NAME...) or give -l SELECTOR, not both")
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
				fmt.Fprintf(os.Stderr, "node %s: labels %s\n", n.Name, dashIfEmpty(apitype.FormatLabels(n.Labels)))
			}
			return nil
		},
	}
	cmd.ValidArgsFunction = func(cmd *cobra.Command, args []string, toComplete string) (
		[]cobra.Completion, cobra.ShellCompDirective) {
		if selector != "" || strings.Contains(toComplete, "=") {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		return completeNodeArgs(&cf)(cmd, args, toComplete)
	}
	cf.register(cmd)
	cmd.Flags().StringVarP(&selector, "selector", "l", "",
		"label all nodes matching this selector (instead of naming them)")
	return cmd
}

// parseLabelArgs sorts `nodes label` arguments into node names, KEY=VALUE
// (set) and KEY- (remove). The hub checks names and labels.
func parseLabelArgs(args []string) (apitype.NodeLabelRequest, error) {
	var req apitype.NodeLabelRequest
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
