// Package cluster is the hub's cluster controller: it keeps each member
// node's desired and current state in the store and drives the node through
// the cluster-agent state machine (inactive → registering →
// install_in_progress → active → deregistering → uninstall_in_progress; see
// provisioners/cluster) with jobs — install and uninstall scripts run over
// SSH through the node's tunnel.
//
// A member is the node's ID, not its name: removing the node removes the
// membership, and a machine that joins later under the same name starts
// with none. Its HTTP endpoints (/v1/cluster; API in api.go) register on
// hub/api's route table.
package cluster

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/blobs"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/store"
	machine "github.com/tether-dev/tether/provisioners/cluster"
)

// Sentinel errors callers branch on (the API answers 400 and 409).
var (
	// ErrInvalid: the request cannot be met as asked (unknown engine,
	// revoked node).
	ErrInvalid = errors.New("cluster: invalid request")
	// ErrConflict: the request contradicts the member's current state.
	ErrConflict = errors.New("cluster: conflict")
)

// DefaultStateDir is where an agent keeps its state when it did not say.
const DefaultStateDir = "/var/lib/tether-edge"

// Config is what the controller works with.
type Config struct {
	Store store.Store
	// Jobs runs the install and uninstall jobs; nil until Attach.
	Jobs  *jobs.Engine
	Blobs *blobs.Store
	// EnginesDir is re-read at every install, so edits are picked up.
	EnginesDir string
	// Online reports "" when the node with this ID has a live tunnel, else
	// why not.
	Online func(nodeID string) string
	// StateDir is the agent's state directory of an online node ("" if
	// unknown), by node ID.
	StateDir func(nodeID string) string
	Metrics  *metrics.Metrics // may be nil
	Logger   *slog.Logger
	Audit    func(store.AuditEvent)
	// RetryAfter is how long a node whose install failed waits before the
	// controller tries again (a new `tether cluster register` retries at
	// once). Default 5 minutes.
	RetryAfter time.Duration
	// Recheck is how often an idle worker re-reads its member anyway (a
	// safety net for missed wake-ups). Default 30 s.
	Recheck time.Duration
}

// Controller drives cluster members. Run owns its workers.
type Controller struct {
	cfg     Config
	mu      sync.Mutex
	workers map[string]*worker // by node ID
	ctx     context.Context
	wg      sync.WaitGroup
	started chan struct{}
	// startedOnce closes started at the first Run.
	startedOnce sync.Once
	rescan      chan struct{}
}

type worker struct {
	wake    chan struct{}
	retryAt time.Time // guarded by Controller.mu
}

// New returns a controller; call Run to start it.
func New(cfg Config) *Controller {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.RetryAfter <= 0 {
		cfg.RetryAfter = 5 * time.Minute
	}
	if cfg.Recheck <= 0 {
		cfg.Recheck = 30 * time.Second
	}
	if cfg.Online == nil {
		cfg.Online = func(string) string { return "" }
	}
	if cfg.StateDir == nil {
		cfg.StateDir = func(string) string { return "" }
	}
	return &Controller{
		cfg:     cfg,
		workers: map[string]*worker{},
		started: make(chan struct{}),
		rescan:  make(chan struct{}, 1),
	}
}

// Attach gives the controller the job engine that runs its installs: a
// hub builds the engine in Run, after the controller. Call it before Run.
func (c *Controller) Attach(j *jobs.Engine) { c.cfg.Jobs = j }

