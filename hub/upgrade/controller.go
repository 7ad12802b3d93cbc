// Package upgrade is the hub's over-the-air upgrade controller: it pins an
// artifact by digest when an upgrade is created, fetches its blobs once,
// and rolls it out to the target nodes in batches (an optional canary
// first), bounded by --max-unavailable, halting when failures exceed the
// tolerance. Each node is driven through the per-node state machine of
// tunnel/upgradeproto (offer, push the files, apply) by jobs of the job engine,
// so the node's output is a job log with an exit code and a timeout; the
// node reports its own steps on the control stream afterwards (health
// check, rollback, a confirmation given on the node).
//
// Beside the controller: its HTTP endpoints (api.go), the node drive over
// SSH (drive.go) and the artifacts' source, registries (source.go).
//
// Everything the controller knows is in the store: a hub that restarts
// picks every running upgrade up where it was, and re-drives nodes whose
// drive the restart cut short (the node's own records make that safe).
package upgrade

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// JobKind is the kind of the jobs that drive nodes through an upgrade.
const JobKind = "upgrade"

// Sentinel errors callers branch on (the API answers 400, 404 and 409).
var (
	ErrInvalid  = errors.New("upgrade: invalid request")
	ErrConflict = errors.New("upgrade: conflict")
	// ErrConnLost (from a Driver): the connection to the node ended
	// during a drive.
	ErrConnLost = errors.New("upgrade: connection to the node lost")
)

// maxLost is how many drives of a node may lose their connection in a
// row before the node is failed.
const maxLost = 3

// Target is how the hub reaches one node's updater (Hello.Upgrade) and
// what it runs.
type Target struct {
	NodeID   string
	Name     string
	Exe      string // the agent executable the node announced
	StateDir string
	OS, Arch string
	Version  string // the agent version of the node's last hello
}

// Driver drives one node over SSH (provisioners/upgrade through the
// hub's runner): offer, push each file, apply.
type Driver interface {
	// Drive offers the upgrade, pushes files (reading them from the hub's
	// blob store) and applies it, confirmed by confirmedBy when not empty.
	// It returns the node's state after apply and the bytes pushed. The
	// node's output (a bundle's scripts) goes to log; offered is told the
	// node's answer to the offer. An error wrapping ErrConnLost means the
	// connection ended mid-way (an agent upgrade restarts the agent, and
	// an embedded SSH server with it): the node's record decides.
	Drive(
		ctx context.Context,
		t Target,
		offer upgradeproto.Offer,
		files []upgradeproto.File,
		confirmedBy string,
		log io.Writer,
		offered func(upgradeproto.NodeState),
	) (upgradeproto.NodeState, int64, error)
	// Status reads the node's record of the upgrade.
	Status(ctx context.Context, t Target, name string) (upgradeproto.NodeState, error)
}

// Jobs starts jobs (the hub's job engine).
type Jobs interface {
	Start(ctx context.Context, j store.Job, nodes []store.NodeRef) (store.Job, error)
	Wait(ctx context.Context, id string) (store.Job, error)
}

// Config is what the controller works with.
type Config struct {
	Store  store.Store
	Source Source
	Driver Driver
	// Target is how to reach the node with this ID; the reason is not
	// empty when it cannot be reached now (offline, an agent without the
	// updater).
	Target func(nodeID string) (Target, string)
	Audit  func(store.AuditEvent)
	Logger *slog.Logger
	// Tick is how often running upgrades are looked at. Default 1 s.
	Tick time.Duration
	// HealthMargin is added to an upgrade's health timeout before a node
	// silent in health_check is failed. Default 30 s.
	HealthMargin time.Duration
	// PollEvery is how often the record of a node installing with no
	// drive under way is read from the node (an install the node runs on
	// after the hub that started it stopped). Default 5 s.
	PollEvery time.Duration
	Now       func() time.Time
}

// Controller rolls upgrades out. Run owns its loop; the job engine owns
// the node drives (the controller is its Local for JobKind).
type Controller struct {
	cfg     Config
	metrics *Metrics
	wake    chan struct{}

	mu       sync.Mutex // guards the following, and every read-modify-write of a node record
	jobs     Jobs
	inflight map[string]bool      // upgrade "/" node ID: a drive is running
	jobOf    map[string]string    // upgrade "/" node ID: the job of that drive (only it ends it)
	polled   map[string]time.Time // upgrade "/" node ID: last status read (or one under way: zero)
	lost     map[string]int       // upgrade "/" node ID: drives in a row that lost the connection
	ctx      context.Context      // Run's: owner of the job waiters
	wg       sync.WaitGroup
}

