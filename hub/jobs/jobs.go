// Package jobs is the hub's job engine: it fans a job out to nodes with
// bounded parallelism, runs each node's steps over SSH through the tunnel
// (via a Connector; hub/jobs/sshconn is the hub's), persists every per-node
// result as it happens, and streams output to followers. Its HTTP
// endpoints (/v1/jobs, /v1/blobs; API in api.go) register on hub/api's
// route table.
package jobs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/blobs"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/store"
)

// Sentinel errors callers branch on.
var (
	ErrNotRunning = errors.New("job is not running")
	ErrBadSpec    = errors.New("invalid job")
	ErrClosed     = errors.New("job engine is shut down")
)

// Limits of a job spec.
const (
	DefaultParallel = 50
	MaxParallel     = 1000
	DefaultTimeout  = 10 * time.Minute
	MaxTimeout      = 24 * time.Hour
	MaxScriptBytes  = 1 << 20
	MaxCommandBytes = 64 << 10
	MaxUploads      = 16
	MaxNodes        = 100000
)

// Command is what runs on a node: a shell command line, or a script.
type Command struct {
	Line   string
	Script []byte
	Env    map[string]string
}

// Conn is an SSH connection to one node, reused across the steps of a run.
type Conn interface {
	// Run runs cmd and returns its exit code. An error means it did not
	// run to completion (the caller's context ended, the connection broke).
	Run(ctx context.Context, cmd Command, stdout, stderr io.Writer) (exitCode int, err error)
	// Upload copies size bytes from src to dst atomically and returns the
	// SHA-256 the node computed of what it stored.
	Upload(
		ctx context.Context, src io.Reader, size int64, dst string, mode os.FileMode, mkdir bool,
	) (sha256hex string, err error)
	Exists(ctx context.Context, path string) (bool, error)
	Close() error
}

// Connector opens a Conn to the node with this ID (stream through its
// tunnel, SSH handshake with the hub's certificate, host certificate
// verified). It must not reach another machine that holds the node's name
// now: a run belongs to the node ID it was started for.
type Connector func(ctx context.Context, nodeID string) (Conn, error)

// Resolver looks node nodeID up once for a run on it: when the run may start
// now it returns a Connector-like dial bound to what it found (the same
// node, by the route found then) and ""; else nil and why not (Online's
// contract). One look-up then decides both whether the run starts and where
// it connects, instead of one for each (bench P6: a store read per node).
type Resolver func(ctx context.Context, nodeID string) (dial func(ctx context.Context) (Conn, error), reason string)

// Local does the work of a job kind on the hub itself instead of on each
// node over SSH: a KubeOne apply is one process on the hub that reaches the
// nodes through the bastion. A job of such a kind has one run per target
// it works on (a cluster), whose NodeRef.ID is that target's ID; the engine
// persists, streams, cancels and interrupts it like any other run.
type Local interface {
	// Ready reports "" when the run for target may start, else why not
	// (Config.Online's contract: the run waits while the spec's
	// wait-online allows, and is skipped with this reason after).
	Ready(job store.Job, target string) string
	// Run does the work, streaming its output. An error means it did not
	// run to completion (the context ended, it could not start).
	Run(ctx context.Context, job store.Job, target string, stdout, stderr io.Writer) (exitCode int, err error)
}

// Config is what the engine works with.
type Config struct {
	Store   store.JobStore
	Connect Connector
	// Local lists the job kinds whose runs the hub does itself (see
	// Local), by kind; the others run on their nodes through Connect.
	Local map[string]Local
	// Online reports whether the node with this ID has a live tunnel; ""
	// means online, else a reason it is not (e.g. "offline (last seen 3m
	// ago)").
	Online func(nodeID string) string
	// Resolve, when set, replaces a remote run's first Online check and
	// its Connect with one look-up; a run whose node was offline then and
	// that waits for it (--wait-online) polls Online and uses Connect.
	Resolve Resolver
	Blobs   *blobs.Store
	Metrics *metrics.Metrics // may be nil
	Logger  *slog.Logger
	// Audit records job decisions (start, finish, cancel); may be nil.
	Audit func(store.AuditEvent)
	// Owner is the hub replica this engine runs in: its jobs are stored
	// with it, so that when the replica dies the leader marks exactly its
	// jobs interrupted (store.InterruptOrphanedJobs). "" on a hub that has
	// no replica ID.
	Owner string
	// FlushInterval is how often per-node progress is written to the store
	// (final states are always written before the job is marked done).
	FlushInterval time.Duration
	// PollInterval is how often a waiting run checks whether its node came
	// online.
	PollInterval time.Duration
	// AliveInterval is how often the running jobs are marked alive in the
	// store: a job this hub's death interrupts ends at its last mark, so
	// at most this much of the run's recorded duration is not known to
	// have happened, and none of the hub's downtime is. Default 2 s.
	AliveInterval time.Duration
}

