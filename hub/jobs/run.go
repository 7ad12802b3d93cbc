package jobs

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"os"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/store"
)

// liveJob is a running job. mu guards its fields and every nodeRun.
type liveJob struct {
	e         *Engine
	job       store.Job
	cancel    context.CancelFunc
	done      chan struct{}
	tolerated int // failures accepted before no new run starts; -1: no limit
	runs      []*nodeRun
	byName    map[string]*nodeRun

	mu          sync.Mutex
	subs        map[*Subscription]struct{}
	dirty       map[*nodeRun]struct{}
	failures    int
	cancelledBy string
	finished    bool
}

type nodeRun struct {
	store.JobNode
	log logBuf
	// removed is closed when the node is removed before the run started
	// (nodeGone records that, guarded by liveJob.mu).
	removed  chan struct{}
	nodeGone bool
}

// gone reports whether r's node was removed.
func (r *nodeRun) gone() bool {
	select {
	case <-r.removed:
		return true
	default:
		return false
	}
}

func (r *nodeRun) event() Event {
	return Event{Type: "node", Node: r.Node, State: r.State, ExitCode: r.ExitCode, Error: r.Error}
}

// broadcast sends ev to subscribers without blocking: one that cannot keep
// up is dropped (marked lagged) rather than stalling the job. Called with
// mu held.
func (lj *liveJob) broadcast(ev Event) {
	for s := range lj.subs {
		if s.node != "" && s.node != ev.Node {
			continue
		}
		select {
		case s.c <- ev:
		default:
			s.lagged = true
			delete(lj.subs, s)
			close(s.c)
		}
	}
}

// update applies f to r under the lock, marks r for the next flush and
// tells followers.
func (lj *liveJob) update(r *nodeRun, f func()) {
	lj.mu.Lock()
	defer lj.mu.Unlock()
	f()
	lj.markDirty(r)
	lj.broadcast(r.event())
}

func (lj *liveJob) markDirty(r *nodeRun) {
	if lj.dirty == nil {
		lj.dirty = map[*nodeRun]struct{}{}
	}
	lj.dirty[r] = struct{}{}
}

// finish records a final state for r.
func (lj *liveJob) finish(r *nodeRun, state string, code *int, msg string) {
	now := time.Now().UTC()
	lj.update(r, func() {
		r.State, r.ExitCode, r.Error, r.FinishedAt = state, code, msg, now
		if state == store.RunFailed {
			lj.failures++
		}
	})
	if m := lj.e.cfg.Metrics; m != nil {
		m.NodeRuns.WithLabelValues(state).Inc()
		if !r.StartedAt.IsZero() {
			m.NodeRunDuration.WithLabelValues(state).Observe(now.Sub(r.StartedAt).Seconds())
		}
	}
}

// note writes a line of the hub's own into r's log (uploads, retries).
func (lj *liveJob) note(r *nodeRun, format string, args ...any) {
	(&nodeWriter{lj: lj, r: r, stream: "hub"}).Write([]byte("[tether] " + fmt.Sprintf(format, args...) + "\n"))
}

type nodeWriter struct {
	lj     *liveJob
	r      *nodeRun
	stream string
}

func (w *nodeWriter) Write(p []byte) (int, error) {
	w.lj.mu.Lock()
	defer w.lj.mu.Unlock()
	w.r.log.write(p)
	w.r.LogBytes = w.r.log.total
	w.lj.markDirty(w.r)
	if len(w.lj.subs) > 0 {
		w.lj.broadcast(Event{Type: "output", Node: w.r.Node, Stream: w.stream, Data: append([]byte(nil), p...)})
	}
	return len(p), nil
}

func (lj *liveJob) stopReason() string {
	lj.mu.Lock()
	defer lj.mu.Unlock()
	if lj.tolerated >= 0 && lj.failures > lj.tolerated {
		return fmt.Sprintf(
			"not started: %d runs failed, more than --max-failures %s allows",
			lj.failures, lj.job.Spec.MaxFailures,
		)
	}
	return ""
}