// Run resumes every stored member (a node left mid-install by a hub crash
// finishes its install) and serves until ctx ends. On hub replicas only the
// leader runs it, once per term: members requested on another replica are
// picked up by Rescan (the change feed) or the next Recheck, and a term
// that ends leaves no worker behind for the next.
func (c *Controller) Run(ctx context.Context) error {
	members, err := c.cfg.Store.ListClusterMembers(ctx)
	if err != nil {
		return fmt.Errorf("cluster: %w", err)
	}
	c.mu.Lock()
	c.ctx = ctx
	c.workers = map[string]*worker{} // requests seen while not running start below
	for _, m := range members {
		c.startLocked(m.NodeID)
	}
	c.mu.Unlock()
	c.startedOnce.Do(func() { close(c.started) })
	c.refreshGauge(ctx)
	t := time.NewTicker(c.cfg.Recheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			c.wg.Wait()
			c.mu.Lock()
			c.ctx, c.workers = nil, map[string]*worker{}
			c.mu.Unlock()
			return nil
		case <-t.C:
		case <-c.rescan:
		}
		members, err := c.cfg.Store.ListClusterMembers(ctx)
		if err != nil {
			if ctx.Err() == nil {
				c.cfg.Logger.Warn("cluster members not re-read", "err", err)
			}
			continue
		}
		c.mu.Lock()
		for _, m := range members {
			c.startLocked(m.NodeID)
		}
		c.mu.Unlock()
	}
}

// Rescan makes Run look for members it does not drive yet now (one was
// registered on another hub replica).
func (c *Controller) Rescan() {
	select {
	case c.rescan <- struct{}{}:
	default:
	}
}

// startLocked starts the worker of the node with this ID if it has none;
// c.mu is held.
func (c *Controller) startLocked(nodeID string) *worker {
	if w := c.workers[nodeID]; w != nil {
		return w
	}
	w := &worker{wake: make(chan struct{}, 1)}
	c.workers[nodeID] = w
	if c.ctx != nil && c.ctx.Err() == nil {
		c.wg.Add(1)
		go c.work(c.ctx, nodeID, w)
	}
	return w
}

// Wake makes the worker of the node with this ID look at it now (the hub
// calls this when a node connects).
func (c *Controller) Wake(nodeID string) {
	c.mu.Lock()
	w := c.workers[nodeID]
	c.mu.Unlock()
	if w != nil {
		select {
		case w.wake <- struct{}{}:
		default:
		}
	}
}

// Engines implements api.Cluster.
func (c *Controller) Engines() ([]string, error) {
	cat, err := machine.LoadEngines(c.cfg.EnginesDir)
	if err != nil {
		return nil, err
	}
	return cat.Names(), nil
}

// Register implements api.Cluster: desired active with engine, for the node
// that holds this name now.
func (c *Controller) Register(ctx context.Context, node, engine, by string) (store.ClusterMember, error) {
	cat, err := machine.LoadEngines(c.cfg.EnginesDir)
	if err != nil {
		return store.ClusterMember{}, fmt.Errorf("%w: engines: %w", ErrInvalid, err)
	}
	if _, err := cat.Get(engine); err != nil {
		return store.ClusterMember{}, fmt.Errorf("%w: %w", ErrInvalid, err)
	}
	return c.request(ctx, node, machine.DesiredActive, engine, by)
}

// Deregister implements api.Cluster: desired inactive.
func (c *Controller) Deregister(ctx context.Context, node, by string) (store.ClusterMember, error) {
	return c.request(ctx, node, machine.DesiredInactive, "", by)
}