// Engine runs jobs. Close stops every running job and waits for them.
type Engine struct {
	cfg    Config
	ctx    context.Context // owner of every job goroutine
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	live   map[string]*liveJob
	closed bool
}

// New returns an engine; ctx bounds every job it runs.
func New(ctx context.Context, cfg Config) *Engine {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.FlushInterval <= 0 {
		cfg.FlushInterval = 200 * time.Millisecond
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 500 * time.Millisecond
	}
	if cfg.Online == nil {
		cfg.Online = func(string) string { return "" }
	}
	if cfg.AliveInterval <= 0 {
		cfg.AliveInterval = 2 * time.Second
	}
	ctx, cancel := context.WithCancel(ctx)
	e := &Engine{cfg: cfg, ctx: ctx, cancel: cancel, live: map[string]*liveJob{}}
	e.wg.Add(1)
	go e.markAlive()
	return e
}

// markAlive marks the live jobs alive every AliveInterval until the engine
// stops.
func (e *Engine) markAlive() {
	defer e.wg.Done()
	t := time.NewTicker(e.cfg.AliveInterval)
	defer t.Stop()
	for {
		select {
		case <-e.ctx.Done():
			return
		case now := <-t.C:
			e.mu.Lock()
			ids := slices.Collect(maps.Keys(e.live))
			e.mu.Unlock()
			if len(ids) == 0 {
				continue
			}
			if err := e.cfg.Store.MarkJobsAlive(e.ctx, ids, now.UTC()); err != nil && e.ctx.Err() == nil {
				e.cfg.Logger.Warn("jobs not marked alive (a hub crash now would end them at their last mark)",
					"jobs", len(ids), "err", err)
			}
		}
	}
}

// Recover marks jobs a previous hub process left running as interrupted;
// call it once at start, before Start. With an Owner, only that replica's
// jobs (and those from before replicas) are: the other replicas' jobs are
// live, and a dead replica's are the leader's to sweep up.
func (e *Engine) Recover(ctx context.Context) (int, error) {
	var (
		n   int
		err error
	)
	if e.cfg.Owner == "" {
		n, err = e.cfg.Store.InterruptJobs(ctx, time.Now())
	} else {
		n, err = e.cfg.Store.InterruptJobsOf(ctx, []string{e.cfg.Owner, ""}, time.Now())
	}
	if err != nil {
		return 0, err
	}
	if n > 0 {
		e.cfg.Logger.Warn("jobs interrupted by the previous hub stop", "jobs", n)
	}
	return n, nil
}

// Close cancels running jobs, waits for them to record their state, and
// stops the engine.
func (e *Engine) Close() {
	e.mu.Lock()
	e.closed = true
	e.mu.Unlock()
	e.cancel()
	e.wg.Wait()
}

// NewID returns a fresh job id.
func NewID() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// MaxFailures is a parsed --max-failures: a count, or a percentage of the
// job's nodes. Tolerated reports how many failures a job of n nodes accepts
// before it stops starting new runs.
type MaxFailures struct {
	set     bool
	count   int
	percent float64
}

// ParseMaxFailures parses "", "N" or "P%".
func ParseMaxFailures(s string) (MaxFailures, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return MaxFailures{}, nil
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || v < 0 || v > 100 || math.IsNaN(v) {
			return MaxFailures{}, fmt.Errorf("%w: max failures %q: want a count (e.g. 3) or a percentage 0%%..100%% "+
				"(e.g. 10%%)", ErrBadSpec, s)
		}
		return MaxFailures{set: true, percent: v}, nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 0 {
		return MaxFailures{}, fmt.Errorf("%w: max failures %q: want a count (e.g. 3) or a percentage (e.g. 10%%)",
			ErrBadSpec, s)
	}
	return MaxFailures{set: true, count: v}, nil
}

