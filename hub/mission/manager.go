package mission

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// JobKind is the job kind of mission runs: the engine hands each node's run
// to the mission manager (jobs.Local), which records it before it starts.
const JobKind = "mission"

// Env names a mission run and a state check see, besides TETHER_NODE.
const (
	EnvMission    = "TETHER_MISSION"
	EnvOrigin     = "TETHER_MISSION_ORIGIN"
	EnvGeneration = "TETHER_MISSION_GENERATION"
)

// InterruptedReason is the error of a node whose run was live when its hub
// stopped.
const InterruptedReason = "interrupted: the hub stopped while this node's run was live; " +
	"it is not run again for this generation (it may have run in part); " +
	"the state check shows whether the node is as it should be, and a changed spec runs the next generation"

// Store is what the manager keeps and reads.
type Store interface {
	store.MissionStore
	ListDesired(ctx context.Context, kind string) ([]store.DesiredRecord, error)
	ListNodes(ctx context.Context) ([]store.Node, error)
	GetNode(ctx context.Context, id string) (store.Node, error)
	GetJob(ctx context.Context, id string) (store.Job, error)
}

// Jobs is the job engine (hub/jobs.Engine).
type Jobs interface {
	Start(ctx context.Context, j store.Job, nodes []store.NodeRef) (store.Job, error)
	Wait(ctx context.Context, id string) (store.Job, error)
}

// SiteView is one child site as the mission manager reads it: its last
// status and whether it is live.
type SiteView struct {
	Name          string
	Connected     bool
	Stale         bool
	StaleFor      time.Duration
	LastHeartbeat time.Time
	// Status is its last status (nil before the first): its Missions
	// (a Report) and, nested, its sub-sites' statuses.
	Status *siteproto.Status
}

// Config is what a Manager works with.
type Config struct {
	Store Store
	// HubID is this hub's ID.
	HubID string
	// Where returns this hub's path relative to a mission's origin ("" at
	// the origin) and false when the origin is neither this hub nor one
	// above it. nil: only missions created here are placed here.
	Where func(origin string) (rel string, ok bool)
	// Jobs runs the missions' node runs (kind JobKind, whose runs call
	// Local().Run); set before Run, or with AttachJobs.
	Jobs Jobs
	// Connect opens an SSH connection to a node (the job engine's
	// connector): state checks use it, and so do the runs.
	Connect jobs.Connector
	// Online reports "" when the node with this ID has a live tunnel.
	Online func(nodeID string) string
	// Sites lists this hub's child sites (nil: none).
	Sites  func() []SiteView
	Logger *slog.Logger
	// Audit records mission decisions; may be nil.
	Audit func(store.AuditEvent)
	// ReconcileInterval is how often placement is re-evaluated (nodes
	// join, labels change; default 5 s); a change of a mission does it at
	// once.
	ReconcileInterval time.Duration
	// CheckTick is how often due state checks are looked for (default 2 s).
	CheckTick time.Duration
	// MaxChecks bounds the state checks running at once (default 16).
	MaxChecks int
	Now       func() time.Time
}

// Manager places and runs the missions this hub holds on its own nodes.
type Manager struct {
	cfg   Config
	kick  chan struct{}
	check chan struct{}
	wg    sync.WaitGroup // job waiters and state checks

	mu       sync.Mutex // guards the following fields
	jobs     Jobs
	inflight map[nodeKey]int64 // node runs handed to the engine, by generation
	checking map[nodeKey]bool
	observed map[missionKey]int64
	// retryAt holds nodes whose run could not reach them: they are not
	// started again before then.
	retryAt map[nodeKey]time.Time
}

type missionKey struct{ origin, name string }

type nodeKey struct {
	missionKey
	nodeID string
}