// request resolves the name to the node that holds it now; from there on
// the member is that node's ID.
func (c *Controller) request(
	ctx context.Context, name string, desired machine.Desired, engine, by string,
) (store.ClusterMember, error) {
	n, err := c.cfg.Store.GetNodeByName(ctx, name)
	if errors.Is(err, store.ErrNotFound) {
		err = store.ErrNotFound // the store's own wording is not for users
	}
	if err != nil {
		return store.ClusterMember{}, fmt.Errorf("node %q: %w", name, err)
	}
	node := n.Name
	if !n.RevokedAt.IsZero() {
		return store.ClusterMember{}, fmt.Errorf("%w: node %q is revoked", ErrInvalid, node)
	}
	// c.mu orders this hub's requests with its workers' bookkeeping; the
	// read-modify-write itself is one store transaction, which is what
	// orders requests made on other hub replicas and a KubeOne cluster
	// taking the node at the same moment.
	c.mu.Lock()
	defer c.mu.Unlock()
	var from, to machine.State
	m, err := c.cfg.Store.ChangeClusterMember(ctx, n.ID, func(m *store.ClusterMember, exists bool) error {
		switch {
		case !exists && desired == machine.DesiredInactive:
			return fmt.Errorf("node %q is not a cluster member: %w", node, store.ErrNotFound)
		case !exists:
			m.Engine, m.State = engine, string(machine.StateInactive)
		}
		cur, err := machine.ParseState(m.State)
		if err != nil {
			return err
		}
		if engine != "" && engine != m.Engine {
			if cur != machine.StateInactive {
				return fmt.Errorf("%w: node %q runs engine %s (state %s); deregister it before switching to %s",
					ErrConflict, node, m.Engine, m.State, engine)
			}
			m.Engine = engine
		}
		next, err := machine.Request(cur, desired)
		if err != nil {
			return err
		}
		now := time.Now().UTC()
		if next != cur {
			if err := machine.Transition(cur, next); err != nil {
				return err
			}
			m.LastTransition = now
		}
		from, to = cur, next
		m.Desired, m.State, m.UpdatedAt = string(desired), string(next), now
		return nil
	})
	if owner, ok := errors.AsType[*store.KubernetesOwnerError](err); ok {
		return store.ClusterMember{}, fmt.Errorf("%w: node %q is a member of KubeOne cluster %q: "+
			"one node runs one Kubernetes; remove it from that cluster first "+
			"(`tether kubeone members %s ...` or `tether kubeone delete %s`): %w",
			ErrConflict, node, owner.KubeOneCluster, owner.KubeOneCluster, owner.KubeOneCluster, store.ErrKubernetesOwned)
	}
	if err != nil {
		return store.ClusterMember{}, err
	}
	if to != from {
		c.transitionMetrics(from, to)
	}
	kind := "cluster_register"
	if desired == machine.DesiredInactive {
		kind = "cluster_deregister"
	}
	detail := fmt.Sprintf("engine %s, state %s, node id %s", m.Engine, m.State, m.NodeID)
	if desired == machine.DesiredInactive && (to == machine.StateRegistering || to == machine.StateInstallInProgress) {
		detail += "; the install under way ends first, then the uninstall cached at its start runs"
	}
	c.audit(store.AuditEvent{Kind: kind, Operator: by, Node: node, Result: "ok", Detail: detail})
	w := c.startLocked(m.NodeID)
	w.retryAt = time.Time{} // an explicit request retries at once
	select {
	case w.wake <- struct{}{}:
	default:
	}
	c.refreshGaugeLocked(ctx)
	return m, nil
}

func (c *Controller) audit(e store.AuditEvent) {
	if c.cfg.Audit != nil {
		e.At = time.Now()
		c.cfg.Audit(e)
	}
}

func (c *Controller) transitionMetrics(from, to machine.State) {
	if c.cfg.Metrics != nil {
		c.cfg.Metrics.ClusterTransition.WithLabelValues(string(from), string(to)).Inc()
	}
}

func (c *Controller) refreshGauge(ctx context.Context) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.refreshGaugeLocked(ctx)
}

func (c *Controller) refreshGaugeLocked(ctx context.Context) {
	if c.cfg.Metrics == nil {
		return
	}
	members, err := c.cfg.Store.ListClusterMembers(ctx)
	if err != nil {
		return
	}
	counts := map[string]float64{}
	for _, s := range machine.States() {
		counts[string(s)] = 0
	}
	for _, m := range members {
		counts[m.State]++
	}
	for s, n := range counts {
		c.cfg.Metrics.ClusterMembers.WithLabelValues(s).Set(n)
	}
}

// work is one member's reconcile loop. It ends with ctx, or when the member
// is gone (its node was removed).
func (c *Controller) work(ctx context.Context, nodeID string, w *worker) {
	defer c.wg.Done()
	log := c.cfg.Logger.With("node_id", nodeID)
	for {
		wait, gone := c.reconcile(ctx, nodeID, w, log)
		if gone && c.retireLocked(ctx, nodeID, w) {
			return
		}
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-w.wake:
		case <-t.C:
		}
		t.Stop()
	}
}