// Tolerated is the number of failures a job of n nodes may have and keep
// going; -1 means no limit.
func (m MaxFailures) Tolerated(n int) int {
	switch {
	case !m.set:
		return -1
	case m.percent > 0:
		return int(math.Floor(m.percent * float64(n) / 100))
	}
	return m.count
}

// Validate checks a spec and fills its defaults.
func Validate(spec *store.JobSpec, blobs *blobs.Store) error {
	hasCmd, hasScript := spec.Command != "", spec.Script != ""
	switch {
	case hasCmd == hasScript:
		return fmt.Errorf("%w: give exactly one of a command or a script", ErrBadSpec)
	case len(spec.Command) > MaxCommandBytes:
		return fmt.Errorf("%w: command is %d bytes; the limit is %d (use a script)", ErrBadSpec, len(spec.Command),
			MaxCommandBytes)
	case len(spec.Script) > MaxScriptBytes:
		return fmt.Errorf("%w: script is %d bytes; the limit is %d (upload large payloads with --upload)", ErrBadSpec,
			len(spec.Script), MaxScriptBytes)
	case strings.ContainsRune(spec.Command, 0) || strings.ContainsRune(spec.Script, 0):
		return fmt.Errorf("%w: command or script contains a NUL byte", ErrBadSpec)
	}
	if spec.Parallel == 0 {
		spec.Parallel = DefaultParallel
	}
	if spec.Parallel < 1 || spec.Parallel > MaxParallel {
		return fmt.Errorf("%w: parallel %d: want 1..%d", ErrBadSpec, spec.Parallel, MaxParallel)
	}
	if spec.TimeoutSeconds == 0 {
		spec.TimeoutSeconds = int(DefaultTimeout / time.Second)
	}
	if spec.TimeoutSeconds < 1 || time.Duration(spec.TimeoutSeconds)*time.Second > MaxTimeout {
		return fmt.Errorf("%w: timeout %ds: want 1s..%s", ErrBadSpec, spec.TimeoutSeconds, MaxTimeout)
	}
	if spec.WaitOnlineSecs < 0 || time.Duration(spec.WaitOnlineSecs)*time.Second > MaxTimeout {
		return fmt.Errorf("%w: wait-online %ds: want 0..%s", ErrBadSpec, spec.WaitOnlineSecs, MaxTimeout)
	}
	if _, err := ParseMaxFailures(spec.MaxFailures); err != nil {
		return err
	}
	for k := range spec.Env {
		if !validEnvName(k) {
			return fmt.Errorf("%w: environment variable name %q: want letters, digits and _ (not starting with a digit)",
				ErrBadSpec, k)
		}
	}
	if len(spec.Uploads) > MaxUploads {
		return fmt.Errorf("%w: %d uploads; the limit is %d (pack them into an archive)", ErrBadSpec,
			len(spec.Uploads), MaxUploads)
	}
	for _, u := range spec.Uploads {
		if err := ValidateRemotePath(u.Dest); err != nil {
			return fmt.Errorf("%w: upload %s: %w", ErrBadSpec, u.Name, err)
		}
		if u.Mode&^0o7777 != 0 {
			return fmt.Errorf("%w: upload %s: mode %o: want permission bits only", ErrBadSpec, u.Name, u.Mode)
		}
		if blobs != nil && !blobs.Has(u.SHA256) {
			return fmt.Errorf("%w: upload %s: sha256:%s is not on the hub; upload it first (POST /v1/blobs)", ErrBadSpec,
				u.Name, u.SHA256)
		}
	}
	return nil
}

func validEnvName(s string) bool {
	if s == "" {
		return false
	}
	for i, c := range s {
		if c != '_' && (c < 'A' || c > 'Z') && (c < 'a' || c > 'z') && (i == 0 || c < '0' || c > '9') {
			return false
		}
	}
	return true
}

// ValidateRemotePath checks a destination path on a node: absolute, clean,
// no NUL, no "..", no trailing slash.
func ValidateRemotePath(p string) error {
	switch {
	case p == "":
		return errors.New("destination path is empty")
	case !strings.HasPrefix(p, "/"):
		return fmt.Errorf("destination %q must be an absolute path", p)
	case strings.ContainsRune(p, 0) || strings.ContainsAny(p, "\n\r"):
		return fmt.Errorf("destination %q contains a NUL or newline", p)
	case len(p) > 4096:
		return errors.New("destination path is longer than 4096 bytes")
	case p == "/" || strings.HasSuffix(p, "/"):
		return fmt.Errorf("destination %q must name a file, not a directory", p)
	}
	for _, part := range strings.Split(p[1:], "/") {
		if part == "" || part == "." || part == ".." {
			return fmt.Errorf("destination %q must be a clean path (no empty, . or .. elements)", p)
		}
	}
	return nil
}

