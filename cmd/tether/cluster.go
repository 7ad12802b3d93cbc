package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func newClusterCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "cluster",
		Short: "Install or remove a Kubernetes engine on nodes (the cluster state machine)",
		Long: `The hub drives each registered node through the cluster-agent state machine
(the Open Edge cluster agent's), over SSH through the node's tunnel:

  inactive -> registering -> install_in_progress -> active
  install_in_progress -> inactive                  (install failed; see last error)
  active|inactive -> deregistering -> uninstall_in_progress -> inactive

'register' sets the desired state to active, 'deregister' to inactive; the hub
then moves the node step by step and records every transition (tether audit,
metrics). At install the engine's uninstall script is cached on the node, in
the agent's state dir, and deregistration runs that cached script, so it works
even if the engine definition changed since. Install and uninstall scripts
must be idempotent: after a hub restart an unfinished step is run again.
An offline node waits in its state until it comes back. A deregister during an
install is kept and honoured when the install ends, whether it succeeded or
failed: the cached uninstall script runs next. A node runs one Kubernetes: a
member of a KubeOne cluster cannot be registered (nor a node with an engine
join a KubeOne cluster).

Engines are directories of install.sh + uninstall.sh (+ optional engine.yaml);
k3s and rke2 are built in, more come from 'tether hub --engines-dir DIR'.`,
	}
	var regFlags clientFlags
	var engine string
	register := &cobra.Command{
		Use:   "register NODE --engine ENGINE",
		Short: "Install ENGINE on NODE (desired state: active)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := regFlags.client()
			if err != nil {
				return err
			}
			defer c.Close()
			m, err := c.ClusterRegister(cmd.Context(), args[0], engine)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "node %s: desired active with %s (now %s); watch with 'tether cluster status'\n", m.Node,
				m.Engine, m.State)
			return nil
		},
	}
	regFlags.register(register)
	register.ValidArgsFunction = completeNodeArg(&regFlags)
	register.Flags().StringVar(&engine, "engine", "", "engine name, e.g. k3s or rke2 (required)")
	_ = register.MarkFlagRequired("engine")
	dereg := nodeArgCommand(
		&cobra.Command{Use: "deregister NODE", Short: "Uninstall the engine from NODE (desired state: inactive)"},
		func(c *apiclient.Client, ctx context.Context, node string) error {
			m, err := c.ClusterDeregister(ctx, node)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "node %s: desired inactive (now %s); watch with 'tether cluster status'\n", m.Node, m.State)
			return nil
		})
	status := listCommand(&cobra.Command{
		Use:   "status",
		Short: "Show each member's engine, desired and current state, last transition and error",
		Long: `Show cluster members. -o json prints node, engine, desired (active|inactive),
state (inactive, registering, install_in_progress, active, deregistering,
uninstall_in_progress), last_transition, last_error and last_job (see
'tether jobs logs ID' for the script's output).`,
	}, (*apiclient.Client).ClusterStatus, "NODE\tENGINE\tDESIRED\tSTATE\tSINCE\tLAST JOB\tLAST ERROR",
		func(m apitype.ClusterMember) string {
			since := "-"
			if !m.LastTransition.IsZero() {
				since = ago(time.Since(m.LastTransition))
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s", m.Node, m.Engine, m.Desired, m.State, since, m.LastJob, m.LastError)
		})
	cmd.AddCommand(register, dereg, status)
	return cmd
}