// run fans the job out and records the outcome. It owns every goroutine it
// starts and returns after they ended and the store holds the final state.
func (lj *liveJob) run(ctx context.Context) {
	e := lj.e
	defer e.wg.Done()
	flushCtx, stopFlush := context.WithCancel(context.Background())
	flushDone := make(chan struct{})
	go lj.flusher(flushCtx, flushDone)

	sem := make(chan struct{}, lj.job.Spec.Parallel)
	var wg sync.WaitGroup
	for _, r := range lj.runs {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			state, msg := lj.cancelState()
			lj.finish(r, state, nil, msg)
			continue
		}
		if reason := lj.stopReason(); reason != "" {
			<-sem
			lj.finish(r, store.RunSkipped, nil, reason)
			continue
		}
		wg.Add(1)
		go func(r *nodeRun) {
			defer wg.Done()
			defer func() { <-sem }()
			lj.runNode(ctx, r)
		}(r)
	}
	wg.Wait()
	stopFlush()
	<-flushDone

	state, msg := lj.outcome(ctx)
	now := time.Now().UTC()
	if err := e.cfg.Store.FinishJob(context.Background(), lj.job.ID, state, msg, now); err != nil {
		e.cfg.Logger.Error("record job result", "job", lj.job.ID, "err", err)
	}
	if m := e.cfg.Metrics; m != nil {
		m.JobsRunning.Dec()
		m.JobsFinished.WithLabelValues(lj.job.Kind, state).Inc()
	}
	e.audit(store.AuditEvent{
		Kind:     "job_finish",
		Operator: lj.job.CreatedBy,
		Result:   state,
		Detail:   fmt.Sprintf("job %s: %s", lj.job.ID, msg),
	})
	e.cfg.Logger.Info("job finished", "job", lj.job.ID, "state", state, "detail", msg)

	final, err := e.cfg.Store.GetJob(context.Background(), lj.job.ID)
	if err != nil {
		final = lj.job
		final.State, final.Error, final.FinishedAt = state, msg, now
	}
	lj.mu.Lock()
	lj.finished = true
	lj.broadcast(Event{Type: "job", Job: &final})
	for s := range lj.subs {
		delete(lj.subs, s)
		close(s.c)
	}
	lj.mu.Unlock()
	e.mu.Lock()
	delete(e.live, lj.job.ID)
	e.mu.Unlock()
	lj.cancel()
	close(lj.done)
}

// cancelState is the state of a run the job's end cut short.
func (lj *liveJob) cancelState() (string, string) {
	lj.mu.Lock()
	by := lj.cancelledBy
	lj.mu.Unlock()
	if by == "" && lj.e.ctx.Err() != nil {
		return store.RunInterrupted, "the hub shut down while this run was live; rerun with `tether jobs rerun`"
	}
	if by == "" {
		by = "an operator"
	}
	return store.RunCancelled, "job cancelled by " + by
}

func (lj *liveJob) outcome(ctx context.Context) (string, string) {
	counts := map[string]int{}
	lj.mu.Lock()
	for _, r := range lj.runs {
		counts[r.State]++
	}
	by := lj.cancelledBy
	lj.mu.Unlock()
	total := len(lj.runs)
	summary := fmt.Sprintf(
		"%d/%d ok, %d failed, %d skipped",
		counts[store.RunOK], total, counts[store.RunFailed], counts[store.RunSkipped],
	)
	switch {
	case counts[store.RunInterrupted] > 0:
		return store.JobInterrupted, "the hub shut down during the job; " + summary
	case ctx.Err() != nil && by != "":
		return store.JobCancelled, "cancelled by " + by + "; " + summary
	case counts[store.RunOK] == total:
		return store.JobSucceeded, summary
	case counts[store.RunOK]+counts[store.RunSkipped] == total:
		// Nothing failed: the skipped nodes were offline (or removed), which
		// is not the command's failure.
		return store.JobPartial, summary
	case lj.tolerated >= 0 && counts[store.RunFailed] > lj.tolerated:
		return store.JobFailed, fmt.Sprintf(
			"stopped: more than --max-failures %s failed; %s",
			lj.job.Spec.MaxFailures, summary,
		)
	}
	return store.JobFailed, summary
}