// Start persists the job with all nodes pending and runs it in the
// background. Each run is bound to its node's ID. j.Spec must have passed
// Validate.
func (e *Engine) Start(ctx context.Context, j store.Job, nodes []store.NodeRef) (store.Job, error) {
	if len(nodes) == 0 {
		return store.Job{}, fmt.Errorf("%w: no target nodes", ErrBadSpec)
	}
	if len(nodes) > MaxNodes {
		return store.Job{}, fmt.Errorf("%w: %d target nodes; the limit is %d", ErrBadSpec, len(nodes), MaxNodes)
	}
	mf, err := ParseMaxFailures(j.Spec.MaxFailures)
	if err != nil {
		return store.Job{}, err
	}
	if j.ID == "" {
		j.ID = NewID()
	}
	j.State, j.CreatedAt, j.Owner = store.JobRunning, time.Now().UTC(), e.cfg.Owner
	e.mu.Lock()
	closed := e.closed
	e.mu.Unlock()
	if closed {
		return store.Job{}, ErrClosed
	}
	if err := e.cfg.Store.CreateJob(ctx, j, nodes); err != nil {
		return store.Job{}, err
	}
	jctx, cancel := context.WithCancel(e.ctx)
	lj := &liveJob{e: e, job: j, cancel: cancel, done: make(chan struct{}), tolerated: mf.Tolerated(len(nodes)),
		runs: make([]*nodeRun, len(nodes)), byName: make(map[string]*nodeRun, len(nodes))}
	for i, n := range nodes {
		if n.ID == "" {
			cancel()
			return store.Job{}, fmt.Errorf("%w: target %q has no node ID", ErrBadSpec, n.Name)
		}
		r := &nodeRun{JobNode: store.JobNode{JobID: j.ID, NodeID: n.ID, Node: n.Name, State: store.RunPending},
			removed: make(chan struct{})}
		lj.runs[i], lj.byName[n.Name] = r, r
	}
	e.mu.Lock()
	if e.closed {
		e.mu.Unlock()
		cancel()
		_ = e.cfg.Store.FinishJob(context.Background(), j.ID, store.JobInterrupted, "the hub was shutting down", time.Now())
		return store.Job{}, ErrClosed
	}
	e.live[j.ID] = lj
	e.wg.Add(1)
	e.mu.Unlock()
	if e.cfg.Metrics != nil {
		e.cfg.Metrics.JobsRunning.Inc()
	}
	e.audit(store.AuditEvent{Kind: "job_start", Operator: j.CreatedBy, Result: "ok",
		Detail: fmt.Sprintf("job %s (%s) on %d nodes: %s", j.ID, j.Kind, len(nodes), describe(j.Spec))})
	e.cfg.Logger.Info("job started", "job", j.ID, "kind", j.Kind, "nodes", len(nodes), "by", j.CreatedBy)
	go lj.run(jctx)
	j.Counts, j.Total = map[string]int{store.RunPending: len(nodes)}, len(nodes)
	return j, nil
}

func describe(s store.JobSpec) string {
	what := s.Command
	if s.Script != "" {
		what = "script " + s.ScriptName
	}
	if len(what) > 200 {
		what = what[:200] + "…"
	}
	return what
}

func (e *Engine) audit(ev store.AuditEvent) {
	if e.cfg.Audit != nil {
		ev.At = time.Now()
		e.cfg.Audit(ev)
	}
}

// Cancel stops a running job: runs not started are cancelled, running ones
// are killed on the node.
func (e *Engine) Cancel(id, by string) error {
	e.mu.Lock()
	lj := e.live[id]
	e.mu.Unlock()
	if lj == nil {
		return fmt.Errorf("job %s: %w", id, ErrNotRunning)
	}
	lj.mu.Lock()
	lj.cancelledBy = by
	lj.mu.Unlock()
	lj.cancel()
	e.audit(store.AuditEvent{Kind: "job_cancel", Operator: by, Result: "ok", Detail: "job " + id})
	return nil
}