// New returns a controller; call Attach and then Run.
func New(cfg Config) *Controller {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Tick <= 0 {
		cfg.Tick = time.Second
	}
	if cfg.HealthMargin <= 0 {
		cfg.HealthMargin = 30 * time.Second
	}
	if cfg.PollEvery <= 0 {
		cfg.PollEvery = 5 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Audit == nil {
		cfg.Audit = func(store.AuditEvent) {}
	}
	c := &Controller{
		cfg:      cfg,
		wake:     make(chan struct{}, 1),
		inflight: map[string]bool{},
		jobOf:    map[string]string{},
		polled:   map[string]time.Time{},
		lost:     map[string]int{},
	}
	c.metrics = newMetrics(c)
	return c
}

// Attach gives the controller the job engine that runs its drives (the
// engine is built with the controller as a Local kind, hence afterwards).
func (c *Controller) Attach(j Jobs) {
	c.mu.Lock()
	c.jobs = j
	c.mu.Unlock()
}

// Run reconciles every live upgrade until ctx ends.
func (c *Controller) Run(ctx context.Context) error {
	c.mu.Lock()
	c.ctx = ctx
	c.mu.Unlock()
	defer c.wg.Wait()
	t := time.NewTicker(c.cfg.Tick)
	defer t.Stop()
	for {
		c.reconcileAll(ctx)
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-c.wake:
		}
	}
}

// Wake makes the controller look now (a node connected, an operator acted).
func (c *Controller) Wake() {
	select {
	case c.wake <- struct{}{}:
	default:
	}
}

func (c *Controller) reconcileAll(ctx context.Context) {
	ups, err := c.cfg.Store.ListUpgrades(ctx)
	if err != nil {
		if ctx.Err() == nil {
			c.cfg.Logger.Warn("upgrades not reconciled", "err", err)
		}
		return
	}
	for _, u := range ups {
		if u.State != store.UpgradeRunning {
			continue
		}
		if err := c.reconcile(ctx, u); err != nil && ctx.Err() == nil {
			c.cfg.Logger.Warn("upgrade not reconciled", "upgrade", u.Name, "err", err)
		}
	}
}

func key(upgrade, nodeID string) string { return upgrade + "/" + nodeID }

// CreateRequest is a new upgrade; targets were resolved through the door.
type CreateRequest struct {
	Name      string
	Reference string
	Spec      store.UpgradeSpec
	Targets   []store.Node
	By        string
}

