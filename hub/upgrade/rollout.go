package upgrade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

func marshalArtifact(a Artifact) (json.RawMessage, error) {
	b, err := json.Marshal(a)
	if err != nil {
		return nil, fmt.Errorf("upgrade: pinned artifact: %w", err)
	}
	return b, nil
}

func unmarshalArtifact(b []byte) (Artifact, error) {
	var a Artifact
	if err := json.Unmarshal(b, &a); err != nil {
		return Artifact{}, fmt.Errorf("upgrade: pinned artifact: %w", err)
	}
	return a, nil
}

// reconcile looks at one running upgrade: ends what waited too long,
// halts on too many failures, fetches the blobs the first time a node
// needs them, and starts the nodes the batches and --max-unavailable
// allow.
func (c *Controller) reconcile(ctx context.Context, u store.Upgrade) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	nodes, err := c.cfg.Store.ListUpgradeNodes(ctx, u.Name)
	if err != nil {
		return err
	}
	now := c.cfg.Now()
	health := time.Duration(u.Spec.HealthTimeoutSeconds)*time.Second + c.cfg.HealthMargin

	// Time limits: a node silent in installing or health_check, an
	// offline node past the deadline.
	install := time.Duration(u.Spec.TimeoutSeconds)*time.Second + health
	for i := range nodes {
		n := &nodes[i]
		switch {
		case n.Step == upgradeproto.StepInstalling && !c.inflight[key(u.Name, n.NodeID)] && now.Sub(n.UpdatedAt) > install:
			err = c.moveLocked(ctx, u, n, upgradeproto.StepFailed,
				fmt.Sprintf("no report from the node for %s after its install began: it did not come back on %s, "+
					"nor report a rollback",
					install, u.Version))
		case n.Step == upgradeproto.StepHealthCheck && !c.inflight[key(u.Name, n.NodeID)] && now.Sub(n.UpdatedAt) > health:
			err = c.moveLocked(ctx, u, n, upgradeproto.StepFailed,
				fmt.Sprintf("no report from the node within the health timeout (%ds) and %s: it did not come back on %s, "+
					"nor report a rollback",
					u.Spec.HealthTimeoutSeconds, c.cfg.HealthMargin, u.Version))
		case n.Step == upgradeproto.StepPending && !u.Spec.Deadline.IsZero() && now.After(u.Spec.Deadline):
			_, why := c.cfg.Target(n.NodeID)
			if why == "" {
				why = "not reached"
			}
			err = c.moveLocked(ctx, u, n, upgradeproto.StepFailed,
				fmt.Sprintf("%s at the deadline %s", why, u.Spec.Deadline.UTC().Format(time.RFC3339)))
		}
		if err != nil {
			return err
		}
	}

	// Failures beyond the tolerance halt the rollout.
	var failed []string
	live := 0
	for _, n := range nodes {
		switch {
		case n.Step == upgradeproto.StepFailed || n.Step == upgradeproto.StepRolledBack:
			failed = append(failed, fmt.Sprintf("%s: %s", n.Node, n.Reason))
		case !n.Step.Terminal():
			live++
		}
	}
	mf, _ := jobs.ParseMaxFailures(u.Spec.FailureTolerance)
	// Without --failure-tolerance no failure is tolerated: a bad release
	// stops itself at its first failure.
	if tol := max(mf.Tolerated(len(nodes)), 0); len(failed) > tol {
		reason := fmt.Sprintf("%d of %d nodes failed, more than the failure tolerance (%s) allows: %s", len(failed),
			len(nodes), toleranceText(u.Spec.FailureTolerance, tol), firstFew(failed))
		return c.haltLocked(ctx, u, reason)
	}
	if live == 0 {
		return c.finishLocked(ctx, u, nodes)
	}

	// Which batch is on: the lowest with a node still to do. An offline
	// node waits (until the deadline) without holding its batch up, except
	// in the canary batch, which every later batch waits for.
	batch := -1
	for _, n := range nodes {
		if n.Step.Terminal() {
			continue
		}
		if _, why := c.cfg.Target(n.NodeID); why != "" && n.Step == upgradeproto.StepPending &&
			!(u.Spec.Canary > 0 && n.Batch == 0) {
			continue
		}
		if batch < 0 || n.Batch < batch {
			batch = n.Batch
		}
	}
	if batch < 0 {
		batch = nodes[len(nodes)-1].Batch
	}
	size, _ := BatchSize(u.Spec.Batch, len(nodes))
	limit := u.Spec.MaxUnavailable
	if limit <= 0 {
		limit = size
	}
	c.pollLocked(u, nodes, now)
	busy := 0
	for _, n := range nodes {
		// An agent installing or in its health check is down or about to
		// be; a bundle's install is within its drive.
		if c.inflight[key(u.Name, n.NodeID)] ||
			(u.Kind == upgradeproto.KindAgent &&
				(n.Step == upgradeproto.StepHealthCheck || n.Step == upgradeproto.StepInstalling)) {
			busy++
		}
	}
	var start []*store.UpgradeNode
	for i := range nodes {
		n := &nodes[i]
		if busy+len(start) >= limit || n.Batch > batch || c.inflight[key(u.Name, n.NodeID)] {
			continue
		}
		// Pending: first contact. Confirmed on the hub: apply. Confirmed
		// on the node (it reported downloading), or cut short by a hub
		// restart before the install: again (the node's record decides).
		// An install under way is the node's: its reports move it on.
		redrive := n.Step == upgradeproto.StepDownloading || n.Step == upgradeproto.StepVerifying ||
			(u.Kind == upgradeproto.KindBundle &&
				(n.Step == upgradeproto.StepInstalling || n.Step == upgradeproto.StepHealthCheck))
		if n.Step != upgradeproto.StepPending && !(n.Step == upgradeproto.StepAwaitingConfirmation && n.ConfirmedBy != "") &&
			!redrive {
			continue
		}
		t, why := c.cfg.Target(n.NodeID)
		if why != "" {
			continue
		}
		if n.Step == upgradeproto.StepPending {
			if skip, fail := c.versionCheck(u, t); skip != "" || fail != "" {
				to, reason := upgradeproto.StepSkipped, skip
				if fail != "" {
					to, reason = upgradeproto.StepFailed, fail
				}
				if err := c.moveLocked(ctx, u, n, to, reason); err != nil {
					return err
				}
				continue
			}
		}
		start = append(start, n)
	}
	if len(start) == 0 {
		return nil
	}
	if !u.Fetched {
		if err := c.fetchLocked(ctx, u, nodes); err != nil {
			return err
		}
		if u, err = c.cfg.Store.GetUpgrade(ctx, u.Name); err != nil || u.State != store.UpgradeRunning {
			return err
		}
	}
	return c.startLocked(ctx, u, start)
}

