package main

import (
	"fmt"
	"os"
	"sort"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
)

func sortStrings(s []string) { sort.Strings(s) }

func newNodesCmd() *cobra.Command {
	var cf clientFlags
	var output string
	cmd := &cobra.Command{
		Use:   "nodes",
		Short: "List nodes (online state comes from the live tunnels)",
		Long: `List registered nodes. -o json prints an array of objects with id, name,
labels, online, transport (quic|tcp, of the live or last session),
agent_version, os, last_seen and more.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			nodes, err := c.ListNodes(cmd.Context())
			if err != nil {
				return err
			}
			if output == "json" {
				return printJSON(os.Stdout, nodes)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tONLINE\tTRANSPORT\tAGENT\tOS\tLAST SEEN\tLABELS")
			for _, n := range nodes {
				seen := "never"
				if !n.LastSeen.IsZero() {
					seen = time.Since(n.LastSeen).Round(time.Second).String() + " ago"
				}
				fmt.Fprintf(tw, "%s\t%v\t%s\t%s\t%s\t%s\t%s\n", n.Name, n.Online, n.Transport, n.AgentVersion, n.OS, seen, formatLabels(n.Labels))
			}
			return tw.Flush()
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
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
	cmd.AddCommand(rm)
	return cmd
}

var rmFlags clientFlags
