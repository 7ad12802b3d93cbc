package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/kubeone"
)

// kubeoneSubcommands are more `tether kubeone` subcommands, each added by
// its own file in an init (apply, reset, kubeconfig, proxy).
var kubeoneSubcommands []func() *cobra.Command

func newKubeOneCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "kubeone",
		Short: "KubeOne clusters through the hub: members, SSH identity, manifest, status",
		Long: `A KubeOne cluster is a set of registered nodes (control plane and workers) that
KubeOne installs Kubernetes on, reaching every node through the hub: the hub is
KubeOne's bastion and each node's tunnel is the way in.

'create' makes the cluster's own ed25519 key pair on the hub (the private key
stays in the hub's data dir, DATA/kubeone/NAME/, and is never shown), authorizes
it on the members for the cluster's login, and lets it through the bastion as
user kubeone-NAME to the members only: the key reaches no other node.

'manifest' prints the KubeOneCluster manifest (kubeone.k8c.io/v1beta2): every
member by its node name (publicAddress) and reported address (privateAddress),
the hub as bastion, and every host key pinned as presented now (the hub-signed
host certificates, which is what KubeOne compares). Render it right before
running kubeone: a node's certificate changes when its agent reconnects, the
bastion's when the hub restarts, and an old manifest then fails closed.

'status' shows each member's tunnel. Nodes are named by their node names and
kept by node ID: a removed node leaves its cluster.`,
	}
	var members membersFlags
	var spec apitype.KubeOneSpec
	var extraFile string
	var createFlags clientFlags
	create := &cobra.Command{
		Use:   "create NAME --control-plane N1,N2,N3 [--workers N4,N5] --kubernetes 1.30.5",
		Short: "Create a KubeOne cluster of registered nodes",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			spec.Name = args[0]
			spec.ControlPlane, spec.Workers = members.controlPlane, members.workers
			if extraFile != "" {
				b, err := readExtra(extraFile)
				if err != nil {
					return err
				}
				spec.ManifestExtra = string(b)
			}
			c, err := createFlags.client()
			if err != nil {
				return err
			}
			defer c.Close()
			cl, err := c.CreateKubeOne(cmd.Context(), spec)
			if err != nil {
				return err
			}
			printWarnings(cl.Warnings)
			fmt.Fprintf(os.Stderr, "KubeOne cluster %s created: control plane %s", cl.Name, strings.Join(cl.ControlPlane, ","))
			if len(cl.Workers) > 0 {
				fmt.Fprintf(os.Stderr, ", workers %s", strings.Join(cl.Workers, ","))
			}
			fmt.Fprintf(os.Stderr,
				"; Kubernetes %s, login %s, CNI %s\nits key is authorized on the members; bastion user %s\n"+
					"next: tether kubeone status %s; tether kubeone manifest %s\n",
				cl.Kubernetes, cl.Login, cl.CNI, cl.BastionUser, cl.Name, cl.Name)
			return nil
		},
	}
	createFlags.register(create)
	members.register(create, &createFlags, true)
	create.Flags().StringVar(&spec.Kubernetes, "kubernetes", "", fmt.Sprintf("Kubernetes version, e.g. 1.30.5, "+
		"one the hub's kubeone installs: its release decides (KubeOne 1.8 and later install 1.%d to 1.%d, "+
		"each release three or four of those) (required)", kubeone.MinKubernetesMinor, kubeone.MaxKubernetesMinor))
	_ = create.MarkFlagRequired("kubernetes")
	create.Flags().StringVar(&spec.Login, "login", kubeone.DefaultLogin,
		"the login KubeOne uses on the members (it needs sudo unless root)")
	create.Flags().StringVar(&spec.CNI, "cni", kubeone.DefaultCNI, "CNI: canal, cilium, weave-net, or external")
	create.Flags().StringVar(&extraFile, "manifest-extra", "",
		"YAML file of more KubeOneCluster fields merged into the manifest (- for stdin); not hosts, name or versions")

	list := listCommand(&cobra.Command{Use: "list", Short: "List KubeOne clusters"}, (*apiclient.Client).ListKubeOne,
		"NAME\tKUBERNETES\tCONTROL PLANE\tWORKERS\tSTATUS\tBASTION USER",
		func(c apitype.KubeOneCluster) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", c.Name, c.Kubernetes, strings.Join(c.ControlPlane, ","),
				orDash(strings.Join(c.Workers, ",")), c.Status, c.BastionUser)
		})

	var manifestFlags clientFlags
	var bastion string
	manifest := &cobra.Command{
		Use:   "manifest NAME",
		Short: "Print the cluster's KubeOne manifest (every host key pinned; every member must be connected)",
		Long: `Print the cluster's KubeOneCluster manifest for running kubeone yourself:

  tether kubeone manifest edge1 > kubeone.yaml && kubeone apply -m kubeone.yaml

It names the cluster's key and certificate in the hub's data dir (readable by
the hub's user only), so run kubeone on the hub's machine as that user, or
copy both files and edit sshPrivateKeyFile/sshCertFile. --bastion names the
hub's SSH address as kubeone will dial it (default: the bastion's local
address). Render it right before use: pinned host certificates change when a
node reconnects or the hub restarts.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := manifestFlags.client()
			if err != nil {
				return err
			}
			defer c.Close()
			m, err := c.KubeOneManifest(cmd.Context(), args[0], bastion)
			if err != nil {
				return err
			}
			_, err = io.WriteString(os.Stdout, m)
			return err
		},
	}
	manifestFlags.register(manifest)
	manifest.Flags().StringVar(&bastion, "bastion", "", "HOST or HOST:PORT kubeone dials for the hub's bastion")

	var statusFlags clientFlags
	var output string
	status := &cobra.Command{
		Use:   "status NAME",
		Short: "Show the cluster's members with their tunnels, its last apply and API server health",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			c, err := statusFlags.client()
			if err != nil {
				return err
			}
			defer c.Close()
			st, err := c.KubeOneStatus(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if output == "json" {
				return printJSON(os.Stdout, st)
			}
			return printKubeOneStatus(os.Stdout, st, time.Now())
		},
	}
	statusFlags.register(status)
	status.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")

	var setMembers membersFlags
	var membersFlagsClient clientFlags
	membersCmd := &cobra.Command{
		Use:   "members NAME --control-plane N1,N2,N3 [--workers N4,N5]",
		Short: "Replace the cluster's members (nodes that leave lose its key at once)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := membersFlagsClient.client()
			if err != nil {
				return err
			}
			defer c.Close()
			cl, err := c.SetKubeOneMembers(cmd.Context(), args[0], apitype.KubeOneMembersRequest{
				ControlPlane: setMembers.controlPlane, Workers: setMembers.workers,
			})
			if err != nil {
				return err
			}
			printWarnings(cl.Warnings)
			fmt.Fprintf(os.Stderr, "KubeOne cluster %s: control plane %s, workers %s\n", cl.Name,
				strings.Join(cl.ControlPlane, ","), orDash(strings.Join(cl.Workers, ",")))
			return nil
		},
	}
	membersFlagsClient.register(membersCmd)
	setMembers.register(membersCmd, &membersFlagsClient, true)

	del := argCommand(&cobra.Command{
		Use: "delete NAME",
		Short: "Delete the cluster: its key is withdrawn from the members and removed (Kubernetes stays installed; " +
			"reset first to remove it)",
	}, func(c *apiclient.Client, ctx context.Context, name string) error {
		cl, err := c.DeleteKubeOne(ctx, name)
		if err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "KubeOne cluster %s deleted; its key no longer reaches %s\n", cl.Name,
			strings.Join(append(cl.ControlPlane, cl.Workers...), ","))
		return nil
	})

	cmd.AddCommand(create, list, manifest, status, membersCmd, del)
	for _, sub := range kubeoneSubcommands {
		cmd.AddCommand(sub())
	}
	return cmd
}

// membersFlags are --control-plane and --workers.
type membersFlags struct {
	controlPlane, workers []string
}

// register adds the flags to cmd; the shell completes their node names
// from the hub cf reaches.
func (m *membersFlags) register(cmd *cobra.Command, cf *clientFlags, required bool) {
	cmd.Flags().StringSliceVar(&m.controlPlane, "control-plane", nil,
		"control-plane node names, comma-separated (1, 3 or 5)")
	cmd.Flags().StringSliceVar(&m.workers, "workers", nil, "worker node names, comma-separated")
	if required {
		_ = cmd.MarkFlagRequired("control-plane")
	}
	_ = cmd.RegisterFlagCompletionFunc("control-plane", completeNodeList(cf))
	_ = cmd.RegisterFlagCompletionFunc("workers", completeNodeList(cf))
}

func readExtra(path string) ([]byte, error) {
	if path == "-" {
		return io.ReadAll(io.LimitReader(os.Stdin, kubeone.MaxManifestExtra+1))
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("--manifest-extra: %w", err)
	}
	return b, nil
}

func printWarnings(ws []string) {
	for _, w := range ws {
		fmt.Fprintln(os.Stderr, "warning:", w)
	}
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printKubeOneStatus prints a cluster's status: a summary, then one line
// per member with its tunnel.
func printKubeOneStatus(w io.Writer, st apitype.KubeOneStatus, now time.Time) error {
	fmt.Fprintf(w, "cluster %s: Kubernetes %s, status %s, %d/%d members up, bastion user %s\n",
		st.Name, st.Kubernetes, st.Status, st.MembersUp, len(st.Members), st.BastionUser)
	if st.LastApply != nil {
		fmt.Fprintf(w, "last apply: job %s %s, %s\n", st.LastApply.Job, orDash(st.LastApply.Result),
			ago(now.Sub(st.LastApply.At)))
	} else {
		fmt.Fprintln(w, "last apply: never")
	}
	if st.Kube != nil {
		ready := "not ready"
		if st.Kube.Ready {
			ready = "ready"
		}
		fmt.Fprintf(w, "kube-apiserver: %s %s (%s)\n", ready, st.Kube.Detail, ago(now.Sub(st.Kube.CheckedAt)))
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NODE\tROLE\tTUNNEL\tTRANSPORT\tLAST SEEN\tADDRESS")
	for _, m := range st.Members {
		tunnel := "down"
		switch {
		case m.Revoked:
			tunnel = "revoked"
		case m.Online:
			tunnel = "up"
		}
		seen := lastSeenText(apitype.Node{Online: m.Online, LastSeen: m.LastSeen}, now)
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", m.Node, m.Role, tunnel, orDash(m.Transport), seen, orDash(m.Address))
	}
	return tw.Flush()
}