// Create resolves the artifact (a tag to its digest, once), checks the
// rollout's options and stores the upgrade with every target pending in
// its batch. Nothing is fetched or pushed yet.
func (c *Controller) Create(ctx context.Context, req CreateRequest) (store.Upgrade, error) {
	if !upgradeproto.ValidName(req.Name) {
		return store.Upgrade{}, fmt.Errorf(
			"%w: name %q: want a lowercase name of at most 63 characters (letters, digits, '-', '.')", ErrInvalid, req.Name)
	}
	if len(req.Targets) == 0 {
		return store.Upgrade{}, fmt.Errorf("%w: no target nodes", ErrInvalid)
	}
	s := &req.Spec
	if _, err := jobs.ParseMaxFailures(s.FailureTolerance); err != nil {
		return store.Upgrade{}, fmt.Errorf("%w: failure tolerance: %w", ErrInvalid, err)
	}
	batch, err := BatchSize(s.Batch, len(req.Targets))
	if err != nil {
		return store.Upgrade{}, err
	}
	if s.Canary < 0 || s.MaxUnavailable < 0 {
		return store.Upgrade{}, fmt.Errorf("%w: --canary and --max-unavailable must not be negative", ErrInvalid)
	}
	if s.HealthTimeoutSeconds == 0 {
		s.HealthTimeoutSeconds = int(upgradeproto.DefaultHealthTimeout / time.Second)
	}
	if s.HealthTimeoutSeconds < 1 || s.HealthTimeoutSeconds > 24*3600 {
		return store.Upgrade{}, fmt.Errorf("%w: health timeout %ds: want 1s..24h", ErrInvalid, s.HealthTimeoutSeconds)
	}
	if s.TimeoutSeconds == 0 {
		s.TimeoutSeconds = 30 * 60
	}
	if c.cfg.Source == nil {
		return store.Upgrade{}, fmt.Errorf("%w: this hub has no registry access configured", ErrInvalid)
	}
	a, err := c.cfg.Source.Resolve(ctx, req.Reference)
	if err != nil {
		return store.Upgrade{}, fmt.Errorf("%w: artifact %s: %w", ErrInvalid, req.Reference, err)
	}
	if !upgradeproto.ValidDigest(a.Digest) {
		return store.Upgrade{}, fmt.Errorf("%w: artifact %s resolved to no digest; an upgrade without a digest cannot exist",
			ErrInvalid, req.Reference)
	}
	if a.Kind == upgradeproto.KindAgent && !s.AllowDowngrade {
		var older []string
		for _, n := range req.Targets {
			if cmp, ok := compareVersions(n.AgentVersion, a.Version); ok && cmp > 0 {
				older = append(older, fmt.Sprintf("%s (%s)", n.Name, n.AgentVersion))
			}
		}
		if len(older) > 0 {
			return store.Upgrade{}, fmt.Errorf(
				"%w: version %s is older than what %s run: a downgrade; pass --allow-downgrade to go back", ErrInvalid, a.Version,
				strings.Join(older, ", "))
		}
	}
	pinned, err := marshalArtifact(a)
	if err != nil {
		return store.Upgrade{}, err
	}
	now := c.cfg.Now().UTC()
	u := store.Upgrade{Name: req.Name, Kind: a.Kind, Reference: req.Reference, Digest: a.Digest, Version: a.Version,
		Pinned: pinned, Spec: *s, State: store.UpgradeRunning, CreatedBy: req.By, CreatedAt: now, UpdatedAt: now}
	targets := slices.Clone(req.Targets)
	slices.SortFunc(targets, func(a, b store.Node) int { return strings.Compare(a.Name, b.Name) })
	nodes := make([]store.UpgradeNode, len(targets))
	for i, n := range targets {
		from := ""
		if a.Kind == upgradeproto.KindAgent {
			from = n.AgentVersion
		}
		nodes[i] = store.UpgradeNode{
			NodeID:      n.ID,
			Node:        n.Name,
			Batch:       batchOf(i, s.Canary, batch),
			Step:        upgradeproto.StepPending,
			FromVersion: from,
			History:     []upgradeproto.Transition{{Step: upgradeproto.StepPending, At: now}},
			UpdatedAt:   now,
		}
	}
	if err := c.cfg.Store.CreateUpgrade(ctx, u, nodes); err != nil {
		if errors.Is(err, store.ErrNameTaken) {
			return store.Upgrade{}, fmt.Errorf("%w: an upgrade named %q exists (see `tether upgrade list`)", ErrConflict,
				req.Name)
		}
		return store.Upgrade{}, err
	}
	c.cfg.Audit(store.AuditEvent{Kind: "upgrade_create", Operator: req.By, Result: "ok",
		Detail: fmt.Sprintf("upgrade %s: %s %s pinned at %s (%s), %d nodes, batch %q canary %d max-unavailable %d "+
			"failure-tolerance %q confirmation %t downgrade %t",
			u.Name, u.Kind, u.Version, u.Digest, u.Reference, len(nodes), s.Batch, s.Canary, s.MaxUnavailable,
			s.FailureTolerance, s.RequireConfirmation, s.AllowDowngrade)})
	c.cfg.Logger.Info("upgrade created", "upgrade", u.Name, "digest", u.Digest, "nodes", len(nodes), "by", req.By)
	c.Wake()
	return u, nil
}

// BatchSize parses --batch for n targets: "N" nodes or "P%" of them
// (at least one); "" is all at once.
func BatchSize(s string, n int) (int, error) {
	s = strings.TrimSpace(s)
	if s == "" {
		return max(n, 1), nil
	}
	if p, ok := strings.CutSuffix(s, "%"); ok {
		v, err := strconv.ParseFloat(p, 64)
		if err != nil || v <= 0 || v > 100 || math.IsNaN(v) {
			return 0, fmt.Errorf("%w: batch %q: want a count (e.g. 10) or a percentage 1%%..100%% (e.g. 10%%)", ErrInvalid, s)
		}
		return max(1, int(math.Ceil(v*float64(n)/100))), nil
	}
	v, err := strconv.Atoi(s)
	if err != nil || v < 1 {
		return 0, fmt.Errorf("%w: batch %q: want a count (e.g. 10) or a percentage (e.g. 10%%)", ErrInvalid, s)
	}
	return v, nil
}