// New returns a manager; Run drives it.
func New(cfg Config) (*Manager, error) {
	switch {
	case cfg.Store == nil:
		return nil, errors.New("mission: Config.Store is required")
	case cfg.HubID == "":
		return nil, errors.New("mission: Config.HubID is required")
	case cfg.Connect == nil:
		return nil, errors.New("mission: Config.Connect is required")
	}
	if cfg.Where == nil {
		self := cfg.HubID
		cfg.Where = func(origin string) (string, bool) { return "", origin == self }
	}
	if cfg.Online == nil {
		cfg.Online = func(string) string { return "" }
	}
	if cfg.Sites == nil {
		cfg.Sites = func() []SiteView { return nil }
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.ReconcileInterval <= 0 {
		cfg.ReconcileInterval = defaultReconcileEvery
	}
	if cfg.CheckTick <= 0 {
		cfg.CheckTick = 2 * time.Second
	}
	if cfg.MaxChecks <= 0 {
		cfg.MaxChecks = 16
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Manager{
		cfg:      cfg,
		jobs:     cfg.Jobs,
		kick:     make(chan struct{}, 1),
		check:    make(chan struct{}, 1),
		inflight: map[nodeKey]int64{},
		checking: map[nodeKey]bool{},
		observed: map[missionKey]int64{},
		retryAt:  map[nodeKey]time.Time{},
	}, nil
}

// AttachJobs sets the job engine (it is built after the manager, whose
// Local it runs).
func (m *Manager) AttachJobs(j Jobs) {
	m.mu.Lock()
	m.jobs = j
	m.mu.Unlock()
}

// Apply is the mission kind's desired.Kind.Apply: a new generation or a
// tombstone was stored here.
func (m *Manager) Apply(_ context.Context, o siteproto.DesiredObject) {
	m.cfg.Logger.Info("mission changed", "mission", o.Name, "origin", short(o.Origin), "generation", o.Generation,
		"deleted", o.Deleted)
	m.Kick()
}

// Kick re-evaluates placement at once.
func (m *Manager) Kick() {
	select {
	case m.kick <- struct{}{}:
	default:
	}
}

// Recover marks the node runs a previous hub process left running as
// failed (InterruptedReason); call it once at start, after the job
// engine's own Recover and before Run. Reconcile does the same for runs
// whose job ended without recording them (a replica that died).
func (m *Manager) Recover(ctx context.Context) (int, error) {
	recs, err := m.cfg.Store.ListMissionNodes(ctx, "", "")
	if err != nil {
		return 0, err
	}
	n, err := m.sweepInterrupted(ctx, recs)
	if n > 0 {
		m.cfg.Logger.Warn("mission runs interrupted by a hub stop; not run again", "nodes", n)
	}
	return n, err
}

// sweepInterrupted marks failed the records left running whose run is
// not live: not handed to the engine by this process, and its job not
// running (at start, the engine has marked its previous jobs interrupted;
// a job running on another replica is left alone).
func (m *Manager) sweepInterrupted(ctx context.Context, recs []store.MissionNode) (int, error) {
	n := 0
	for _, r := range recs {
		if r.Phase != store.MissionRunning {
			continue
		}
		m.mu.Lock()
		_, live := m.inflight[nodeKey{missionKey{r.Origin, r.Mission}, r.NodeID}]
		m.mu.Unlock()
		if live {
			continue
		}
		if r.JobID != "" {
			j, err := m.cfg.Store.GetJob(ctx, r.JobID)
			if err != nil && !errors.Is(err, store.ErrNotFound) {
				return n, err
			}
			if err == nil && j.State == store.JobRunning {
				continue
			}
		}
		ok, err := m.cfg.Store.FinishMissionNode(ctx, r.Origin, r.Mission, r.NodeID, r.Generation, store.MissionFailed,
			InterruptedReason, m.cfg.Now())
		if err != nil {
			return n, err
		}
		if ok {
			n++
			m.audit(store.AuditEvent{Kind: "mission_node", Node: r.Node, Result: "interrupted",
				Detail: fmt.Sprintf("mission %s generation %d: %s", r.Mission, r.Generation, InterruptedReason)})
		}
	}
	return n, nil
}

// Run places missions and runs state checks until ctx ends, then waits for
// the goroutines it started.
func (m *Manager) Run(ctx context.Context) {
	defer m.wg.Wait()
	rt := time.NewTicker(m.cfg.ReconcileInterval)
	defer rt.Stop()
	ct := time.NewTicker(m.cfg.CheckTick)
	defer ct.Stop()
	m.reconcileLogged(ctx)
	for {
		select {
		case <-ctx.Done():
			return
		case <-m.kick:
			m.reconcileLogged(ctx)
		case <-rt.C:
			m.reconcileLogged(ctx)
		case <-m.check:
			m.runChecks(ctx)
		case <-ct.C:
			m.runChecks(ctx)
		}
	}
}

func (m *Manager) reconcileLogged(ctx context.Context) {
	if err := m.Reconcile(ctx); err != nil && ctx.Err() == nil {
		m.cfg.Logger.Error("place missions; tried again shortly", "err", err)
	}
}

// Reconcile plans every mission's current generation on the matching
// nodes of this hub, drops the records a newer generation no longer
// places, and starts the runs of online pending nodes.
func (m *Manager) Reconcile(ctx context.Context) error {
	objs, err := m.cfg.Store.ListDesired(ctx, Kind)
	if err != nil {
		return err
	}
	recs, err := m.cfg.Store.ListMissionNodes(ctx, "", "")
	if err != nil {
		return err
	}
	if _, err := m.sweepInterrupted(ctx, recs); err != nil {
		return err
	}
	byMission := map[missionKey]map[string]store.MissionNode{}
	for _, r := range recs {
		k := missionKey{r.Origin, r.Mission}
		if byMission[k] == nil {
			byMission[k] = map[string]store.MissionNode{}
		}
		byMission[k][r.NodeID] = r
	}
	live := map[missionKey]bool{}
	var nodes []store.Node
	for _, o := range objs {
		k := missionKey{o.Origin, o.Name}
		have := byMission[k]
		if o.Deleted {
			if len(have) > 0 {
				if err := m.cfg.Store.DeleteMissionNodes(ctx, o.Origin, o.Name, ""); err != nil {
					return err
				}
			}
			continue
		}
		spec, err := ParseSpec(o.Spec)
		if err != nil {
			m.cfg.Logger.Error("mission spec unreadable here; not placed", "mission", o.Name, "origin", short(o.Origin), "err",
				err)
			continue
		}
		live[k] = true
		if nodes == nil {
			// Read only when a mission is to be placed: this runs every
			// few seconds, and a hub without missions (most) would
			// otherwise decode every node row each time, the largest
			// cost of an idle hub with 10k nodes.
			if nodes, err = m.cfg.Store.ListNodes(ctx); err != nil {
				return err
			}
		}
		if err := m.place(ctx, o, spec, nodes, have); err != nil {
			return err
		}
	}
	m.mu.Lock()
	for k := range m.observed {
		if !live[k] {
			delete(m.observed, k)
		}
	}
	m.mu.Unlock()
	return nil
}

func (m *Manager) place(
	ctx context.Context, o store.DesiredRecord, spec Spec, nodes []store.Node, have map[string]store.MissionNode,
) error {
	k := missionKey{o.Origin, o.Name}
	rel, ok := m.cfg.Where(o.Origin)
	placed := ok && spec.Placement.PlacesHub(rel)
	now := m.cfg.Now()
	matching := map[string]store.Node{}
	if placed {
		for _, n := range nodes {
			if n.RevokedAt.IsZero() && spec.Placement.MatchesNode(rel, n.Labels) {
				matching[n.ID] = n
			}
		}
	}
	for id, r := range have {
		if _, ok := matching[id]; !ok && r.Generation < o.Generation {
			// The newer generation does not place this node (or the node
			// is gone): its record goes; a node the current generation
			// placed keeps its record even if its labels change.
			if err := m.cfg.Store.DeleteMissionNodes(ctx, o.Origin, o.Name, id); err != nil {
				return err
			}
			delete(have, id)
		}
	}
	var pending []store.NodeRef
	for id, n := range matching {
		r, ok := have[id]
		if !ok || r.Generation < o.Generation {
			if _, err := m.cfg.Store.PlanMissionNode(ctx, store.MissionNode{
				Origin: o.Origin, Mission: o.Name, NodeID: id, Node: n.Name, Generation: o.Generation, UpdatedAt: now,
			}); err != nil {
				return err
			}
			r = store.MissionNode{Generation: o.Generation, Phase: store.MissionPending}
		}
		if r.Phase == store.MissionPending && r.Generation == o.Generation && m.cfg.Online(id) == "" {
			pending = append(pending, store.NodeRef{ID: id, Name: n.Name})
		}
	}
	m.mu.Lock()
	m.observed[k] = o.Generation
	todo := pending[:0]
	for _, ref := range pending {
		nk := nodeKey{k, ref.ID}
		if g, ok := m.inflight[nk]; ok && g >= o.Generation {
			continue
		}
		if at, ok := m.retryAt[nk]; ok {
			if now.Before(at) {
				continue
			}
			delete(m.retryAt, nk)
		}
		m.inflight[nk] = o.Generation
		todo = append(todo, ref)
	}
	engine := m.jobs
	m.mu.Unlock()
	if len(todo) == 0 {
		return nil
	}
	if engine == nil {
		m.release(k, todo, o.Generation)
		return errors.New("mission: no job engine attached")
	}
	job := store.Job{Kind: JobKind, CreatedBy: "mission:" + o.Name, Spec: store.JobSpec{
		Script: spec.Script, ScriptName: fmt.Sprintf("mission %s generation %d", o.Name, o.Generation),
		Env: map[string]string{
			EnvMission:    o.Name,
			EnvOrigin:     o.Origin,
			EnvGeneration: strconv.FormatInt(o.Generation, 10),
		},
		Parallel: jobs.DefaultParallel, TimeoutSeconds: int(spec.Timeout() / time.Second),
		Selector: describePlacement(spec.Placement),
	}}
	started, err := engine.Start(ctx, job, todo)
	if err != nil {
		m.release(k, todo, o.Generation)
		return fmt.Errorf("mission %s: start runs on %d nodes: %w", o.Name, len(todo), err)
	}
	m.cfg.Logger.Info("mission runs started", "mission", o.Name, "generation", o.Generation, "nodes", len(todo), "job",
		started.ID)
	m.wg.Add(1)
	go func() {
		defer m.wg.Done()
		// The job's end frees its nodes: one skipped because it went
		// offline is still pending and is started again when it is back.
		_, _ = engine.Wait(ctx, started.ID)
		m.release(k, todo, o.Generation)
		m.Kick()
	}()
	return nil
}

func (m *Manager) release(k missionKey, refs []store.NodeRef, gen int64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, ref := range refs {
		nk := nodeKey{k, ref.ID}
		if m.inflight[nk] == gen {
			delete(m.inflight, nk)
		}
	}
}

func describePlacement(p Placement) string {
	var parts []string
	if len(p.Sites) > 0 {
		parts = append(parts, "sites="+strings.Join(p.Sites, ","))
	}
	if len(p.MatchLabels) > 0 {
		var l []string
		for _, k := range sortedKeys(p.MatchLabels) {
			l = append(l, k+"="+p.MatchLabels[k])
		}
		parts = append(parts, strings.Join(l, ","))
	}
	if len(parts) == 0 {
		return "*"
	}
	return strings.Join(parts, " ")
}

func sortedKeys(m map[string]string) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}

// Local is the job engine's side of mission runs (jobs.Local for JobKind).
func (m *Manager) Local() jobs.Local { return local{m} }

type local struct{ m *Manager }

// Ready implements jobs.Local: the node is online.
func (l local) Ready(_ store.Job, nodeID string) string { return l.m.cfg.Online(nodeID) }

// Run implements jobs.Local: it records the node's run as started (once
// per generation: a run already recorded does not start again), runs the
// script over SSH, and records how it ended.
func (l local) Run(ctx context.Context, job store.Job, nodeID string, stdout, stderr io.Writer) (int, error) {
	m := l.m
	name, origin := job.Spec.Env[EnvMission], job.Spec.Env[EnvOrigin]
	gen, err := strconv.ParseInt(job.Spec.Env[EnvGeneration], 10, 64)
	if err != nil || name == "" || origin == "" {
		return -1, fmt.Errorf("mission: job %s does not name its mission", job.ID)
	}
	started, err := m.cfg.Store.StartMissionNode(context.WithoutCancel(ctx), origin, name, nodeID, gen, job.ID,
		m.cfg.Now())
	if err != nil {
		return -1, err
	}
	if !started {
		fmt.Fprintf(stderr, "[tether] mission %s generation %d already ran (or runs) on this node; not run again\n", name,
			gen)
		return 0, nil
	}
	m.audit(store.AuditEvent{Kind: "mission_node", Node: nodeID, Operator: "mission:" + name, Result: "started",
		Detail: fmt.Sprintf("mission %s generation %d, job %s", name, gen, job.ID)})
	conn, err := m.cfg.Connect(ctx, nodeID)
	if err != nil {
		// Nothing ran: the node goes back to pending and is tried again
		// after a pause.
		m.finish(origin, name, nodeID, gen, store.MissionPending, "could not reach the node: "+err.Error())
		m.mu.Lock()
		m.retryAt[nodeKey{missionKey{origin, name}, nodeID}] = m.cfg.Now().Add(retryUnreachable)
		m.mu.Unlock()
		return -1, fmt.Errorf("connect: %w", err)
	}
	defer conn.Close()
	env := maps.Clone(job.Spec.Env)
	env["TETHER_NODE"], env["TETHER_JOB"] = m.nodeName(ctx, nodeID), job.ID
	code, err := conn.Run(ctx, jobs.Command{Script: []byte(job.Spec.Script), Env: env}, stdout, stderr)
	switch {
	case err != nil && ctx.Err() != nil:
		m.finish(origin, name, nodeID, gen, store.MissionFailed, InterruptedReason)
	case err != nil:
		m.finish(origin, name, nodeID, gen, store.MissionFailed, err.Error())
	case code != 0:
		m.finish(origin, name, nodeID, gen, store.MissionFailed, fmt.Sprintf("exit status %d", code))
	default:
		m.finish(origin, name, nodeID, gen, store.MissionApplied, "")
	}
	select {
	case m.check <- struct{}{}:
	default:
	}
	return code, err
}

// nodeName is the node's name for the script's TETHER_NODE (its ID if the
// node is gone).
func (m *Manager) nodeName(ctx context.Context, nodeID string) string {
	if n, err := m.cfg.Store.GetNode(ctx, nodeID); err == nil {
		return n.Name
	}
	return nodeID
}

func (m *Manager) finish(origin, name, nodeID string, gen int64, phase, msg string) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := m.cfg.Store.FinishMissionNode(ctx, origin, name, nodeID, gen, phase, msg, m.cfg.Now()); err != nil {
		m.cfg.Logger.Error("record mission run", "mission", name, "node", nodeID, "phase", phase, "err", err)
	}
	m.audit(store.AuditEvent{Kind: "mission_node", Node: nodeID, Operator: "mission:" + name, Result: phase,
		Detail: fmt.Sprintf("mission %s generation %d: %s", name, gen, msg)})
}

