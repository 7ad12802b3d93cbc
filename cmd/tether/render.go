package main

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// renderer prints a job's live events: complete output lines prefixed with
// the node name (stderr lines to stderr), and, on a terminal, a progress
// line kept at the bottom.
type renderer struct {
	out, errOut  io.Writer
	job          apitype.Job
	lines        bool
	progress     bool
	width        int
	partial      map[string]*bytes.Buffer // per node and stream: text after the last newline
	state        map[string]string
	start        time.Time
	lastProgress time.Time
	shown        bool
}

func newRenderer(out, errOut io.Writer, job apitype.Job, lines, progress bool) *renderer {
	return &renderer{out: out, errOut: errOut, job: job, lines: lines, progress: progress,
		partial: map[string]*bytes.Buffer{}, state: map[string]string{}, start: time.Now()}
}

// setNodes sizes the name column for the job's nodes.
func (r *renderer) setNodes(nodes []apitype.JobNode) {
	for _, n := range nodes {
		r.width = max(r.width, min(len(n.Node), 32))
	}
}

func (r *renderer) event(ev apitype.JobEvent) error {
	switch ev.Type {
	case "output":
		if r.lines {
			r.output(ev)
		}
	case "node":
		r.state[ev.Node] = ev.State
		if r.lines && apitype.RunFinal(ev.State) {
			r.flushNode(ev.Node)
		}
	case "error":
		r.clearProgress()
		fmt.Fprintln(r.errOut, "tether:", ev.Error)
	}
	r.drawProgress(ev.Type == "job")
	return nil
}

func (r *renderer) output(ev apitype.JobEvent) {
	if len(ev.Node) > r.width {
		r.width = min(len(ev.Node), 32)
	}
	key := ev.Node + "\x00" + ev.Stream
	buf := r.partial[key]
	if buf == nil {
		buf = &bytes.Buffer{}
		r.partial[key] = buf
	}
	if ev.Dropped > 0 {
		r.emit(ev.Node, ev.Stream, fmt.Sprintf("[tether: %d bytes of output omitted]", ev.Dropped))
	}
	buf.Write(ev.Data)
	for {
		i := bytes.IndexByte(buf.Bytes(), '\n')
		if i < 0 {
			break
		}
		line := string(buf.Next(i + 1))
		r.emit(ev.Node, ev.Stream, strings.TrimRight(line, "\r\n"))
	}
	if buf.Len() > 64<<10 { // a very long line: print it in pieces
		r.emit(ev.Node, ev.Stream, buf.String())
		buf.Reset()
	}
}

func (r *renderer) emit(node, stream, line string) {
	r.clearProgress()
	w := r.out
	if stream == "stderr" {
		w = r.errOut
	}
	fmt.Fprintf(w, "%-*s | %s\n", r.width, node, line)
}

func (r *renderer) flushNode(node string) {
	for _, stream := range []string{"log", "stdout", "stderr", "hub"} {
		if buf := r.partial[node+"\x00"+stream]; buf != nil && buf.Len() > 0 {
			r.emit(node, stream, buf.String())
			buf.Reset()
		}
	}
}

func (r *renderer) flush() {
	if r.lines {
		nodes := make([]string, 0, len(r.partial))
		for k := range r.partial {
			node, _, _ := strings.Cut(k, "\x00")
			nodes = append(nodes, node)
		}
		slices.Sort(nodes)
		for _, n := range slices.Compact(nodes) {
			r.flushNode(n)
		}
	}
	r.clearProgress()
}

func (r *renderer) clearProgress() {
	if r.shown {
		fmt.Fprint(r.errOut, "\r\x1b[K")
		r.shown = false
	}
}

// drawProgress redraws the progress line at most ten times a second (and
// always at the end).
func (r *renderer) drawProgress(force bool) {
	if !r.progress || (!force && time.Since(r.lastProgress) < 100*time.Millisecond && r.shown) {
		return
	}
	r.lastProgress = time.Now()
	counts := map[string]int{}
	for _, s := range r.state {
		counts[s]++
	}
	total := r.job.Total
	done := 0
	for s, n := range counts {
		if apitype.RunFinal(s) {
			done += n
		}
	}
	const barWidth = 24
	filled := 0
	if total > 0 {
		filled = barWidth * done / total
	}
	bar := strings.Repeat("=", filled) + strings.Repeat(" ", barWidth-filled)
	r.clearProgress()
	fmt.Fprintf(r.errOut, "[%s] %d/%d  ok %d  failed %d  skipped %d  running %d  %s", bar, done, total,
		counts[apitype.RunOK], counts[apitype.RunFailed], counts[apitype.RunSkipped],
		counts[apitype.RunRunning]+counts[apitype.RunWaiting],
		time.Since(r.start).Round(100*time.Millisecond))
	r.shown = true
}

// printSummary prints the job's outcome: one line of counts, and a table of
// the nodes that did not end ok.
func printSummary(w io.Writer, d apitype.JobDetail) {
	var notOK []apitype.JobNode
	for _, n := range d.Nodes {
		if n.State != apitype.RunOK {
			notOK = append(notOK, n)
		}
	}
	if len(notOK) > 0 {
		fmt.Fprintln(w)
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "NODE\tSTATE\tEXIT\tDURATION\tERROR")
		for i, n := range notOK {
			if i == 50 {
				fmt.Fprintf(tw, "... and %d more (tether jobs show %s)\t\t\t\t\n", len(notOK)-50, d.ID)
				break
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\n", n.Node, n.State, exitText(n.ExitCode),
				n.Duration(time.Now()).Round(time.Millisecond), n.Error)
		}
		tw.Flush()
	}
	took := time.Duration(0)
	if !d.FinishedAt.IsZero() {
		took = d.FinishedAt.Sub(d.CreatedAt).Round(time.Millisecond)
	}
	fmt.Fprintf(w, "\njob %s %s in %s: %d ok, %d failed, %d skipped, %d cancelled, %d interrupted (of %d)\n", d.ID,
		d.State, took,
		d.Counts[apitype.RunOK], d.Counts[apitype.RunFailed], d.Counts[apitype.RunSkipped], d.Counts[apitype.RunCancelled],
		d.Counts[apitype.RunInterrupted], d.Total)
}

func exitText(code *int) string {
	if code == nil {
		return "-"
	}
	return fmt.Sprint(*code)
}

// lastSeenText is a node's LAST SEEN column: "now" while its tunnel is up
// (the hub stores an online node's last sighting only every few minutes,
// so its age would grow while the node is connected), the age of the last
// sighting for an offline node, and "never" for one that never connected.
func lastSeenText(n apitype.Node, now time.Time) string {
	switch {
	case n.Online:
		return "now"
	case n.LastSeen.IsZero():
		return "never"
	}
	return ago(now.Sub(n.LastSeen))
}

// ago renders an age as people read it: seconds under a minute, then
// minutes, hours and minutes, and days and hours; a time ahead of now
// (clocks of the hub and this machine disagree) is "just now".
func ago(d time.Duration) string {
	switch {
	case d < time.Second:
		return "just now"
	case d < time.Minute:
		return fmt.Sprintf("%ds ago", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm ago", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh%dm ago", int(d/time.Hour), int(d%time.Hour/time.Minute))
	}
	return fmt.Sprintf("%dd%dh ago", int(d/(24*time.Hour)), int(d%(24*time.Hour)/time.Hour))
}
