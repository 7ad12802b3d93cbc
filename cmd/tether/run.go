package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"golang.org/x/term"
)

// Exit codes of tether run and tether jobs rerun.
const (
	exitFailed      = 1   // at least one node failed (or was interrupted or cancelled)
	exitSkippedOnly = 3   // no node failed, but some were skipped (offline or stopped)
	exitCancelled   = 130 // Ctrl-C: the job was cancelled on every node
)

// maxParallel is the hub's bound on --parallel (jobs.MaxParallel).
const maxParallel = 1000

type runOptions struct {
	cf          clientFlags
	selector    string
	nodes       []string
	script      string
	uploads     []string
	env         []string
	parallel    int
	timeout     time.Duration
	maxFailures string
	waitOnline  time.Duration
	output      string
	detach      bool
	progress    string
}

func newRunCmd() *cobra.Command {
	var o runOptions
	cmd := &cobra.Command{
		Use:   "run (-l SELECTOR | --nodes N1,N2) [flags] [-- COMMAND...] | --script FILE",
		Short: "Run a command or script on many nodes over SSH through their tunnels",
		Long: `Run a command (or a script) on every target node. The hub itself connects to
each node over SSH through the node's tunnel, with a short-lived certificate
it issues to itself, and verifies the node's host certificate. Nothing needs
to be installed on the operator's machine besides this binary.

Targets: --nodes n1,n2 or a label selector -l 'site=lab,tier in (edge)' ('*'
for all nodes). Offline nodes are reported as skipped, or waited for with
--wait-online 5m. Runs go --parallel at a time (default 50); once more runs
failed than --max-failures allows (a count, or a percentage of the targets),
no new run starts. --timeout is per node: the remote command and everything it
started are killed when it expires.

Files given with --upload LOCAL:REMOTE are copied first (atomically, SHA-256
checked on the node); the remote path must be absolute and its directory must
exist. The mode is the local file's.

Output is printed live, each line prefixed with the node name; on a terminal a
progress line shows the counts. Ctrl-C cancels the job on every node.
Everything is recorded: see 'tether jobs show ID' and 'tether jobs logs ID'.

-o json prints the final job record; each node in it carries its stdout and
stderr as text (the first 64 KiB of each; stdout_truncated/stderr_truncated
say when more was cut).

Exit status: 0 all nodes ok; 1 a node failed (or was cancelled/interrupted);
3 none failed but some were skipped (the job is "partial", not failed); 130
cancelled with Ctrl-C; 2 the job could not be started.

Automation can authenticate with an API token instead of the admin identity:
TETHER_API_TOKEN=tapi_... tether run --hub HOST:7443 --ca hub-ca.crt ...`,
		Example: `  tether run -l site=lab -- 'uname -r && systemctl is-active containerd'
  tether run --nodes n1,n2 --script ./setup.sh --upload ./app.tar:/opt/app.tar \
      --parallel 20 --timeout 5m --max-failures 10%`,
		RunE: func(cmd *cobra.Command, args []string) error { return o.run(cmd.Context(), args) },
	}
	f := cmd.Flags()
	f.StringVarP(&o.selector, "selector", "l", "", "label selector of the target nodes ('*' for all)")
	f.StringSliceVar(&o.nodes, "nodes", nil, "target node names, comma separated")
	f.StringVar(&o.script, "script", "", "run this local script file on each node (instead of a command)")
	f.StringArrayVar(&o.uploads, "upload", nil, "copy LOCAL:REMOTE to each node before running (repeatable)")
	f.StringArrayVar(&o.env, "env", nil, "set NAME=VALUE in the command's environment (repeatable)")
	f.IntVar(&o.parallel, "parallel", 50, fmt.Sprintf("how many nodes run at once (1..%d)", maxParallel))
	f.DurationVar(&o.timeout, "timeout", 10*time.Minute,
		"per-node time limit; the remote process is killed when it expires")
	f.StringVar(&o.maxFailures, "max-failures", "",
		"stop starting new runs once more than N (or P% of targets) failed; default: no limit")
	f.DurationVar(&o.waitOnline, "wait-online", 0, "wait up to this long for offline nodes instead of skipping them")
	f.StringVarP(&o.output, "output", "o", "text",
		"text (live output, summary) or json (the final job record with each node's stdout and stderr, at most 64 KiB each)")
	f.BoolVar(&o.detach, "detach", false,
		"print the job id and return at once; follow with 'tether jobs logs ID --follow'")
	f.StringVar(&o.progress, "progress", "auto", "progress line: auto (on a terminal), always or never")
	o.cf.register(cmd)
	_ = cmd.RegisterFlagCompletionFunc("nodes", completeNodeList(&o.cf))
	return cmd
}