func toleranceText(s string, tol int) string {
	if s == "" {
		return "none given: 0"
	}
	return fmt.Sprintf("%s of the targets: %d", s, tol)
}

// firstFew joins the first failures' reasons for the rollout's reason;
// `tether upgrade show` has every node's.
func firstFew(reasons []string) string {
	const n = 3
	if len(reasons) <= n {
		return strings.Join(reasons, "; ")
	}
	return strings.Join(reasons[:n], "; ") + fmt.Sprintf("; and %d more", len(reasons)-n)
}

// versionCheck: a node already at the target is skipped; one on a newer
// version fails unless the upgrade allows downgrades.
func (c *Controller) versionCheck(u store.Upgrade, t Target) (skip, fail string) {
	if u.Kind != upgradeproto.KindAgent {
		return "", ""
	}
	if t.Version == u.Version {
		return "already at " + u.Version, ""
	}
	if cmp, ok := compareVersions(t.Version, u.Version); ok && cmp > 0 && !u.Spec.AllowDowngrade {
		return "", fmt.Sprintf("downgrade from %s to %s refused (create the upgrade with --allow-downgrade to go back)",
			t.Version, u.Version)
	}
	return "", ""
}

// fetchLocked pulls the artifact's blobs into the hub's blob store once,
// when the first node needs them. A blob that does not match its digest
// means the registry no longer serves what was pinned: every node still
// to do fails with that reason, nothing is pushed, and the rollout halts.
func (c *Controller) fetchLocked(ctx context.Context, u store.Upgrade, nodes []store.UpgradeNode) error {
	a, err := unmarshalArtifact(u.Pinned)
	if err != nil {
		return err
	}
	err = c.cfg.Source.Fetch(ctx, a, a.platforms())
	if errors.Is(err, ErrDigestMismatch) {
		reason := "failed: " + err.Error()
		if i := strings.Index(err.Error(), "digest mismatch"); i >= 0 {
			reason = err.Error()[i:]
		}
		for i := range nodes {
			if !nodes[i].Step.Terminal() && !c.inflight[key(u.Name, nodes[i].NodeID)] {
				if err := c.moveLocked(ctx, u, &nodes[i], upgradeproto.StepFailed, reason); err != nil {
					return err
				}
			}
		}
		c.cfg.Audit(store.AuditEvent{
			Kind:   "upgrade_artifact",
			Result: "refused",
			Detail: fmt.Sprintf("upgrade %s: %s from %s: %s", u.Name, u.Digest, u.Reference, err),
		})
		return c.haltLocked(ctx, u, "the artifact failed verification, nothing was pushed: "+reason)
	}
	if err != nil {
		// The registry may be down for a while: try again at the next tick.
		reason := "fetching the artifact: " + err.Error() + " (retrying)"
		if reason != u.Reason {
			_ = c.cfg.Store.SetUpgradeState(ctx, u.Name, u.State, reason, c.cfg.Now().UTC())
		}
		return err
	}
	if err := c.cfg.Store.SetUpgradeFetched(ctx, u.Name); err != nil {
		return err
	}
	if u.Reason != "" {
		return c.cfg.Store.SetUpgradeState(ctx, u.Name, u.State, "", c.cfg.Now().UTC())
	}
	return nil
}