func (m *Manager) audit(ev store.AuditEvent) {
	if m.cfg.Audit != nil {
		ev.At = m.cfg.Now()
		m.cfg.Audit(ev)
	}
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// runChecks starts the state checks that are due: on nodes that ran the
// current generation (applied or failed), online, when the last check is
// older than the interval or than the run.
func (m *Manager) runChecks(ctx context.Context) {
	objs, err := m.cfg.Store.ListDesired(ctx, Kind)
	if err != nil {
		return
	}
	specs := map[missionKey]Spec{}
	for _, o := range objs {
		if o.Deleted {
			continue
		}
		if s, err := ParseSpec(o.Spec); err == nil && s.StateCheck != "" {
			specs[missionKey{o.Origin, o.Name}] = s
		}
	}
	if len(specs) == 0 {
		return
	}
	recs, err := m.cfg.Store.ListMissionNodes(ctx, "", "")
	if err != nil {
		return
	}
	now := m.cfg.Now()
	for _, r := range recs {
		k := missionKey{r.Origin, r.Mission}
		spec, ok := specs[k]
		if !ok || (r.Phase != store.MissionApplied && r.Phase != store.MissionFailed) {
			continue
		}
		due := r.CheckedAt.IsZero() || now.Sub(r.CheckedAt) >= spec.CheckInterval() || r.CheckedAt.Before(r.FinishedAt)
		if !due || m.cfg.Online(r.NodeID) != "" {
			continue
		}
		nk := nodeKey{k, r.NodeID}
		m.mu.Lock()
		busy := m.checking[nk] || len(m.checking) >= m.cfg.MaxChecks
		if !busy {
			m.checking[nk] = true
		}
		m.mu.Unlock()
		if busy {
			continue
		}
		m.wg.Add(1)
		go func(r store.MissionNode, spec Spec) {
			defer m.wg.Done()
			defer func() {
				m.mu.Lock()
				delete(m.checking, nk)
				m.mu.Unlock()
			}()
			m.stateCheck(ctx, r, spec)
		}(r, spec)
	}
}

// stateCheck runs the mission's state check on one node and records it.
func (m *Manager) stateCheck(ctx context.Context, r store.MissionNode, spec Spec) {
	timeout := min(spec.CheckInterval(), checkTimeoutCap)
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	out := &tailBuffer{max: maxCheckOutput}
	state := "failed"
	conn, err := m.cfg.Connect(cctx, r.NodeID)
	if err != nil {
		if ctx.Err() != nil {
			return
		}
		fmt.Fprintf(out, "connect: %v", err)
	} else {
		env := map[string]string{
			EnvMission:    r.Mission,
			EnvOrigin:     r.Origin,
			EnvGeneration: strconv.FormatInt(r.Generation, 10),
			"TETHER_NODE": r.Node,
		}
		code, err := conn.Run(cctx, jobs.Command{Script: []byte(spec.StateCheck), Env: env}, out, out)
		conn.Close()
		switch {
		case err != nil && ctx.Err() != nil:
			return // the hub is stopping: no result
		case err != nil:
			fmt.Fprintf(out, "\n[tether] state check did not complete: %v", err)
		case code == 0:
			state = "ok"
		default:
			fmt.Fprintf(out, "\n[tether] exit status %d", code)
		}
	}
	wctx, wcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	defer wcancel()
	if err := m.cfg.Store.SetMissionCheck(wctx, r.Origin, r.Mission, r.NodeID, state, strings.TrimSpace(out.String()),
		m.cfg.Now()); err != nil {
		m.cfg.Logger.Error("record state check", "mission", r.Mission, "node", r.Node, "err", err)
	}
}

// tailBuffer keeps the last max bytes written.
type tailBuffer struct {
	max int
	b   []byte
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.b = append(t.b, p...)
	if len(t.b) > t.max {
		t.b = append([]byte(nil), t.b[len(t.b)-t.max:]...)
	}
	return len(p), nil
}

func (t *tailBuffer) String() string { return strings.ToValidUTF8(string(t.b), "") }