// batchOf is the batch of the i-th target: the canary batch 0 holds the
// first canary targets, then batches of size each.
func batchOf(i, canary, size int) int {
	if canary > 0 {
		if i < canary {
			return 0
		}
		return 1 + (i-canary)/size
	}
	return i / size
}

// act changes a rollout's state on an operator's word (pause, resume,
// cancel), audited.
func (c *Controller) act(ctx context.Context, name, by, verb string, from []string, to string) (store.Upgrade, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, err := c.cfg.Store.GetUpgrade(ctx, name)
	if err != nil {
		return store.Upgrade{}, err
	}
	if !slices.Contains(from, u.State) {
		return u, fmt.Errorf("%w: upgrade %s is %s; %s needs it %s", ErrConflict, name, u.State, verb,
			strings.Join(from, " or "))
	}
	now := c.cfg.Now().UTC()
	reason := verb + " by " + by
	if to == store.UpgradeCancelled {
		if err := c.endWaitingLocked(ctx, u, upgradeproto.StepCancelled,
			"cancelled by "+by+" before the node was reached"); err != nil {
			return u, err
		}
	}
	if err := c.cfg.Store.SetUpgradeState(ctx, name, to, reason, now); err != nil {
		return u, err
	}
	c.cfg.Audit(store.AuditEvent{Kind: "upgrade_" + verb, Operator: by, Result: "ok", Detail: "upgrade " + name})
	u.State, u.Reason, u.UpdatedAt = to, reason, now
	c.Wake()
	return u, nil
}

// Pause stops starting nodes; drives under way finish.
func (c *Controller) Pause(ctx context.Context, name, by string) (store.Upgrade, error) {
	return c.act(ctx, name, by, "pause", []string{store.UpgradeRunning}, store.UpgradePaused)
}

// Resume continues a paused rollout.
func (c *Controller) Resume(ctx context.Context, name, by string) (store.Upgrade, error) {
	return c.act(ctx, name, by, "resume", []string{store.UpgradePaused}, store.UpgradeRunning)
}

// Cancel ends the rollout: nodes it has not reached (or that wait for a
// confirmation) are cancelled; drives under way finish.
func (c *Controller) Cancel(ctx context.Context, name, by string) (store.Upgrade, error) {
	return c.act(ctx, name, by, "cancel", []string{store.UpgradeRunning, store.UpgradePaused}, store.UpgradeCancelled)
}

// endWaitingLocked moves the nodes the rollout has not reached to step
// (cancelled), c.mu held.
func (c *Controller) endWaitingLocked(
	ctx context.Context, u store.Upgrade, step upgradeproto.Step, reason string,
) error {
	nodes, err := c.cfg.Store.ListUpgradeNodes(ctx, u.Name)
	if err != nil {
		return err
	}
	for _, n := range nodes {
		if c.inflight[key(u.Name, n.NodeID)] {
			continue
		}
		if n.Step == upgradeproto.StepPending ||
			(n.Step == upgradeproto.StepAwaitingConfirmation && step == upgradeproto.StepCancelled) {
			if err := c.moveLocked(ctx, u, &n, step, reason); err != nil {
				return err
			}
		}
	}
	return nil
}

// Confirm records a person's yes for the node waiting in
// awaiting_confirmation and drives it on. The caller checked the
// permission.
func (c *Controller) Confirm(ctx context.Context, name string, node store.Node, by string) (store.UpgradeNode, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	u, err := c.cfg.Store.GetUpgrade(ctx, name)
	if err != nil {
		return store.UpgradeNode{}, err
	}
	if store.UpgradeFinal(u.State) {
		return store.UpgradeNode{}, fmt.Errorf("%w: upgrade %s is %s", ErrConflict, name, u.State)
	}
	n, err := c.nodeLocked(ctx, name, node.ID)
	if err != nil {
		return store.UpgradeNode{}, err
	}
	if n.Step != upgradeproto.StepAwaitingConfirmation {
		return n, fmt.Errorf("%w: node %s is %s in upgrade %s, not awaiting_confirmation", ErrConflict, node.Name, n.Step,
			name)
	}
	if n.ConfirmedBy != "" {
		return n, fmt.Errorf("%w: node %s was confirmed by %s already", ErrConflict, node.Name, n.ConfirmedBy)
	}
	n.ConfirmedBy, n.UpdatedAt = by, c.cfg.Now().UTC()
	if err := c.cfg.Store.PutUpgradeNode(ctx, n); err != nil {
		return n, err
	}
	c.cfg.Audit(store.AuditEvent{Kind: "upgrade_confirm", Operator: by, Node: node.Name, Result: "ok",
		Detail: fmt.Sprintf("upgrade %s: %s %s (%s) confirmed on the hub", name, u.Kind, u.Version, u.Digest)})
	c.Wake()
	return n, nil
}

