package main

import (
	"context"
	"fmt"
	"os"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func newJobsCmd() *cobra.Command {
	var limit int
	cmd := listCommand(&cobra.Command{
		Use:   "jobs",
		Short: "List jobs (newest first); subcommands show, logs, rerun and cancel them",
		Long: `List jobs, newest first: id, kind (run, cluster_install, cluster_uninstall),
targets, start, state (running, succeeded, failed, cancelled, interrupted) and
per-node counts. A job the hub was running when it stopped shows interrupted,
and so do its runs that were live; rerun them with 'tether jobs rerun ID --failed'.`,
	}, func(c *apiclient.Client, ctx context.Context) ([]apitype.Job, error) { return c.ListJobs(ctx, limit) },
		"ID\tKIND\tTARGETS\tSTARTED\tSTATE\tOK\tFAILED\tSKIPPED\tOTHER\tWHAT",
		func(j apitype.Job) string {
			other := j.Total - j.Counts[apitype.RunOK] - j.Counts[apitype.RunFailed] - j.Counts[apitype.RunSkipped]
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%d\t%d\t%d\t%d\t%s", j.ID, j.Kind, targets(j),
				j.CreatedAt.Local().Format(time.DateTime),
				j.State, j.Counts[apitype.RunOK], j.Counts[apitype.RunFailed], j.Counts[apitype.RunSkipped], other, what(j.Spec))
		})
	cmd.Flags().IntVar(&limit, "limit", 50, "show the newest N jobs")
	cmd.AddCommand(newJobsShowCmd(), newJobsLogsCmd(), newJobsRerunCmd(), newJobsCancelCmd())
	return cmd
}

func targets(j apitype.Job) string {
	if j.Spec.Selector != "" {
		return fmt.Sprintf("-l %s (%d)", j.Spec.Selector, j.Total)
	}
	return fmt.Sprintf("%d nodes", j.Total)
}

func what(s apitype.JobSpec) string {
	w := s.Command
	switch {
	case s.Cluster != nil:
		w = s.Cluster.Action + " " + s.Cluster.Engine
	case s.Script != "":
		w = "script " + s.ScriptName
	}
	if len(w) > 40 {
		w = w[:39] + "…"
	}
	return w
}

func newJobsShowCmd() *cobra.Command {
	var cf clientFlags
	var output string
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show a job and each node's state, exit code, duration and error",
		Long: `Show a job. -o json prints the job record with "nodes": for each node its
state (pending, waiting, running, ok, failed, skipped, cancelled, interrupted),
exit_code, started_at, finished_at, error and log size.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "table" && output != "json" {
				return usageErrorf("--output %q: want table or json", output)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			d, err := c.GetJob(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			if output == "json" {
				return printJSON(os.Stdout, d)
			}
			fmt.Printf("job %s (%s) %s, created %s by %s: %s\n", d.ID, d.Kind, d.State,
				d.CreatedAt.Local().Format(time.DateTime), d.CreatedBy, what(d.Spec))
			if d.Error != "" {
				fmt.Printf("  %s\n", d.Error)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NODE\tSTATE\tEXIT\tDURATION\tOUTPUT\tERROR")
			for _, n := range d.Nodes {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%dB\t%s\n", n.Node, n.State, exitText(n.ExitCode),
					n.Duration(time.Now()).Round(time.Millisecond), n.LogBytes, n.Error)
			}
			return tw.Flush()
		},
	}
	cmd.ValidArgsFunction = completeJobArg(&cf, nil)
	cf.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newJobsLogsCmd() *cobra.Command {
	var cf clientFlags
	var node string
	var followLive bool
	cmd := &cobra.Command{
		Use:   "logs ID [--node NAME] [--follow]",
		Short: "Print a job's output (one node's, or all prefixed by node name)",
		Long: `Print the output a job produced. The hub keeps the first and the last 64 KiB
of each node's output; what was left out between is marked. With --follow the
output of a running job is streamed until it ends.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			id := args[0]
			if node != "" && !followLive {
				b, err := c.NodeLog(cmd.Context(), id, node)
				if err != nil {
					return err
				}
				_, err = os.Stdout.Write(b)
				return err
			}
			d, err := c.GetJob(cmd.Context(), id)
			if err != nil {
				return err
			}
			if node != "" {
				// One node: its output as it is, without prefixes.
				return c.JobEvents(cmd.Context(), id, node, func(ev apitype.JobEvent) error {
					switch {
					case ev.Type == "output" && ev.Dropped > 0:
						fmt.Printf("\n[tether: %d bytes of output omitted]\n", ev.Dropped)
						os.Stdout.Write(ev.Data)
					case ev.Type == "output" && ev.Stream == "stderr":
						os.Stderr.Write(ev.Data)
					case ev.Type == "output":
						os.Stdout.Write(ev.Data)
					case ev.Type == "error":
						return fmt.Errorf("%s", ev.Error)
					}
					return nil
				})
			}
			r := newRenderer(os.Stdout, os.Stderr, d.Job, true, false)
			r.setNodes(d.Nodes)
			err = c.JobEvents(cmd.Context(), id, "", r.event)
			r.flush()
			return err
		},
	}
	cmd.ValidArgsFunction = completeJobArg(&cf, nil)
	cf.register(cmd)
	cmd.Flags().StringVar(&node, "node", "", "only this node's output")
	cmd.Flags().BoolVarP(&followLive, "follow", "f", false, "stream a running job's output until it ends")
	_ = cmd.RegisterFlagCompletionFunc("node", completeJobNode(&cf))
	return cmd
}

func newJobsRerunCmd() *cobra.Command {
	var cf clientFlags
	var failed, detach bool
	var output, progress string
	cmd := &cobra.Command{
		Use:   "rerun ID [--failed]",
		Short: "Run a finished job again (the same command, script and uploads)",
		Long: `Start a new job with the same spec as job ID, on all its nodes or, with
--failed, on those that did not end ok (failed, interrupted, cancelled,
skipped). Jobs are meant to be idempotent, so re-running a node is safe. The
new job is followed like 'tether run' (same exit status).`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return codedError{2, err.Error()}
			}
			defer c.Close()
			j, err := c.RerunJob(cmd.Context(), args[0], failed)
			if err != nil {
				return codedError{2, err.Error()}
			}
			if detach {
				fmt.Println(j.ID)
				return nil
			}
			fmt.Fprintf(os.Stderr, "job %s re-runs %s on %d nodes\n", j.ID, args[0], j.Total)
			return follow(cmd.Context(), c, j, output, progress)
		},
	}
	cmd.ValidArgsFunction = completeJobArg(&cf, func(j apitype.Job) bool { return j.State != apitype.JobRunning })
	cf.register(cmd)
	cmd.Flags().BoolVar(&failed, "failed", false, "only the nodes that did not end ok")
	cmd.Flags().BoolVar(&detach, "detach", false, "print the new job id and return at once")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "text or json")
	cmd.Flags().StringVar(&progress, "progress", "auto", "progress line: auto, always or never")
	return cmd
}

func newJobsCancelCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "cancel ID",
		Short: "Cancel a running job: pending runs are cancelled, running ones killed on the node",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			j, err := c.CancelJob(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "job %s %s: %s\n", j.ID, j.State, j.Error)
			return nil
		},
	}
	cmd.ValidArgsFunction = completeJobArg(&cf, func(j apitype.Job) bool { return j.State == apitype.JobRunning })
	cf.register(cmd)
	return cmd
}