// flusher writes dirty per-node records every FlushInterval, and once more
// when ctx ends.
func (lj *liveJob) flusher(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	t := time.NewTicker(lj.e.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-t.C:
			lj.flush()
		case <-ctx.Done():
			lj.flush()
			return
		}
	}
}

func (lj *liveJob) flush() {
	lj.mu.Lock()
	if len(lj.dirty) == 0 {
		lj.mu.Unlock()
		return
	}
	batch := make([]store.JobNode, 0, len(lj.dirty))
	taken := make([]*nodeRun, 0, len(lj.dirty))
	for r := range lj.dirty {
		n := r.JobNode
		n.LogHead, n.LogTail, n.LogDropped = r.log.snapshot()
		batch = append(batch, n)
		taken = append(taken, r)
	}
	lj.dirty = nil
	lj.mu.Unlock()
	if err := lj.e.cfg.Store.UpdateJobNodes(context.Background(), batch); err != nil {
		lj.e.cfg.Logger.Error("persist job progress; will retry", "job", lj.job.ID, "nodes", len(batch), "err", err)
		lj.mu.Lock()
		for _, r := range taken {
			lj.markDirty(r)
		}
		lj.mu.Unlock()
	}
}

// runNode runs the job's steps on one node and records the result.
func (lj *liveJob) runNode(ctx context.Context, r *nodeRun) {
	e, spec := lj.e, lj.job.Spec
	if r.gone() {
		lj.finish(r, store.RunSkipped, nil, store.NodeRemovedReason)
		return
	}
	local := e.cfg.Local[lj.job.Kind]
	var dial func(context.Context) (Conn, error) // bound by Resolve to what it found
	reason := ""
	if local == nil && e.cfg.Resolve != nil {
		dial, reason = e.cfg.Resolve(ctx, r.NodeID)
	} else {
		reason = lj.ready(r)
	}
	if reason != "" {
		if spec.WaitOnlineSecs <= 0 {
			if local == nil {
				reason += "; pass --wait-online to wait for it"
			}
			lj.finish(r, store.RunSkipped, nil, reason)
			return
		}
		lj.update(r, func() { r.State = store.RunWaiting })
		if !lj.waitOnline(ctx, r, time.Duration(spec.WaitOnlineSecs)*time.Second) {
			if r.gone() {
				lj.finish(r, store.RunSkipped, nil, store.NodeRemovedReason)
				return
			}
			if ctx.Err() != nil {
				state, msg := lj.cancelState()
				lj.finish(r, state, nil, msg)
				return
			}
			lj.finish(r, store.RunSkipped, nil, fmt.Sprintf("still %s after waiting %ds", lj.ready(r), spec.WaitOnlineSecs))
			return
		}
	}
	// Leaving waiting and NodeRemoved are ordered by the lock: a removal
	// that comes first ends the run here, one that comes later finds it
	// running and leaves it to fail with the closed tunnel.
	lj.mu.Lock()
	gone := r.nodeGone
	if !gone {
		r.State, r.StartedAt = store.RunRunning, time.Now().UTC()
		lj.markDirty(r)
		lj.broadcast(r.event())
	}
	lj.mu.Unlock()
	if gone {
		lj.finish(r, store.RunSkipped, nil, store.NodeRemovedReason)
		return
	}
	timeout := time.Duration(spec.TimeoutSeconds) * time.Second
	nctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	stdout, stderr := &nodeWriter{lj: lj, r: r, stream: "stdout"}, &nodeWriter{lj: lj, r: r, stream: "stderr"}

	if local != nil {
		code, err := local.Run(nctx, lj.job, r.NodeID, stdout, stderr)
		lj.ended(ctx, nctx, r, code, err, timeout)
		return
	}
	dialStart := time.Now()
	if dial == nil {
		dial = func(ctx context.Context) (Conn, error) { return e.cfg.Connect(ctx, r.NodeID) }
	}
	conn, err := dial(nctx)
	if m := e.cfg.Metrics; m != nil {
		res := "ok"
		if err != nil {
			res = "error"
		}
		m.SSHDialDuration.WithLabelValues(res).Observe(time.Since(dialStart).Seconds())
	}
	if err != nil {
		lj.fail(ctx, nctx, r, nil, fmt.Errorf("connect: %w", err), timeout)
		return
	}
	defer conn.Close()

	for _, u := range spec.Uploads {
		if err := lj.upload(nctx, conn, r, u); err != nil {
			lj.fail(ctx, nctx, r, nil, err, timeout)
			return
		}
	}
	// Every run learns which node and job it is part of.
	env := maps.Clone(spec.Env)
	if env == nil {
		env = map[string]string{}
	}
	env["TETHER_NODE"], env["TETHER_JOB"] = r.Node, lj.job.ID
	cmd := Command{Line: spec.Command, Script: []byte(spec.Script), Env: env}
	if spec.Script == "" {
		cmd.Script = nil
	}
	code, err := conn.Run(nctx, cmd, stdout, stderr)
	lj.ended(ctx, nctx, r, code, err, timeout)
}