func (c *Controller) nodeLocked(ctx context.Context, name, nodeID string) (store.UpgradeNode, error) {
	nodes, err := c.cfg.Store.ListUpgradeNodes(ctx, name)
	if err != nil {
		return store.UpgradeNode{}, err
	}
	for _, n := range nodes {
		if n.NodeID == nodeID {
			return n, nil
		}
	}
	return store.UpgradeNode{}, fmt.Errorf("upgrade %s does not target that node: %w", name, store.ErrNotFound)
}

// moveLocked takes a node's hub record one step (the state machine
// decides), records it, audits the steps that end a node, c.mu held.
func (c *Controller) moveLocked(
	ctx context.Context, u store.Upgrade, n *store.UpgradeNode, to upgradeproto.Step, reason string,
) error {
	st := nodeState(u, *n)
	now := c.cfg.Now()
	if err := st.Move(to, reason, now); err != nil {
		return err
	}
	return c.recordLocked(ctx, u, n, st, n.Step)
}

// recordLocked stores st as the node's record and notes what changed.
func (c *Controller) recordLocked(
	ctx context.Context, u store.Upgrade, n *store.UpgradeNode, st upgradeproto.NodeState, was upgradeproto.Step,
) error {
	prev := n.UpdatedAt
	n.Step, n.Reason, n.History, n.UpdatedAt = st.Step, st.Reason, st.History, st.UpdatedAt
	if st.ConfirmedBy != "" {
		n.ConfirmedBy = st.ConfirmedBy
	}
	if err := c.cfg.Store.PutUpgradeNode(ctx, *n); err != nil {
		return err
	}
	if was != st.Step {
		c.metrics.stepDone(u.Kind, was, st.UpdatedAt.Sub(prev))
		c.cfg.Logger.Info("upgrade node step", "upgrade", u.Name, "node", n.Node, "from", was, "to", st.Step, "reason",
			st.Reason)
		if st.Step.Terminal() {
			res := "ok"
			if st.Step == upgradeproto.StepFailed || st.Step == upgradeproto.StepRolledBack {
				res = "failed"
			}
			kind := "upgrade_node"
			if st.Step == upgradeproto.StepRolledBack {
				kind = "upgrade_rollback"
			}
			c.cfg.Audit(store.AuditEvent{Kind: kind, Node: n.Node, Result: res,
				Detail: fmt.Sprintf("upgrade %s: %s %s", u.Name, st.Step, st.Reason)})
		}
	}
	return nil
}

// stepRank orders the steps along the state machine.
var stepRank = map[upgradeproto.Step]int{
	upgradeproto.StepPending: 0, upgradeproto.StepAwaitingConfirmation: 1, upgradeproto.StepDownloading: 2,
	upgradeproto.StepVerifying: 3, upgradeproto.StepInstalling: 4, upgradeproto.StepHealthCheck: 5,
	upgradeproto.StepSucceeded: 6, upgradeproto.StepFailed: 6,
	upgradeproto.StepRolledBack: 6, upgradeproto.StepSkipped: 6, upgradeproto.StepCancelled: 6,
}

// nodeState is the hub's record as the state machine's type.
func nodeState(u store.Upgrade, n store.UpgradeNode) upgradeproto.NodeState {
	return upgradeproto.NodeState{
		Name:        u.Name,
		Kind:        u.Kind,
		Digest:      u.Digest,
		FromVersion: n.FromVersion,
		ToVersion:   u.Version,
		Step:        n.Step,
		Reason:      n.Reason,
		ConfirmedBy: n.ConfirmedBy,
		History:     slices.Clone(n.History),
		UpdatedAt:   n.UpdatedAt,
	}
}