// haltLocked ends the rollout: the nodes it has not reached are
// cancelled first, so a halted upgrade's nodes are final when it shows.
func (c *Controller) haltLocked(ctx context.Context, u store.Upgrade, reason string) error {
	if err := c.endWaitingLocked(ctx, u, upgradeproto.StepCancelled, "not reached: the rollout halted"); err != nil {
		return err
	}
	if err := c.cfg.Store.SetUpgradeState(ctx, u.Name, store.UpgradeHalted, reason, c.cfg.Now().UTC()); err != nil {
		return err
	}
	c.cfg.Audit(store.AuditEvent{Kind: "upgrade_halt", Result: "failed", Detail: "upgrade " + u.Name + ": " + reason})
	c.cfg.Logger.Warn("upgrade halted", "upgrade", u.Name, "reason", reason)
	return nil
}

func (c *Controller) finishLocked(ctx context.Context, u store.Upgrade, nodes []store.UpgradeNode) error {
	counts := map[upgradeproto.Step]int{}
	for _, n := range nodes {
		counts[n.Step]++
	}
	reason := fmt.Sprintf("%d succeeded, %d skipped, %d failed, %d rolled back", counts[upgradeproto.StepSucceeded],
		counts[upgradeproto.StepSkipped], counts[upgradeproto.StepFailed], counts[upgradeproto.StepRolledBack])
	if err := c.cfg.Store.SetUpgradeState(ctx, u.Name, store.UpgradeDone, reason, c.cfg.Now().UTC()); err != nil {
		return err
	}
	c.cfg.Audit(store.AuditEvent{Kind: "upgrade_done", Result: "ok", Detail: "upgrade " + u.Name + ": " + reason})
	c.cfg.Logger.Info("upgrade done", "upgrade", u.Name, "result", reason)
	return nil
}

// startLocked starts one job driving these nodes.
func (c *Controller) startLocked(ctx context.Context, u store.Upgrade, nodes []*store.UpgradeNode) error {
	if c.jobs == nil {
		return errors.New("upgrade: no job engine attached")
	}
	refs := make([]store.NodeRef, len(nodes))
	for i, n := range nodes {
		refs[i] = store.NodeRef{ID: n.NodeID, Name: n.Node}
		c.inflight[key(u.Name, n.NodeID)] = true
	}
	spec := store.JobSpec{
		Parallel:       len(nodes),
		TimeoutSeconds: u.Spec.TimeoutSeconds,
		Role:           u.Spec.Role,
		Upgrade:        &store.UpgradeRun{Name: u.Name},
	}
	j, err := c.jobs.Start(ctx, store.Job{Kind: JobKind, Spec: spec, CreatedBy: "upgrade:" + u.Name}, refs)
	if err != nil {
		for _, n := range nodes {
			delete(c.inflight, key(u.Name, n.NodeID))
		}
		return err
	}
	for _, r := range refs {
		c.jobOf[key(u.Name, r.ID)] = j.ID
	}
	// A run the engine skips never reaches drive: the job's end frees its
	// nodes in any case (those a later job has not taken since).
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		_, _ = c.jobs.Wait(c.ctx, j.ID)
		c.mu.Lock()
		for _, r := range refs {
			c.endDriveLocked(key(u.Name, r.ID), j.ID)
		}
		c.mu.Unlock()
		c.Wake()
	}()
	now := c.cfg.Now().UTC()
	for _, n := range nodes {
		n.JobID = j.ID
		if n.StartedAt.IsZero() {
			n.StartedAt = now
		}
		if err := c.cfg.Store.PutUpgradeNode(ctx, *n); err != nil {
			return err
		}
	}
	return nil
}