// ended records how a run's command ended: its exit code, or why it did
// not complete.
func (lj *liveJob) ended(jobCtx, nodeCtx context.Context, r *nodeRun, code int, err error, timeout time.Duration) {
	if err != nil {
		lj.fail(jobCtx, nodeCtx, r, nil, err, timeout)
		return
	}
	if code != 0 {
		lj.finish(r, store.RunFailed, &code, fmt.Sprintf("exit status %d", code))
		return
	}
	lj.finish(r, store.RunOK, &code, "")
}

// ready reports "" when r may start: its node is online, or for a local
// kind what the kind says.
func (lj *liveJob) ready(r *nodeRun) string {
	if l := lj.e.cfg.Local[lj.job.Kind]; l != nil {
		return l.Ready(lj.job, r.NodeID)
	}
	return lj.e.cfg.Online(r.NodeID)
}

// fail records why a run did not complete: the job was cancelled, the
// per-node timeout hit (the runner killed the remote process), or an error.
func (lj *liveJob) fail(jobCtx, nodeCtx context.Context, r *nodeRun, code *int, err error, timeout time.Duration) {
	switch {
	case jobCtx.Err() != nil:
		state, msg := lj.cancelState()
		lj.finish(r, state, code, msg)
	case errors.Is(nodeCtx.Err(), context.DeadlineExceeded):
		lj.finish(r, store.RunFailed, code, fmt.Sprintf("timed out after %s; the remote command was killed", timeout))
	default:
		lj.finish(r, store.RunFailed, code, err.Error())
	}
}

func (lj *liveJob) upload(ctx context.Context, conn Conn, r *nodeRun, u store.Upload) error {
	if u.IfMissing {
		ok, err := conn.Exists(ctx, u.Dest)
		if err != nil {
			return fmt.Errorf("upload %s: %w", u.Name, err)
		}
		if ok {
			lj.note(r, "kept %s already on the node", u.Dest)
			return nil
		}
	}
	f, size, err := lj.e.cfg.Blobs.Open(u.SHA256)
	if err != nil {
		return fmt.Errorf("upload %s: %w", u.Name, err)
	}
	defer f.Close()
	mode := os.FileMode(u.Mode)
	if mode == 0 {
		mode = 0o644
	}
	got, err := conn.Upload(ctx, f, size, u.Dest, mode, u.Mkdir)
	if err != nil {
		return fmt.Errorf("upload %s to %s: %w", u.Name, u.Dest, err)
	}
	if got != u.SHA256 {
		return fmt.Errorf("upload %s to %s: the node stored sha256:%s, want sha256:%s", u.Name, u.Dest, got, u.SHA256)
	}
	lj.note(r, "uploaded %s to %s (%d bytes, sha256:%s verified on the node)", u.Name, u.Dest, size, got)
	return nil
}

// waitOnline polls until r's node is online (true), or the wait or the job
// ends, or the node is removed (false).
func (lj *liveJob) waitOnline(ctx context.Context, r *nodeRun, d time.Duration) bool {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	tick := time.NewTicker(lj.e.cfg.PollInterval)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-r.removed:
			return false
		case <-deadline.C:
			return lj.ready(r) == ""
		case <-tick.C:
			if lj.ready(r) == "" {
				return true
			}
		}
	}
}