// adoptLocked takes the node's own word for its step: the node is where
// the upgrade happens, so its report wins over the hub's view unless the
// hub's record has ended. Steps the hub did not see are kept from the
// node's history.
func (c *Controller) adoptLocked(
	ctx context.Context, u store.Upgrade, n *store.UpgradeNode, rep upgradeproto.NodeState,
) error {
	if n.Step.Terminal() ||
		(rep.Step == n.Step && rep.Reason == n.Reason && (rep.ConfirmedBy == "" || rep.ConfirmedBy == n.ConfirmedBy)) {
		return nil
	}
	// Reports and a drive's answers can cross: an older record of the
	// node never moves the hub's view back (by the machine's order, not
	// by clocks, which the hub and node need not share).
	if stepRank[rep.Step] < stepRank[n.Step] {
		return nil
	}
	st := nodeState(u, *n)
	was := st.Step
	if rep.Step != st.Step {
		last := time.Time{}
		if len(st.History) > 0 {
			last = st.History[len(st.History)-1].At
		}
		for _, h := range rep.History {
			if h.At.After(last) && h.Step != rep.Step {
				st.History = append(st.History, h)
			}
		}
		at := rep.UpdatedAt
		if at.IsZero() || at.Before(last) {
			at = c.cfg.Now().UTC()
		}
		st.History = append(st.History, upgradeproto.Transition{Step: rep.Step, At: at, Reason: rep.Reason})
		if k := len(st.History); k > 32 {
			st.History = st.History[k-32:]
		}
		st.Step, st.UpdatedAt = rep.Step, at
	}
	st.Reason = rep.Reason
	if rep.ConfirmedBy != "" {
		st.ConfirmedBy = rep.ConfirmedBy
		if n.ConfirmedBy == "" {
			c.cfg.Audit(store.AuditEvent{Kind: "upgrade_confirm", Operator: rep.ConfirmedBy, Node: n.Node, Result: "ok",
				Detail: fmt.Sprintf("upgrade %s: %s %s (%s) confirmed on the node", u.Name, u.Kind, u.Version, u.Digest)})
		}
	}
	if st.UpdatedAt.IsZero() {
		st.UpdatedAt = c.cfg.Now().UTC()
	}
	return c.recordLocked(ctx, u, n, st, was)
}

// Report takes a node's upgrade records from its control stream
// (TypeUpgradeState, validated by the caller): each one for an upgrade
// that targets this node and pins the same digest updates the hub's view.
// It returns what it ignored, for the caller's audit.
func (c *Controller) Report(
	ctx context.Context, nodeID string, states []upgradeproto.NodeState,
) (ignored []string, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	recs, err := c.cfg.Store.UpgradeNodesOf(ctx, nodeID)
	if err != nil {
		return nil, err
	}
	for _, rep := range states {
		i := slices.IndexFunc(recs, func(r store.UpgradeNode) bool { return r.Upgrade == rep.Name })
		if i < 0 {
			ignored = append(ignored, fmt.Sprintf("%s: no such upgrade targets this node", rep.Name))
			continue
		}
		u, err := c.cfg.Store.GetUpgrade(ctx, rep.Name)
		if err != nil {
			return ignored, err
		}
		if rep.Digest != u.Digest {
			ignored = append(ignored, fmt.Sprintf("%s: digest %s is not the pinned %s", rep.Name, rep.Digest, u.Digest))
			continue
		}
		if err := c.adoptLocked(ctx, u, &recs[i], rep); err != nil {
			return ignored, err
		}
	}
	c.Wake()
	return ignored, nil
}

// Connected is told of every hello: an agent that comes back running an
// agent upgrade's target version while the hub waits for its health check
// is evidence that the upgrade succeeded.
func (c *Controller) Connected(ctx context.Context, nodeID, version string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	recs, err := c.cfg.Store.UpgradeNodesOf(ctx, nodeID)
	if err != nil {
		return
	}
	for _, n := range recs {
		if n.Step != upgradeproto.StepHealthCheck && n.Step != upgradeproto.StepInstalling {
			continue
		}
		u, err := c.cfg.Store.GetUpgrade(ctx, n.Upgrade)
		if err != nil || u.Kind != upgradeproto.KindAgent || u.Version != version {
			continue
		}
		if err := c.moveLocked(ctx, u, &n, upgradeproto.StepSucceeded, "the node reconnected running "+version); err != nil {
			c.cfg.Logger.Warn("upgrade node not recorded", "upgrade", u.Name, "node", n.Node, "err", err)
		}
	}
	c.Wake()
}

// Referenced lists the hex digests of the blobs live upgrades use, for
// the blob store's garbage collection (an ended upgrade keeps nothing).
func (c *Controller) Referenced(ctx context.Context) ([]string, error) {
	ups, err := c.cfg.Store.ListUpgrades(ctx)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, u := range ups {
		if store.UpgradeFinal(u.State) {
			continue
		}
		a, err := unmarshalArtifact(u.Pinned)
		if err != nil {
			return nil, fmt.Errorf("upgrade %s: %w", u.Name, err)
		}
		out = append(out, a.blobDigests()...)
	}
	return out, nil
}