func (o *runOptions) run(ctx context.Context, args []string) error {
	if o.output != "text" && o.output != "json" {
		return codedError{2, fmt.Sprintf("--output %q: want text or json", o.output)}
	}
	if o.parallel < 1 || o.parallel > maxParallel {
		return codedError{2, fmt.Sprintf("--parallel %d: want how many nodes run at once, 1..%d", o.parallel, maxParallel)}
	}
	req := apitype.JobCreateRequest{Selector: o.selector, Nodes: o.nodes, Parallel: o.parallel,
		TimeoutSeconds: int(o.timeout / time.Second), MaxFailures: o.maxFailures,
		WaitOnlineSeconds: int(o.waitOnline / time.Second)}
	if o.timeout%time.Second != 0 || o.timeout < time.Second {
		return codedError{2, fmt.Sprintf("--timeout %s: want whole seconds, at least 1s", o.timeout)}
	}
	if o.waitOnline%time.Second != 0 || o.waitOnline < 0 {
		return codedError{2, fmt.Sprintf("--wait-online %s: want whole seconds", o.waitOnline)}
	}
	switch {
	case o.script != "" && len(args) > 0:
		return codedError{2, "give a command after -- or --script FILE, not both"}
	case o.script != "":
		b, err := os.ReadFile(o.script)
		if err != nil {
			return codedError{2, fmt.Sprintf("--script: %v", err)}
		}
		req.Script, req.ScriptName = string(b), filepath.Base(o.script)
	case len(args) > 0:
		req.Command = strings.Join(args, " ")
	default:
		return codedError{2, "nothing to run: give a command after -- or --script FILE"}
	}
	if len(o.env) > 0 {
		req.Env = map[string]string{}
		for _, kv := range o.env {
			k, v, ok := strings.Cut(kv, "=")
			if !ok || k == "" {
				return codedError{2, fmt.Sprintf("--env %q: want NAME=VALUE", kv)}
			}
			req.Env[k] = v
		}
	}
	c, err := o.cf.client()
	if err != nil {
		return codedError{2, err.Error()}
	}
	defer c.Close()
	for _, spec := range o.uploads {
		u, err := uploadFile(ctx, c, spec)
		if err != nil {
			return codedError{2, err.Error()}
		}
		req.Uploads = append(req.Uploads, u)
	}
	job, err := c.CreateJob(ctx, req)
	if err != nil {
		return codedError{2, err.Error()}
	}
	if o.detach {
		fmt.Println(job.ID)
		return nil
	}
	return follow(ctx, c, job, o.output, o.progress)
}

// uploadFile sends LOCAL (of LOCAL:REMOTE) to the hub's blob store.
func uploadFile(ctx context.Context, c *apiclient.Client, spec string) (apitype.Upload, error) {
	local, remote, ok := strings.Cut(spec, ":")
	if !ok || local == "" || remote == "" {
		return apitype.Upload{}, fmt.Errorf("--upload %q: want LOCAL:REMOTE, e.g. ./app.tar:/opt/app.tar", spec)
	}
	f, err := os.Open(local)
	if err != nil {
		return apitype.Upload{}, fmt.Errorf("--upload: %w", err)
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return apitype.Upload{}, fmt.Errorf("--upload: %w", err)
	}
	if !st.Mode().IsRegular() {
		return apitype.Upload{}, fmt.Errorf("--upload %s: not a regular file", local)
	}
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return apitype.Upload{}, fmt.Errorf("--upload %s: %w", local, err)
	}
	sum := hex.EncodeToString(h.Sum(nil))
	if _, err := f.Seek(0, io.SeekStart); err != nil {
		return apitype.Upload{}, err
	}
	b, err := c.PutBlob(ctx, f, st.Size(), sum)
	if err != nil {
		return apitype.Upload{}, fmt.Errorf("--upload %s: %w", local, err)
	}
	return apitype.Upload{
		Name:   filepath.Base(local),
		SHA256: b.SHA256,
		Size:   b.Size,
		Dest:   remote,
		Mode:   uint32(st.Mode().Perm()),
	}, nil
}