// pollLocked reads, from the node, the record of every node installing
// an agent with no drive under way, at most every PollEvery: the node's
// updater runs on outside any drive and its outcome is reported at the
// agent's next connection, or read here. (A bundle's install runs within
// its drive; one a hub stop cut short is driven again, and the node fails
// it as interrupted.)
func (c *Controller) pollLocked(u store.Upgrade, nodes []store.UpgradeNode, now time.Time) {
	for _, n := range nodes {
		k := key(u.Name, n.NodeID)
		last, seen := c.polled[k]
		if u.Kind != upgradeproto.KindAgent ||
			(n.Step != upgradeproto.StepInstalling && n.Step != upgradeproto.StepHealthCheck) || c.inflight[k] ||
			(seen && (last.IsZero() || now.Sub(last) < c.cfg.PollEvery)) {
			continue
		}
		if !seen {
			c.polled[k] = now // the first look waits one period: the drive just ended
			continue
		}
		t, why := c.cfg.Target(n.NodeID)
		if why != "" || c.ctx == nil {
			continue
		}
		c.polled[k] = time.Time{}
		c.wg.Add(1)
		go func() {
			defer c.wg.Done()
			ctx, cancel := context.WithTimeout(c.ctx, time.Minute)
			defer cancel()
			st, err := c.cfg.Driver.Status(ctx, t, u.Name)
			c.mu.Lock()
			defer c.mu.Unlock()
			c.polled[k] = c.cfg.Now()
			if err != nil {
				c.cfg.Logger.Debug("upgrade status not read", "upgrade", u.Name, "node", n.Node, "err", err)
				return
			}
			if st.Digest != u.Digest {
				return
			}
			cur, err := c.nodeLocked(ctx, u.Name, n.NodeID)
			if err == nil && !c.inflight[k] {
				err = c.adoptLocked(ctx, u, &cur, st)
			}
			if err != nil {
				c.cfg.Logger.Warn("upgrade status not recorded", "upgrade", u.Name, "node", n.Node, "err", err)
			}
			c.Wake()
		}()
	}
}

// endDriveLocked frees node k from the drive of job id, unless a later
// job drives it now; c.mu held.
func (c *Controller) endDriveLocked(k, id string) {
	if c.jobOf[k] == id {
		delete(c.jobOf, k)
		delete(c.inflight, k)
	}
}

// Local is the job engine's Local for JobKind: the drives of the
// controller's nodes.
func (c *Controller) Local() jobs.Local { return drives{c} }

type drives struct{ c *Controller }

// Ready implements jobs.Local: the controller starts only nodes it can
// reach, so a drive whose node went meanwhile ends at once.
func (d drives) Ready(_ store.Job, nodeID string) string {
	_, why := d.c.cfg.Target(nodeID)
	return why
}

// Run implements jobs.Local: one node's drive, its output in the job's
// log. Exit code 0: the node took the upgrade on (or waits for a person);
// 1: the node failed it.
func (d drives) Run(ctx context.Context, j store.Job, nodeID string, stdout, stderr io.Writer) (int, error) {
	return d.c.drive(ctx, j, nodeID, stdout, stderr)
}