// NodeRemoved ends the runs of the removed node nodeID that have not
// started (pending, or waiting for the node to come online) as skipped with
// store.NodeRemovedReason; the store's DeleteNode does the same to their
// records. A run already running is not touched: the node's tunnel closes
// with the removal and the run fails. It returns how many runs it ended.
func (e *Engine) NodeRemoved(nodeID string) int {
	e.mu.Lock()
	live := make([]*liveJob, 0, len(e.live))
	for _, lj := range e.live {
		live = append(live, lj)
	}
	e.mu.Unlock()
	n := 0
	for _, lj := range live {
		lj.mu.Lock()
		for _, r := range lj.runs {
			if r.NodeID == nodeID && !r.nodeGone && (r.State == store.RunPending || r.State == store.RunWaiting) {
				r.nodeGone = true
				close(r.removed)
				n++
			}
		}
		lj.mu.Unlock()
	}
	return n
}

// Wait blocks until the job is no longer running (or ctx ends) and returns
// its stored record.
func (e *Engine) Wait(ctx context.Context, id string) (store.Job, error) {
	e.mu.Lock()
	lj := e.live[id]
	e.mu.Unlock()
	if lj != nil {
		select {
		case <-lj.done:
		case <-ctx.Done():
			return store.Job{}, ctx.Err()
		}
	}
	return e.cfg.Store.GetJob(ctx, id)
}

// Running reports whether the job is live in this engine.
func (e *Engine) Running(id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.live[id] != nil
}

// Event is one item of a job's live stream.
type Event struct {
	Type     string     `json:"type"` // node (state change), output, job (final), error
	Node     string     `json:"node,omitempty"`
	State    string     `json:"state,omitempty"`
	ExitCode *int       `json:"exit_code,omitempty"`
	Error    string     `json:"error,omitempty"`
	Stream   string     `json:"stream,omitempty"` // stdout | stderr | hub (the hub's own notes)
	Data     []byte     `json:"data,omitempty"`
	Dropped  int64      `json:"dropped,omitempty"` // log bytes left out of a replayed log
	Job      *store.Job `json:"job,omitempty"`
}

// Subscription receives a live job's events. C is closed when the job
// ends; Lagged reports whether events were dropped because the reader was
// too slow (the log in the store is still complete up to its bounds).
type Subscription struct {
	C      <-chan Event
	c      chan Event
	lagged bool
	lj     *liveJob
	node   string
}

// Lagged reports whether events were dropped.
func (s *Subscription) Lagged() bool {
	s.lj.mu.Lock()
	defer s.lj.mu.Unlock()
	return s.lagged
}

// Close stops the subscription.
func (s *Subscription) Close() {
	s.lj.mu.Lock()
	defer s.lj.mu.Unlock()
	if _, ok := s.lj.subs[s]; ok {
		delete(s.lj.subs, s)
		close(s.c)
	}
}

// Subscribe follows a live job (only node's events if node is not ""). The
// first events replay each node's state and output so far, so nothing is
// missed between the snapshot and the live stream. It returns ErrNotRunning
// for a job that is not live; read its record from the store instead.
func (e *Engine) Subscribe(id, node string) (*Subscription, error) {
	e.mu.Lock()
	lj := e.live[id]
	e.mu.Unlock()
	if lj == nil {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotRunning)
	}
	lj.mu.Lock()
	defer lj.mu.Unlock()
	if lj.finished {
		return nil, fmt.Errorf("job %s: %w", id, ErrNotRunning)
	}
	if node != "" && lj.byName[node] == nil {
		return nil, fmt.Errorf("job %s has no node %q", id, node)
	}
	replay := 0
	for _, r := range lj.runs {
		if node == "" || r.Node == node {
			replay += 3
		}
	}
	c := make(chan Event, replay+subscriberBuffer)
	s := &Subscription{C: c, c: c, lj: lj, node: node}
	for _, r := range lj.runs {
		if node != "" && r.Node != node {
			continue
		}
		if r.log.total > 0 {
			// Dropped on the tail event says how much is missing before it.
			head, tail, dropped := r.log.snapshot()
			c <- Event{Type: "output", Node: r.Node, Stream: "log", Data: head}
			if len(tail) > 0 {
				c <- Event{Type: "output", Node: r.Node, Stream: "log", Data: tail, Dropped: dropped}
			}
		}
		c <- r.event()
	}
	if lj.subs == nil {
		lj.subs = map[*Subscription]struct{}{}
	}
	lj.subs[s] = struct{}{}
	return s, nil
}

const subscriberBuffer = 4096
