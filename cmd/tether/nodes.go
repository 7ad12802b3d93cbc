package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/api"
)

func newNodesCmd() *cobra.Command {
	cmd := listCommand(&cobra.Command{
		Use:   "nodes",
		Short: "List nodes (online state comes from the live tunnels)",
		Long: `List registered nodes. -o json prints an array of objects with id, name,
labels, online, transport (quic|tcp, of the live or last session),
agent_version, os, last_seen and more.`,
	}, (*api.Client).ListNodes, "NAME\tONLINE\tTRANSPORT\tAGENT\tOS\tLAST SEEN\tCLUSTER\tLABELS",
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
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", n.Name, online, n.Transport, n.AgentVersion, n.OS, seen, cluster, api.FormatLabels(n.Labels))
		})
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
	cmd.AddCommand(rm, revoke)
	return cmd
}
