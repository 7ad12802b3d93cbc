package main

import (
	"fmt"
	"net"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func init() {
	kubeoneSubcommands = append(kubeoneSubcommands,
		func() *cobra.Command { return newKubeOneRunCmd("apply") },
		func() *cobra.Command { return newKubeOneRunCmd("reset") },
		newKubeOneKubeconfigCmd, newKubeOneProxyCmd)
}

// defaultKubeOneProxy is where `tether kubeone proxy` listens and what
// `tether kubeone kubeconfig` points at, unless told otherwise.
const defaultKubeOneProxy = "127.0.0.1:6443"

func newKubeOneRunCmd(action string) *cobra.Command {
	var cf clientFlags
	var auto, detach bool
	var timeout time.Duration
	var output, progress string
	cmd := &cobra.Command{
		Use:   action + " NAME [--follow] [--auto]",
		Short: "Run `kubeone " + action + "` for the cluster on the hub, as a job",
		Long: `Run 'kubeone ` + action + `' for the cluster on the hub, as a job: the hub renders the
manifest with the host keys its bastion and the members present now, writes it
and the cluster's key into a private directory (0700, removed afterwards), and
runs the kubeone binary (the hub's --kubeone, or kubeone on its PATH) there.
KubeOne reaches every member through the hub as its bastion.

The run is refused while a member's tunnel is down (the error names them);
with --auto (apply only) the job waits and starts once every member is
connected. One run per cluster at a time. Output is followed live (Ctrl-C
cancels the run and kills kubeone); --detach prints the job id and returns.
The job is an ordinary hub job: 'tether jobs show|logs|cancel ID'. A hub
restart during a run marks it interrupted; run it again.

Exit status: 0 kubeone succeeded; 1 it failed, was cancelled or interrupted;
3 it never started (--auto and the members stayed offline for --timeout);
2 the run could not be started.`,
		Example: "  tether kubeone " + action + " edge1\n  tether kubeone apply edge1 --auto --detach",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if auto && action != "apply" {
				return codedError{2, "--auto is for apply"}
			}
			if timeout < time.Second {
				return codedError{2, fmt.Sprintf("--timeout %s: want at least 1s", timeout)}
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			j, err := c.KubeOneRun(cmd.Context(), args[0], action, apitype.KubeOneRunRequest{
				Auto: auto, TimeoutSeconds: int(timeout / time.Second),
			})
			if err != nil {
				return codedError{2, err.Error()}
			}
			if detach {
				fmt.Println(j.ID)
				return nil
			}
			what := "running"
			if auto {
				what = "waiting for every member, then running"
			}
			fmt.Fprintf(os.Stderr, "job %s: %s kubeone %s for cluster %s (Ctrl-C cancels it)\n", j.ID, what, action, args[0])
			return follow(cmd.Context(), c, j, output, progress)
		},
	}
	f := cmd.Flags()
	if action == "apply" {
		f.BoolVar(&auto, "auto", false, "start once every member's tunnel is up instead of refusing while one is not")
	}
	f.BoolVar(&detach, "detach", false, "print the job id and return at once; follow with 'tether jobs logs ID --follow'")
	// --follow is what happens without --detach; accepted so that the
	// documented `tether kubeone apply NAME --follow` reads as it does.
	f.Bool("follow", true, "follow the run's output until it ends (the default; see --detach)")
	f.DurationVar(&timeout, "timeout", time.Hour,
		"bound of the run; with --auto also of the wait for the members before it")
	f.StringVarP(&output, "output", "o", "text",
		"text (live output, summary) or json (the final job record with the output)")
	f.StringVar(&progress, "progress", "never", "progress line: auto (on a terminal), always or never")
	cf.register(cmd)
	return cmd
}

func newKubeOneKubeconfigCmd() *cobra.Command {
	var cf clientFlags
	var proxy string
	var raw bool
	cmd := &cobra.Command{
		Use:   "kubeconfig NAME [--proxy 127.0.0.1:6443] > NAME.kubeconfig",
		Short: "Print the cluster's admin kubeconfig, pointed at `tether kubeone proxy`",
		Long: `Print the cluster's admin kubeconfig: /etc/kubernetes/admin.conf of the first
connected control-plane member, read through its tunnel with the cluster's
identity. Its server is rewritten to https://PROXY (default 127.0.0.1:6443),
where 'tether kubeone proxy NAME' serves the API server through the hub, with
tls-server-name "kubernetes" so the API server's certificate still verifies.
--raw prints it as the node has it.

The kubeconfig is the cluster's admin credential: keep the file private.`,
		Example: "  tether kubeone kubeconfig edge1 > edge1.kubeconfig\n  tether kubeone proxy edge1 &\n" +
			"  kubectl --kubeconfig edge1.kubeconfig get nodes",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			b, err := c.KubeOneKubeconfig(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if !raw {
				if b, err = apiclient.RewriteKubeconfig(b, proxy); err != nil {
					return fmt.Errorf("kubeconfig of %s: %w", args[0], err)
				}
			}
			_, err = os.Stdout.Write(b)
			return err
		},
	}
	cmd.Flags().StringVar(&proxy, "proxy", defaultKubeOneProxy,
		"HOST:PORT of 'tether kubeone proxy' the kubeconfig points at")
	cmd.Flags().BoolVar(&raw, "raw", false, "print the kubeconfig as the node has it")
	cf.register(cmd)
	return cmd
}

func newKubeOneProxyCmd() *cobra.Command {
	var cf clientFlags
	var listen string
	cmd := &cobra.Command{
		Use:   "proxy NAME [--listen 127.0.0.1:6443]",
		Short: "Serve the cluster's API server on a local port, through the hub",
		Long: `Serve the cluster's kube-apiserver on a local port (default 127.0.0.1:6443),
like 'kubeone proxy': every connection is relayed through the hub and the first
connected control-plane member's tunnel to the API server on that member's
loopback. TLS stays end to end between kubectl and the API server. Runs until
interrupted.`,
		Example: "  tether kubeone proxy edge1 --listen 127.0.0.1:16443",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("--listen %s: %w", listen, err)
			}
			fmt.Fprintf(os.Stderr, "serving the API server of KubeOne cluster %s on %s (through the hub); Ctrl-C stops\n",
				args[0], ln.Addr())
			return c.KubeOneProxy(cmd.Context(), args[0], ln, func(format string, a ...any) {
				fmt.Fprintf(os.Stderr, "tether kubeone proxy: "+format+"\n", a...)
			})
		},
	}
	cmd.Flags().StringVar(&listen, "listen", defaultKubeOneProxy, "local HOST:PORT to serve the API server on")
	cf.register(cmd)
	return cmd
}