// retireLocked removes w if its member is still gone, under c.mu so that a
// register request (which holds c.mu from reading the member to starting
// its worker) either sees w gone or w sees the new member. It reports
// whether w should stop.
func (c *Controller) retireLocked(ctx context.Context, nodeID string, w *worker) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, err := c.cfg.Store.GetClusterMember(ctx, nodeID); !errors.Is(err, store.ErrNotFound) {
		return false
	}
	if c.workers[nodeID] == w {
		delete(c.workers, nodeID)
	}
	return true
}

// reconcile runs steps until the member converges, must wait (offline
// node, retry after a failed install) or fails; it returns how long to
// sleep at most before looking again, and whether the member is gone.
func (c *Controller) reconcile(ctx context.Context, nodeID string, w *worker, log *slog.Logger) (time.Duration, bool) {
	d := c.reconcileSteps(ctx, nodeID, w, log)
	if ctx.Err() != nil {
		return 0, false
	}
	_, err := c.cfg.Store.GetClusterMember(ctx, nodeID)
	return d, errors.Is(err, store.ErrNotFound)
}

func (c *Controller) reconcileSteps(ctx context.Context, nodeID string, w *worker, log *slog.Logger) time.Duration {
	for range machine.MaxSteps + 1 {
		if ctx.Err() != nil {
			return 0
		}
		m, err := c.cfg.Store.GetClusterMember(ctx, nodeID)
		if err != nil {
			if !errors.Is(err, store.ErrNotFound) {
				log.Error("cluster: read member", "err", err)
			}
			return c.cfg.Recheck
		}
		log := log.With("node", m.Node)
		cur, err1 := machine.ParseState(m.State)
		desired, err2 := machine.ParseDesired(m.Desired)
		if err := errors.Join(err1, err2); err != nil {
			log.Error("cluster: stored member is invalid; fix or re-register it", "err", err)
			return c.cfg.Recheck
		}
		step, err := machine.Decide(cur, desired)
		if err != nil || step.Done() {
			return c.cfg.Recheck
		}
		c.mu.Lock()
		retryAt := w.retryAt
		c.mu.Unlock()
		if step.Action == machine.ActionRegister && time.Now().Before(retryAt) {
			return time.Until(retryAt)
		}
		if step.Action == machine.ActionInstall || step.Action == machine.ActionUninstall {
			if reason := c.cfg.Online(nodeID); reason != "" {
				log.Info("cluster: waiting for the node to come online", "state", cur, "reason", reason)
				return c.cfg.Recheck
			}
		}
		cached := m.EngineDigest != "" // an install ran and cached its uninstall script
		actErr := c.act(ctx, &m, step.Action, log)
		if ctx.Err() != nil {
			return 0 // hub stopping: the state stays, the step resumes at restart
		}
		step = c.redecide(ctx, step, nodeID)
		outcome := machine.OutcomeOf(actErr)
		path := step.Path(outcome)
		now := time.Now().UTC()
		m.UpdatedAt = now
		m.LastError = ""
		if actErr != nil {
			m.LastError = actErr.Error()
		}
		if len(path) == 0 {
			err := c.cfg.Store.AdvanceClusterMember(ctx, m, string(cur))
			if errors.Is(err, store.ErrMemberMoved) {
				continue // a request moved it (a deregister): decide again
			}
			if err != nil {
				log.Error("cluster: record error", "err", err)
			}
			c.mu.Lock()
			w.retryAt = now.Add(c.cfg.RetryAfter)
			c.mu.Unlock()
			return c.cfg.RetryAfter
		}
		edges := make([][2]machine.State, 0, len(path))
		prev := cur
		for _, next := range path {
			edges = append(edges, [2]machine.State{prev, next})
			prev = next
		}
		if err := c.checkPath(edges); err != nil {
			log.Error("cluster: refused transition", "err", err)
			return c.cfg.Recheck
		}
		next := path[len(path)-1]
		m.State, m.LastTransition = string(next), now
		if next == machine.StateInactive && step.Action == machine.ActionUninstall && actErr == nil {
			m.EngineDigest = "" // the uninstall removed the engine and its cached script
		}
		if err := c.cfg.Store.AdvanceClusterMember(ctx, m, string(cur)); err != nil {
			if errors.Is(err, store.ErrMemberMoved) {
				// A request moved the member while the step ran (a deregister on
				// an inactive node): decide again from what it stored.
				log.Info("cluster: member changed during the step; deciding again", "from", cur, "err", err)
				continue
			}
			log.Error("cluster: persist transition; will retry", "from", cur, "to", next, "err", err)
			return c.cfg.Recheck
		}
		c.refreshGauge(ctx)
		result := "ok"
		if actErr != nil {
			result = "failed"
		}
		for _, e := range edges {
			c.transitionMetrics(e[0], e[1])
			reason := step.Reason(e[0], e[1], outcome, cached)
			detail := fmt.Sprintf("%s -> %s: %s", e[0], e[1], reason)
			if m.LastError != "" {
				detail += "; error: " + m.LastError
			}
			c.audit(store.AuditEvent{Kind: "cluster_transition", Node: m.Node, Result: result, Detail: detail})
			log.Info("cluster transition", "from", e[0], "to", e[1], "reason", reason, "err", actErr)
		}
		if actErr != nil && step.Action == machine.ActionInstall {
			c.mu.Lock()
			w.retryAt = now.Add(c.cfg.RetryAfter)
			c.mu.Unlock()
		}
	}
	return c.cfg.Recheck
}