// follow prints a job's events until it ends, cancels it on Ctrl-C, prints
// the summary and turns the outcome into the exit status.
func follow(ctx context.Context, c *apiclient.Client, job apitype.Job, output, progress string) error {
	isTTY := term.IsTerminal(int(os.Stderr.Fd()))
	showProgress := output == "text" && (progress == "always" || (progress == "auto" && isTTY))
	r := newRenderer(os.Stdout, os.Stderr, job, output == "text", showProgress)
	if d, err := c.GetJob(ctx, job.ID); err == nil {
		r.setNodes(d.Nodes) // align the prefixes from the first line on
	}
	outputs := runOutputs{}
	err := c.JobEvents(ctx, job.ID, "", func(ev apitype.JobEvent) error {
		if output == "json" {
			outputs.add(ev)
		}
		return r.event(ev)
	})
	r.flush()
	cancelled := false
	if ctx.Err() != nil {
		cancelled = true
		fmt.Fprintf(os.Stderr, "\ncancelling job %s on every node...\n", job.ID)
		cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, cerr := c.CancelJob(cctx, job.ID); cerr != nil {
			var ae *apitype.Error
			if !errors.As(cerr, &ae) || ae.Status != 409 {
				return codedError{exitCancelled, fmt.Sprintf("cancel job %s: %v", job.ID, cerr)}
			}
		}
	} else if err != nil {
		fmt.Fprintf(os.Stderr, "tether: following job %s: %v (the job goes on; see 'tether jobs show %s')\n", job.ID, err,
			job.ID)
	}
	dctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	detail, err := c.GetJob(dctx, job.ID)
	if err != nil {
		return codedError{exitFailed, fmt.Sprintf("read job %s: %v", job.ID, err)}
	}
	if output == "json" {
		if err := printJSON(os.Stdout, outputs.result(detail)); err != nil {
			return err
		}
	} else {
		printSummary(os.Stdout, detail)
	}
	switch {
	case cancelled:
		return codedError{exitCancelled, ""}
	case detail.State == apitype.JobRunning:
		return codedError{exitFailed,
			fmt.Sprintf("job %s is still running; follow it with 'tether jobs logs %s --follow'", job.ID, job.ID)}
	case detail.Counts[apitype.RunFailed]+detail.Counts[apitype.RunInterrupted]+detail.Counts[apitype.RunCancelled] > 0:
		return codedError{exitFailed, ""}
	case detail.Counts[apitype.RunSkipped] > 0:
		return codedError{exitSkippedOnly, ""}
	}
	return nil
}

// maxRunOutput bounds each node's stdout and stderr in `-o json`.
const maxRunOutput = 64 << 10

// runOutput is one node's output as `tether run -o json` shows it.
type runOutput struct {
	stdout, stderr                   []byte
	stdoutTruncated, stderrTruncated bool
}

// runOutputs collects each node's output from a job's events, bounded.
type runOutputs map[string]*runOutput

func (o runOutputs) add(ev apitype.JobEvent) {
	switch ev.Type {
	case "output":
	case "error": // the follower fell behind: some output is missing
		for _, n := range o {
			n.stdoutTruncated, n.stderrTruncated = true, true
		}
		return
	default:
		return
	}
	n := o[ev.Node]
	if n == nil {
		n = &runOutput{}
		o[ev.Node] = n
	}
	buf, truncated := &n.stdout, &n.stdoutTruncated
	switch ev.Stream {
	case "stderr":
		buf, truncated = &n.stderr, &n.stderrTruncated
	case "hub":
		return // the hub's own notes are in the job record
	case "log":
		// Output from before this follower: both streams as one, which
		// counts as stdout.
	}
	if ev.Dropped > 0 {
		*truncated = true
	}
	room := maxRunOutput - len(*buf)
	if len(ev.Data) > room {
		*truncated = true
		*buf = append(*buf, ev.Data[:max(room, 0)]...)
		return
	}
	*buf = append(*buf, ev.Data...)
}

// runNodeResult is a node of `tether run -o json`: its run record with its
// output.
type runNodeResult struct {
	apitype.JobNode
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated,omitempty"`
	StderrTruncated bool   `json:"stderr_truncated,omitempty"`
}

// runResult is what `tether run -o json` prints: the job record, each node
// with its output.
type runResult struct {
	apitype.JobDetail
	Nodes []runNodeResult `json:"nodes"`
}

func (o runOutputs) result(d apitype.JobDetail) runResult {
	out := runResult{JobDetail: d, Nodes: make([]runNodeResult, 0, len(d.Nodes))}
	for _, n := range d.Nodes {
		r := runNodeResult{JobNode: n}
		if got := o[n.Node]; got != nil {
			r.Stdout, r.Stderr = string(got.stdout), string(got.stderr)
			r.StdoutTruncated, r.StderrTruncated = got.stdoutTruncated, got.stderrTruncated
		}
		out.Nodes = append(out.Nodes, r)
	}
	return out
}