func (c *Controller) drive(ctx context.Context, j store.Job, nodeID string, stdout, stderr io.Writer) (int, error) {
	if j.Spec.Upgrade == nil {
		return -1, errors.New("upgrade: job without an upgrade")
	}
	name := j.Spec.Upgrade.Name
	defer func() {
		c.mu.Lock()
		c.endDriveLocked(key(name, nodeID), j.ID)
		c.mu.Unlock()
		c.Wake()
	}()
	c.mu.Lock()
	u, err := c.cfg.Store.GetUpgrade(ctx, name)
	var n store.UpgradeNode
	if err == nil {
		n, err = c.nodeLocked(ctx, name, nodeID)
	}
	c.mu.Unlock()
	if err != nil {
		return -1, err
	}
	if store.UpgradeFinal(u.State) {
		// Halted or cancelled between the job's start and this run.
		c.mu.Lock()
		if n.Step == upgradeproto.StepPending {
			err = c.moveLocked(ctx, u, &n, upgradeproto.StepCancelled, "not reached: the rollout is "+u.State)
		}
		c.mu.Unlock()
		return 0, err
	}
	a, err := unmarshalArtifact(u.Pinned)
	if err != nil {
		return -1, err
	}
	t, why := c.cfg.Target(nodeID)
	if why != "" {
		return -1, fmt.Errorf("node %s: %s", n.Node, why)
	}
	from := ""
	if u.Kind == upgradeproto.KindAgent {
		from = t.Version // a bundle's version on the node is the node's to know
	}
	offer := upgradeproto.Offer{
		Name:                 u.Name,
		Kind:                 u.Kind,
		Version:              u.Version,
		FromVersion:          from,
		Digest:               u.Digest,
		RequireConfirmation:  u.Spec.RequireConfirmation,
		AllowDowngrade:       u.Spec.AllowDowngrade,
		HealthTimeoutSeconds: u.Spec.HealthTimeoutSeconds,
	}
	var files []upgradeproto.File
	offer.Index, offer.Manifest, files, err = a.forPlatform(t.OS, t.Arch)
	if err != nil {
		c.fail(ctx, u, nodeID, fmt.Sprintf("no artifact for the node's platform %s/%s: %v", t.OS, t.Arch, err))
		return 1, nil
	}
	fmt.Fprintf(stdout, "upgrade %s: %s %s (%s), %d files\n", u.Name, u.Kind, u.Version, u.Digest, len(files))
	adopt := func(st upgradeproto.NodeState) {
		c.mu.Lock()
		defer c.mu.Unlock()
		cur, err := c.nodeLocked(ctx, name, nodeID)
		if err == nil {
			err = c.adoptLocked(ctx, u, &cur, st)
		}
		if err != nil {
			c.cfg.Logger.Warn("upgrade node not recorded", "upgrade", u.Name, "node", n.Node, "err", err)
		}
	}
	st, pushed, err := c.cfg.Driver.Drive(ctx, t, offer, files, n.ConfirmedBy, stderr, adopt)
	c.metrics.pushed(pushed)
	k := key(name, nodeID)
	if err != nil {
		if ctx.Err() != nil && errors.Is(ctx.Err(), context.Canceled) {
			return -1, err // the hub is stopping: the next one re-drives the node
		}
		c.mu.Lock()
		c.lost[k]++
		lost := c.lost[k]
		c.mu.Unlock()
		if errors.Is(err, ErrConnLost) && lost < maxLost {
			// The node's record says what happened. An agent upgrade's
			// apply restarts the agent (and an embedded SSH server with
			// it): the node reports when it is back, or is read. A bundle
			// is driven again: the node fails an install cut short.
			fmt.Fprintf(stdout, "connection lost (%v); the node's record decides\n", err)
			if u.Kind == upgradeproto.KindAgent && offer.Digest != "" {
				adopt(upgradeproto.NodeState{
					Name:      u.Name,
					Kind:      u.Kind,
					Digest:    u.Digest,
					ToVersion: u.Version,
					Step:      upgradeproto.StepInstalling,
					Reason:    "the connection ended during apply (the agent restarts); waiting for the node's report",
					UpdatedAt: c.cfg.Now().UTC(),
				})
			}
			return 0, nil
		}
		c.fail(ctx, u, nodeID, err.Error())
		return 1, nil
	}
	c.mu.Lock()
	delete(c.lost, k)
	c.mu.Unlock()
	c.mu.Lock()
	n, err = c.nodeLocked(ctx, name, nodeID)
	if err == nil {
		err = c.adoptLocked(ctx, u, &n, st)
	}
	c.mu.Unlock()
	if err != nil {
		return -1, err
	}
	fmt.Fprintf(stdout, "node: %s %s\n", st.Step, st.Reason)
	if st.Step == upgradeproto.StepFailed || st.Step == upgradeproto.StepRolledBack {
		return 1, nil
	}
	return 0, nil
}

// fail records a drive that did not reach the node's updater, or that it
// refused.
func (c *Controller) fail(ctx context.Context, u store.Upgrade, nodeID, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	n, err := c.nodeLocked(ctx, u.Name, nodeID)
	if err != nil || n.Step.Terminal() {
		return
	}
	if err := c.moveLocked(ctx, u, &n, upgradeproto.StepFailed, reason); err != nil {
		// A step the machine cannot fail from (health_check can; every
		// live step can): record it anyway.
		c.cfg.Logger.Warn("upgrade node not recorded", "upgrade", u.Name, "node", n.Node, "err", err)
	}
}