// redecide is step as the member's desired state now decides it: a
// deregister that arrived while the step's action ran (an install takes
// minutes) changes where the step goes when it ends. The action already
// ran, so a decision for another action keeps step.
func (c *Controller) redecide(ctx context.Context, step machine.Step, nodeID string) machine.Step {
	m, err := c.cfg.Store.GetClusterMember(ctx, nodeID)
	if err != nil || m.State != string(step.From) {
		return step
	}
	desired, err := machine.ParseDesired(m.Desired)
	if err != nil {
		return step
	}
	if now, err := machine.Decide(step.From, desired); err == nil && now.Action == step.Action {
		return now
	}
	return step
}

// checkPath checks that every edge of a step's path is one of the state
// machine's.
func (c *Controller) checkPath(edges [][2]machine.State) error {
	for _, e := range edges {
		if err := machine.Transition(e[0], e[1]); err != nil {
			return err
		}
	}
	return nil
}

// cachePath is where the node keeps the engine's uninstall script.
func (c *Controller) cachePath(nodeID, engine string) string {
	dir := c.cfg.StateDir(nodeID)
	if dir == "" {
		dir = DefaultStateDir
	}
	return path.Join(dir, "cluster", engine, "uninstall.sh")
}

// act runs a step's action; m's LastJob and EngineDigest are updated.
func (c *Controller) act(ctx context.Context, m *store.ClusterMember, action machine.Action, log *slog.Logger) error {
	switch action {
	case machine.ActionNone:
		return nil
	case machine.ActionRegister:
		cat, err := machine.LoadEngines(c.cfg.EnginesDir)
		if err != nil {
			return err
		}
		_, err = cat.Get(m.Engine)
		return err
	case machine.ActionInstall:
		cat, err := machine.LoadEngines(c.cfg.EnginesDir)
		if err != nil {
			return err
		}
		e, err := cat.Get(m.Engine)
		if err != nil {
			return err
		}
		uninstall, err := c.cfg.Blobs.PutBytes(e.Uninstall)
		if err != nil {
			return err
		}
		// The engine's environment is cached beside the script, so the
		// uninstall runs as installed even if engine.yaml changes later.
		envFile, err := c.cfg.Blobs.PutBytes(envExports(e.Env))
		if err != nil {
			return err
		}
		cache := c.cachePath(m.NodeID, e.Name)
		spec := store.JobSpec{
			Script: string(e.Install), ScriptName: e.Name + "/install.sh", Env: e.Env,
			Uploads: []store.Upload{
				{Name: e.Name + "/uninstall.sh", SHA256: uninstall, Size: int64(len(e.Uninstall)), Dest: cache,
					Mode: 0o700, Mkdir: true},
				{Name: e.Name + "/uninstall.env", SHA256: envFile, Size: int64(len(envExports(e.Env))),
					Dest: cache + ".env", Mode: 0o600, Mkdir: true},
			},
			TimeoutSeconds: int(e.Timeout / time.Second), Parallel: 1,
			Cluster: &store.ClusterStep{Action: "install", Engine: e.Name, EngineDigest: e.Digest, CachePath: cache},
		}
		m.EngineDigest = e.Digest
		return c.runJob(ctx, m, "cluster_install", spec)
	case machine.ActionUninstall:
		cache := c.cachePath(m.NodeID, m.Engine)
		q, qe := shellQuote(cache), shellQuote(cache+".env")
		spec := store.JobSpec{
			// The cached script is the one installed with (run by its #!
			// line, with the cached environment); the catalog's copy is only
			// a fallback for nodes that never cached one. Success removes
			// the cache; a failure keeps it for the next try.
			Command: fmt.Sprintf("test -f %s || { echo 'no cached uninstall script at '%s >&2; exit 1; }; "+
				"if [ -f %s ]; then . %s; fi; %s && rm -f %s %s",
				q, q, qe, qe, q, q, qe),
			TimeoutSeconds: int(30 * time.Minute / time.Second), Parallel: 1,
			Cluster: &store.ClusterStep{Action: "uninstall", Engine: m.Engine, CachePath: cache},
		}
		if cat, err := machine.LoadEngines(c.cfg.EnginesDir); err == nil {
			if e, err := cat.Get(m.Engine); err == nil {
				d, err := c.cfg.Blobs.PutBytes(e.Uninstall)
				if err != nil {
					return err
				}
				spec.Uploads = []store.Upload{{Name: e.Name + "/uninstall.sh", SHA256: d, Size: int64(len(e.Uninstall)),
					Dest: cache, Mode: 0o700, Mkdir: true, IfMissing: true}}
				spec.TimeoutSeconds = int(e.Timeout / time.Second)
			} else {
				log.Warn("cluster: engine unknown now; only a cached uninstall script can run", "engine", m.Engine)
			}
		}
		return c.runJob(ctx, m, "cluster_uninstall", spec)
	}
	return fmt.Errorf("cluster: unknown action %q", action)
}

func (c *Controller) runJob(ctx context.Context, m *store.ClusterMember, kind string, spec store.JobSpec) error {
	if err := jobs.Validate(&spec, c.cfg.Blobs); err != nil {
		return err
	}
	j, err := c.cfg.Jobs.Start(
		ctx, store.Job{Kind: kind, Spec: spec, CreatedBy: "cluster"}, []store.NodeRef{{ID: m.NodeID, Name: m.Node}},
	)
	if err != nil {
		return err
	}
	m.LastJob = j.ID
	// Record the job before waiting, so `tether cluster status` points at
	// the running install. The job runs whether or not this is recorded:
	// the step's end records it again.
	if err := c.cfg.Store.AdvanceClusterMember(ctx, *m, m.State); err != nil {
		c.cfg.Logger.Warn("cluster: record the running job", "node", m.Node, "job", j.ID, "err", err)
	}
	done, err := c.cfg.Jobs.Wait(ctx, j.ID)
	if err != nil {
		return err
	}
	if done.State == store.JobSucceeded {
		return nil
	}
	if n, err := c.cfg.Store.GetJobNode(ctx, j.ID, m.Node); err == nil && n.Error != "" {
		return fmt.Errorf(
			"%s job %s: %s (see `tether jobs logs %s`)",
			strings.TrimPrefix(kind, "cluster_"), j.ID, n.Error, j.ID,
		)
	}
	return fmt.Errorf("%s job %s %s: %s", strings.TrimPrefix(kind, "cluster_"), j.ID, done.State, done.Error)
}

// envExports renders env as a sourceable shell file, sorted for a stable
// digest.
func envExports(env map[string]string) []byte {
	var b strings.Builder
	b.WriteString("# engine environment cached by tether at install\n")
	for _, k := range slices.Sorted(maps.Keys(env)) {
		fmt.Fprintf(&b, "export %s=%s\n", k, shellQuote(env[k]))
	}
	return []byte(b.String())
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }
