package upgrade

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	promtestutil "github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tether-dev/tether/hub/blobs"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// These tests drive the real controller, store and job engine; the
// registry (Source) and the per-node SSH driver (Driver) are in-package
// fakes, so every rollout decision is exercised without agents. The e2e
// tests (e2e/upgrade_test.go) run the same with real agents, a real
// registry and real SSH.

func bundleArtifact(t *testing.T, version string) Artifact {
	t.Helper()
	m := upgradeproto.OCIManifest{
		SchemaVersion: 2,
		MediaType:     upgradeproto.MediaTypeOCIManifest,
		ArtifactType:  upgradeproto.ArtifactTypeBundle,
		Config: upgradeproto.OCIDescriptor{
			MediaType: upgradeproto.MediaTypeOCIEmpty, Digest: upgradeproto.DigestOf([]byte("{}")), Size: 2,
		},
		Layers: []upgradeproto.OCIDescriptor{{
			MediaType:   upgradeproto.MediaTypeBundleFile,
			Digest:      upgradeproto.DigestOf([]byte("#!/bin/sh\n")),
			Size:        10,
			Annotations: map[string]string{upgradeproto.AnnotationTitle: upgradeproto.BundleInstall},
		}},
		Annotations: map[string]string{upgradeproto.AnnotationVersion: version},
	}
	b, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return Artifact{
		Reference: "oci://127.0.0.1:5000/b:" + version,
		Digest:    upgradeproto.DigestOf(b),
		Kind:      upgradeproto.KindBundle,
		Version:   version,
		Manifests: map[string][]byte{"": b},
	}
}

func agentArtifact(t *testing.T, version string) Artifact {
	t.Helper()
	m := upgradeproto.OCIManifest{
		SchemaVersion: 2,
		MediaType:     upgradeproto.MediaTypeOCIManifest,
		ArtifactType:  upgradeproto.ArtifactTypeAgent,
		Config: upgradeproto.OCIDescriptor{
			MediaType: upgradeproto.MediaTypeOCIEmpty, Digest: upgradeproto.DigestOf([]byte("{}")), Size: 2,
		},
		Layers: []upgradeproto.OCIDescriptor{{
			MediaType: upgradeproto.MediaTypeAgentBinary,
			Digest:    upgradeproto.DigestOf([]byte("ELF" + version)),
			Size:      3 + int64(len(version)),
		}},
		Annotations: map[string]string{upgradeproto.AnnotationVersion: version},
	}
	mb, _ := json.Marshal(m)
	ix := upgradeproto.OCIIndex{
		SchemaVersion: 2,
		MediaType:     upgradeproto.MediaTypeOCIIndex,
		ArtifactType:  upgradeproto.ArtifactTypeAgent,
		Manifests: []upgradeproto.OCIDescriptor{{
			MediaType: upgradeproto.MediaTypeOCIManifest,
			Digest:    upgradeproto.DigestOf(mb),
			Size:      int64(len(mb)),
			Platform:  &upgradeproto.OCIPlatform{OS: "linux", Architecture: "amd64"},
		}},
		Annotations: map[string]string{upgradeproto.AnnotationVersion: version},
	}
	ib, _ := json.Marshal(ix)
	return Artifact{Reference: "oci://127.0.0.1:5000/edge:" + version, Digest: upgradeproto.DigestOf(ib),
		Kind: upgradeproto.KindAgent, Version: version, Index: ib, Manifests: map[string][]byte{"linux/amd64": mb}}
}

// fakeSource serves one artifact; tamper makes Fetch find a bad blob.
type fakeSource struct {
	mu      sync.Mutex
	a       Artifact
	fetches int
	tamper  bool
}

func (s *fakeSource) Resolve(_ context.Context, ref string) (Artifact, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.a, nil
}

func (s *fakeSource) Fetch(_ context.Context, a Artifact, _ []string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.fetches++
	if s.tamper {
		return fmt.Errorf("blob %s: %w (want %s, got sha256:%s)", a.Digest, ErrDigestMismatch, a.Digest,
			strings.Repeat("0", 64))
	}
	return nil
}

// fakeDriver answers each drive with what answer says for the node, and
// records drives, their order and the highest concurrency seen.
type fakeDriver struct {
	mu       sync.Mutex
	answer   func(t Target, offer upgradeproto.Offer, confirmedBy string) (upgradeproto.Step, string)
	drives   map[string]int
	order    []string
	active   int
	maxSeen  int
	release  chan struct{} // when set, each drive waits for one value
	versions map[string]string
}

func (d *fakeDriver) Status(_ context.Context, t Target, name string) (upgradeproto.NodeState, error) {
	return upgradeproto.NodeState{}, errors.New("no status in this fake")
}

func (d *fakeDriver) Drive(
	ctx context.Context,
	t Target,
	offer upgradeproto.Offer,
	files []upgradeproto.File,
	confirmedBy string,
	log io.Writer,
	_ func(upgradeproto.NodeState),
) (upgradeproto.NodeState, int64, error) {
	d.mu.Lock()
	d.drives[t.Name]++
	d.order = append(d.order, t.Name)
	d.active++
	d.maxSeen = max(d.maxSeen, d.active)
	rel := d.release
	d.mu.Unlock()
	defer func() { d.mu.Lock(); d.active--; d.mu.Unlock() }()
	if rel != nil {
		select {
		case <-rel:
		case <-ctx.Done():
			return upgradeproto.NodeState{}, 0, ctx.Err()
		}
	}
	if _, err := offer.Verify(); err != nil {
		return upgradeproto.NodeState{}, 0, err
	}
	step, reason := upgradeproto.StepSucceeded, ""
	if d.answer != nil {
		step, reason = d.answer(t, offer, confirmedBy)
	}
	fmt.Fprintf(log, "installing on %s\n", t.Name)
	return upgradeproto.NodeState{Name: offer.Name, Kind: offer.Kind, Digest: offer.Digest, ToVersion: offer.Version,
		Step: step, Reason: reason, ConfirmedBy: confirmedBy, UpdatedAt: time.Now()}, 100, nil
}

type rig struct {
	t       *testing.T
	st      *store.DB
	src     *fakeSource
	drv     *fakeDriver
	c       *Controller
	eng     *jobs.Engine
	mu      sync.Mutex
	offline map[string]bool
	version map[string]string
	now     time.Time // zero: the clock
	stop    func()
	nodes   []store.Node
}

func newRig(t *testing.T, a Artifact, n int) *rig {
	t.Helper()
	dir := t.TempDir()
	st, err := store.OpenSQLite(context.Background(), filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	r := &rig{
		t:       t,
		st:      st,
		src:     &fakeSource{a: a},
		drv:     &fakeDriver{drives: map[string]int{}},
		offline: map[string]bool{},
		version: map[string]string{},
	}
	for i := range n {
		name := fmt.Sprintf("n%02d", i)
		r.nodes = append(r.nodes, addNode(t, st, "id-"+name, name, "1.0.0"))
		r.version["id-"+name] = "1.0.0"
	}
	r.start()
	return r
}

func addNode(t *testing.T, s *store.DB, id, name, version string) store.Node {
	t.Helper()
	ctx := context.Background()
	if err := s.CreateToken(ctx, store.Token{
		ID:         "tok-" + id,
		SecretHash: []byte("h"),
		UsesLeft:   1,
		ExpiresAt:  time.Now().Add(time.Hour),
	}); err != nil {
		t.Fatal(err)
	}
	n, err := s.Join(ctx, "tok-"+id, func(store.Token) error { return nil }, store.Node{ID: id, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.UpdateNodeSeen(ctx, id, store.Seen{Online: true, AgentVersion: version, At: time.Now()}); err != nil {
		t.Fatal(err)
	}
	n.AgentVersion = version
	return n
}

func (r *rig) target(nodeID string) (Target, string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.offline[nodeID] {
		return Target{}, "offline"
	}
	return Target{NodeID: nodeID, Name: strings.TrimPrefix(nodeID, "id-"), Exe: "/usr/bin/tether-edge",
		StateDir: "/var/lib/tether-edge", OS: "linux", Arch: "amd64", Version: r.version[nodeID]}, ""
}

func (r *rig) clock() time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.now.IsZero() {
		return time.Now()
	}
	return r.now
}

// start runs a controller and a job engine on the rig's store, as a hub
// process would; stop ends both (a hub stopping).
func (r *rig) start() {
	ctx, cancel := context.WithCancel(context.Background())
	blobs, err := blobs.New(filepath.Join(r.t.TempDir(), "blobs"), 1<<20)
	if err != nil {
		r.t.Fatal(err)
	}
	// Audit as the hub wires it: straight into the store.
	audit := func(e store.AuditEvent) {
		if err := r.st.AppendAudit(context.Background(), e); err != nil {
			r.t.Errorf("audit %s: %v", e.Kind, err)
		}
	}
	r.c = New(Config{Store: r.st, Source: r.src, Driver: r.drv, Target: r.target, Tick: 5 * time.Millisecond,
		HealthMargin: time.Second, Now: r.clock, Audit: audit, Logger: testenv.Logger(r.t)})
	r.eng = jobs.New(ctx, jobs.Config{
		Store:         r.st,
		Blobs:         blobs,
		FlushInterval: 5 * time.Millisecond,
		PollInterval:  5 * time.Millisecond,
		Local:         map[string]jobs.Local{JobKind: r.c.Local()},
	})
	if _, err := r.eng.Recover(ctx); err != nil {
		r.t.Fatal(err)
	}
	r.c.Attach(r.eng)
	done := make(chan struct{})
	go func() { defer close(done); _ = r.c.Run(ctx) }()
	r.stop = func() { cancel(); r.eng.Close(); <-done }
	r.t.Cleanup(func() { cancel(); r.eng.Close(); <-done })
}

func (r *rig) create(name string, spec store.UpgradeSpec) store.Upgrade {
	r.t.Helper()
	u, err := r.c.Create(context.Background(), CreateRequest{
		Name:      name,
		Reference: r.src.a.Reference,
		Spec:      spec,
		Targets:   r.nodes,
		By:        "admin:test",
	})
	if err != nil {
		r.t.Fatal(err)
	}
	return u
}

func (r *rig) waitState(name string, states ...string) store.Upgrade {
	r.t.Helper()
	var u store.Upgrade
	testenv.WaitFor(r.t, "upgrade "+name+" to reach "+strings.Join(states, "|"), 10*time.Second, func() bool {
		var err error
		u, err = r.st.GetUpgrade(context.Background(), name)
		return err == nil && slices.Contains(states, u.State)
	})
	return u
}

func (r *rig) steps(name string) map[string]store.UpgradeNode {
	r.t.Helper()
	ns, err := r.st.ListUpgradeNodes(context.Background(), name)
	if err != nil {
		r.t.Fatal(err)
	}
	out := map[string]store.UpgradeNode{}
	for _, n := range ns {
		out[n.Node] = n
	}
	return out
}

func (r *rig) waitStep(name, node string, step upgradeproto.Step) store.UpgradeNode {
	r.t.Helper()
	var n store.UpgradeNode
	testenv.WaitFor(r.t, node+" to reach "+string(step), 10*time.Second, func() bool {
		n = r.steps(name)[node]
		return n.Step == step
	})
	return n
}

// item 6: batches (count or %), max-unavailable, and batch order.
func TestRolloutBatches(t *testing.T) {
	for _, tc := range []struct {
		name         string
		batch        string
		canary, maxU int
		wantBatches  int
		wantMaxInFly int
	}{
		{"count", "3", 0, 0, 4, 3},
		{"percent", "25%", 0, 2, 4, 2},
		{"canary", "5", 1, 0, 3, 5},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRig(t, bundleArtifact(t, "2"), 10)
			r.create("b", store.UpgradeSpec{Batch: tc.batch, Canary: tc.canary, MaxUnavailable: tc.maxU})
			u := r.waitState("b", store.UpgradeDone)
			steps := r.steps("b")
			batchOf := map[string]int{}
			maxBatch := 0
			for name, n := range steps {
				if n.Step != upgradeproto.StepSucceeded {
					t.Errorf("%s: %s %s", name, n.Step, n.Reason)
				}
				batchOf[name] = n.Batch
				maxBatch = max(maxBatch, n.Batch)
				if r.drv.drives[name] != 1 {
					t.Errorf("%s driven %d times", name, r.drv.drives[name])
				}
			}
			if maxBatch+1 != tc.wantBatches {
				t.Errorf("%d batches, want %d", maxBatch+1, tc.wantBatches)
			}
			if tc.canary > 0 && batchOf[r.drv.order[0]] != 0 {
				t.Errorf("first node driven %s is not the canary", r.drv.order[0])
			}
			// No node of a later batch was driven before one of an earlier.
			for i := 1; i < len(r.drv.order); i++ {
				if batchOf[r.drv.order[i]] < batchOf[r.drv.order[i-1]] {
					t.Errorf("drive order %v goes back a batch at %d", r.drv.order, i)
				}
			}
			if r.drv.maxSeen > tc.wantMaxInFly {
				t.Errorf("%d nodes driven at once, want at most %d", r.drv.maxSeen, tc.wantMaxInFly)
			}
			if r.src.fetches != 1 {
				t.Errorf("blobs fetched %d times, want once", r.src.fetches)
			}
			if !strings.Contains(u.Reason, "10 succeeded") {
				t.Errorf("reason %q", u.Reason)
			}
			// Each step's time and reason are kept.
			h := steps["n00"].History
			if len(h) < 2 || h[0].Step != upgradeproto.StepPending || h[len(h)-1].Step != upgradeproto.StepSucceeded ||
				h[0].At.IsZero() {
				t.Errorf("history %+v", h)
			}
		})
	}
}

// item 6: --failure-tolerance halts the rollout; each failure's reason is
// kept; nodes never reached are cancelled.
func TestFailureToleranceHalts(t *testing.T) {
	r := newRig(t, bundleArtifact(t, "2"), 10)
	r.drv.answer = func(t Target, _ upgradeproto.Offer, _ string) (upgradeproto.Step, string) {
		return upgradeproto.StepFailed, "install.sh exited 3 on " + t.Name
	}
	r.create("bad", store.UpgradeSpec{Batch: "2", FailureTolerance: "1"})
	u := r.waitState("bad", store.UpgradeHalted)
	if !strings.Contains(u.Reason, "2 of 10 nodes failed") || !strings.Contains(u.Reason, "install.sh exited 3 on n00") {
		t.Errorf("halt reason %q", u.Reason)
	}
	var failed, cancelled int
	for name, n := range r.steps("bad") {
		switch n.Step {
		case upgradeproto.StepFailed:
			failed++
			if n.Reason != "install.sh exited 3 on "+name {
				t.Errorf("%s reason %q", name, n.Reason)
			}
		case upgradeproto.StepCancelled:
			cancelled++
		default:
			t.Errorf("%s: %s", name, n.Step)
		}
	}
	if failed != 2 || cancelled != 8 {
		t.Errorf("%d failed, %d cancelled; want 2 and 8", failed, cancelled)
	}
}

// A tampered blob found at the one fetch: every node fails with the
// digest mismatch, nothing is driven, the rollout halts.
func TestTamperedBlobFailsEveryNode(t *testing.T) {
	r := newRig(t, bundleArtifact(t, "2"), 5)
	r.src.tamper = true
	r.create("t", store.UpgradeSpec{Batch: "2", FailureTolerance: "100%"})
	u := r.waitState("t", store.UpgradeHalted)
	if !strings.Contains(u.Reason, "digest mismatch") {
		t.Errorf("reason %q", u.Reason)
	}
	for name, n := range r.steps("t") {
		if n.Step != upgradeproto.StepFailed || !strings.HasPrefix(n.Reason, "digest mismatch (want ") {
			t.Errorf("%s: %s %q", name, n.Step, n.Reason)
		}
	}
	if len(r.drv.order) != 0 {
		t.Errorf("nodes driven: %v", r.drv.order)
	}
}

// item 5: a node waits in awaiting_confirmation until confirmed on the
// hub; the confirmation is recorded and drives it on.
func TestConfirmOnHub(t *testing.T) {
	r := newRig(t, bundleArtifact(t, "2"), 2)
	r.drv.answer = func(_ Target, o upgradeproto.Offer, by string) (upgradeproto.Step, string) {
		if o.RequireConfirmation && by == "" {
			return upgradeproto.StepAwaitingConfirmation, ""
		}
		return upgradeproto.StepSucceeded, ""
	}
	r.create("c", store.UpgradeSpec{RequireConfirmation: true})
	r.waitStep("c", "n00", upgradeproto.StepAwaitingConfirmation)
	r.waitStep("c", "n01", upgradeproto.StepAwaitingConfirmation)
	if _, err := r.c.Confirm(context.Background(), "c", r.nodes[0], "operator:alice"); err != nil {
		t.Fatal(err)
	}
	n := r.waitStep("c", "n00", upgradeproto.StepSucceeded)
	if n.ConfirmedBy != "operator:alice" {
		t.Errorf("confirmed by %q", n.ConfirmedBy)
	}
	if _, err := r.c.Confirm(context.Background(), "c", r.nodes[0], "operator:bob"); !errors.Is(err, ErrConflict) {
		t.Errorf("second confirm: %v, want a conflict", err)
	}
	// The other node is confirmed on the node itself: its report moves it.
	u, _ := r.st.GetUpgrade(context.Background(), "c")
	if _, err := r.c.Report(context.Background(), "id-n01",
		[]upgradeproto.NodeState{{Name: "c", Kind: u.Kind, Digest: u.Digest, ToVersion: "2",
			Step: upgradeproto.StepSucceeded, ConfirmedBy: "root@n01 (on the node)", UpdatedAt: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	if n := r.waitStep("c", "n01", upgradeproto.StepSucceeded); n.ConfirmedBy != "root@n01 (on the node)" {
		t.Errorf("confirmed by %q", n.ConfirmedBy)
	}
	r.waitState("c", store.UpgradeDone)
}

// A report for another digest than the pinned one changes nothing.
func TestReportOtherDigestIgnored(t *testing.T) {
	r := newRig(t, bundleArtifact(t, "2"), 1)
	r.drv.answer = func(Target, upgradeproto.Offer, string) (upgradeproto.Step, string) {
		return upgradeproto.StepAwaitingConfirmation, ""
	}
	r.create("d", store.UpgradeSpec{RequireConfirmation: true})
	r.waitStep("d", "n00", upgradeproto.StepAwaitingConfirmation)
	ign, err := r.c.Report(context.Background(), "id-n00",
		[]upgradeproto.NodeState{{Name: "d", Kind: upgradeproto.KindBundle,
			Digest: "sha256:" + strings.Repeat("1", 64), Step: upgradeproto.StepSucceeded}})
	if err != nil || len(ign) != 1 {
		t.Fatalf("ignored %v, err %v", ign, err)
	}
	if n := r.steps("d")["n00"]; n.Step != upgradeproto.StepAwaitingConfirmation {
		t.Errorf("step %s after a report of another digest", n.Step)
	}
}

// item 7's hub half: after apply, an agent upgrade waits in health_check;
// a hello with the target version is success, a report of a rollback is
// recorded with its reason, silence past the health timeout fails.
func TestAgentHealthCheck(t *testing.T) {
	r := newRig(t, agentArtifact(t, "1.1.0"), 3)
	r.drv.answer = func(Target, upgradeproto.Offer, string) (upgradeproto.Step, string) {
		return upgradeproto.StepHealthCheck, ""
	}
	u := r.create("a", store.UpgradeSpec{HealthTimeoutSeconds: 1, FailureTolerance: "100%"})
	for _, n := range []string{"n00", "n01", "n02"} {
		r.waitStep("a", n, upgradeproto.StepHealthCheck)
	}
	r.c.Connected(context.Background(), "id-n00", "1.1.0")
	if n := r.waitStep("a", "n00", upgradeproto.StepSucceeded); !strings.Contains(n.Reason, "reconnected running 1.1.0") {
		t.Errorf("reason %q", n.Reason)
	}
	if _, err := r.c.Report(context.Background(), "id-n01",
		[]upgradeproto.NodeState{{Name: "a", Kind: u.Kind, Digest: u.Digest, ToVersion: "1.1.0",
			Step: upgradeproto.StepRolledBack, Reason: "new version did not reconnect within 1s",
			UpdatedAt: time.Now()}}); err != nil {
		t.Fatal(err)
	}
	if n := r.waitStep("a", "n01", upgradeproto.StepRolledBack); n.Reason != "new version did not reconnect within 1s" {
		t.Errorf("reason %q", n.Reason)
	}
	r.mu.Lock()
	r.now = time.Now().Add(time.Minute)
	r.mu.Unlock()
	if n := r.waitStep("a", "n02", upgradeproto.StepFailed); !strings.Contains(n.Reason,
		"no report from the node within the health timeout") {
		t.Errorf("reason %q", n.Reason)
	}
	r.waitState("a", store.UpgradeDone)
}

// item 6: a downgrade is refused without --allow-downgrade; nodes at the
// target are skipped.
func TestDowngradeAndSkip(t *testing.T) {
	r := newRig(t, agentArtifact(t, "0.9.0"), 2)
	_, err := r.c.Create(context.Background(), CreateRequest{Name: "down", Reference: "x", Targets: r.nodes, By: "admin"})
	if !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "--allow-downgrade") {
		t.Fatalf("create: %v, want a refused downgrade", err)
	}
	r.drv.answer = func(Target, upgradeproto.Offer, string) (upgradeproto.Step, string) {
		return upgradeproto.StepSucceeded, ""
	}
	r.create("down", store.UpgradeSpec{AllowDowngrade: true})
	r.waitState("down", store.UpgradeDone)

	r2 := newRig(t, agentArtifact(t, "1.0.0"), 2)
	r2.create("same", store.UpgradeSpec{})
	r2.waitState("same", store.UpgradeDone)
	for name, n := range r2.steps("same") {
		if n.Step != upgradeproto.StepSkipped || n.Reason != "already at 1.0.0" {
			t.Errorf("%s: %s %q", name, n.Step, n.Reason)
		}
	}
	if len(r2.drv.order) != 0 {
		t.Errorf("driven: %v", r2.drv.order)
	}
}

// item 6: offline nodes wait and are upgraded when they come back; past
// the deadline they fail with the reason.
func TestOfflineWaitsUntilDeadline(t *testing.T) {
	r := newRig(t, bundleArtifact(t, "2"), 3)
	r.mu.Lock()
	r.offline["id-n00"], r.offline["id-n01"] = true, true
	r.mu.Unlock()
	r.create("o", store.UpgradeSpec{Batch: "1", Deadline: time.Now().Add(time.Hour), FailureTolerance: "100%"})
	r.waitStep("o", "n02", upgradeproto.StepSucceeded)
	r.mu.Lock()
	r.offline["id-n00"] = false
	r.mu.Unlock()
	r.waitStep("o", "n00", upgradeproto.StepSucceeded)
	r.mu.Lock()
	r.now = time.Now().Add(2 * time.Hour)
	r.mu.Unlock()
	if n := r.waitStep("o", "n01", upgradeproto.StepFailed); !strings.Contains(n.Reason, "offline at the deadline") {
		t.Errorf("reason %q", n.Reason)
	}
	r.waitState("o", store.UpgradeDone)
}

// item 6: pause stops starting nodes, resume continues, cancel ends the
// nodes not reached; each is refused from the wrong state.
func TestPauseResumeCancel(t *testing.T) {
	r := newRig(t, bundleArtifact(t, "2"), 4)
	r.drv.release = make(chan struct{})
	r.create("p", store.UpgradeSpec{Batch: "1"})
	testenv.WaitFor(t, "first drive", 10*time.Second,
		func() bool { r.drv.mu.Lock(); defer r.drv.mu.Unlock(); return r.drv.active == 1 })
	ctx := context.Background()
	if _, err := r.c.Pause(ctx, "p", "admin"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.c.Pause(ctx, "p", "admin"); !errors.Is(err, ErrConflict) {
		t.Errorf("second pause: %v", err)
	}
	r.drv.release <- struct{}{}
	r.waitStep("p", "n00", upgradeproto.StepSucceeded)
	if _, err := r.c.Resume(ctx, "p", "admin"); err != nil {
		t.Fatal(err)
	}
	r.drv.release <- struct{}{}
	r.waitStep("p", "n01", upgradeproto.StepSucceeded)
	testenv.WaitFor(t, "third drive", 10*time.Second,
		func() bool { r.drv.mu.Lock(); defer r.drv.mu.Unlock(); return r.drv.active == 1 })
	if _, err := r.c.Cancel(ctx, "p", "admin"); err != nil {
		t.Fatal(err)
	}
	close(r.drv.release)
	r.waitStep("p", "n02", upgradeproto.StepSucceeded)
	if n := r.steps("p")["n03"]; n.Step != upgradeproto.StepCancelled {
		t.Errorf("n03: %s", n.Step)
	}
	if r.drv.drives["n03"] != 0 {
		t.Error("n03 driven after the cancel")
	}
}

// TestAuditRowsTimed: every row a rollout writes (creation, pause,
// resume, each node's end, halt, done) carries its time, so `tether audit
// --since` finds it.
func TestAuditRowsTimed(t *testing.T) {
	start := time.Now().Truncate(time.Millisecond)
	ctx := context.Background()
	r := newRig(t, bundleArtifact(t, "2"), 3)
	r.drv.answer = func(_ Target, offer upgradeproto.Offer, _ string) (upgradeproto.Step, string) {
		if offer.Name == "bad" {
			return upgradeproto.StepFailed, "install.sh exited 3"
		}
		return upgradeproto.StepSucceeded, ""
	}
	r.drv.release = make(chan struct{})
	r.create("ok", store.UpgradeSpec{Batch: "1"})
	testenv.WaitFor(t, "first drive", 10*time.Second, func() bool {
		r.drv.mu.Lock()
		defer r.drv.mu.Unlock()
		return r.drv.active == 1
	})
	if _, err := r.c.Pause(ctx, "ok", "admin"); err != nil {
		t.Fatal(err)
	}
	if _, err := r.c.Resume(ctx, "ok", "admin"); err != nil {
		t.Fatal(err)
	}
	close(r.drv.release)
	r.waitState("ok", store.UpgradeDone)
	r.create("bad", store.UpgradeSpec{Batch: "3"})
	r.waitState("bad", store.UpgradeHalted)
	end := time.Now()

	all, err := r.st.ListAudit(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	recent, err := r.st.ListAudit(ctx, store.AuditFilter{Since: start})
	if err != nil {
		t.Fatal(err)
	}
	if len(recent) != len(all) {
		t.Errorf("%d audit rows since the test started, %d in all: %+v", len(recent), len(all), all)
	}
	kinds := map[string]bool{}
	for _, e := range all {
		kinds[e.Kind] = true
		if e.At.Before(start) || e.At.After(end) {
			t.Errorf("%s row at %s, want between %s and %s", e.Kind, e.At, start, end)
		}
	}
	for _, k := range []string{"upgrade_create", "upgrade_pause", "upgrade_resume", "upgrade_node", "upgrade_done",
		"upgrade_halt"} {
		if !kinds[k] {
			t.Errorf("no %s row in %+v", k, all)
		}
	}
}

// item 4 and 6: a hub that stops mid-rollout resumes from the store: the
// nodes done stay done (never driven twice), the one cut short is driven
// again, the rest follow.
func TestRestartResumes(t *testing.T) {
	r := newRig(t, bundleArtifact(t, "2"), 6)
	r.drv.release = make(chan struct{})
	r.create("r", store.UpgradeSpec{Batch: "2"})
	r.drv.release <- struct{}{}
	r.drv.release <- struct{}{}
	r.waitStep("r", "n00", upgradeproto.StepSucceeded)
	r.waitStep("r", "n01", upgradeproto.StepSucceeded)
	testenv.WaitFor(t, "batch 2 drives", 10*time.Second,
		func() bool { r.drv.mu.Lock(); defer r.drv.mu.Unlock(); return r.drv.active == 2 })
	r.stop()
	// The hub stopped mid-batch; a new controller and engine on the store:
	r.drv.release = nil
	r.start()
	r.waitState("r", store.UpgradeDone)
	for name, n := range r.steps("r") {
		if n.Step != upgradeproto.StepSucceeded {
			t.Errorf("%s: %s", name, n.Step)
		}
	}
	if r.drv.drives["n00"] != 1 || r.drv.drives["n01"] != 1 || r.drv.drives["n04"] != 1 {
		t.Errorf("drives %v", r.drv.drives)
	}
}

func TestBatchSize(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want int
		err  bool
	}{
		{"", 7, 7, false},
		{"3", 7, 3, false},
		{"10%", 25, 3, false},
		{"1%", 5, 1, false},
		{"0", 5, 0, true},
		{"x", 5, 0, true},
		{"101%", 5, 0, true},
	} {
		got, err := BatchSize(tc.in, tc.n)
		if (err != nil) != tc.err || got != tc.want {
			t.Errorf("BatchSize(%q, %d) = %d, %v", tc.in, tc.n, got, err)
		}
	}
}

// item 9: the rollout's metrics: rollouts by state, live nodes by step,
// step durations, bytes pushed.
func TestMetrics(t *testing.T) {
	r := newRig(t, bundleArtifact(t, "2"), 3)
	r.drv.answer = func(t Target, _ upgradeproto.Offer, _ string) (upgradeproto.Step, string) {
		if t.Name == "n02" {
			return upgradeproto.StepAwaitingConfirmation, ""
		}
		return upgradeproto.StepSucceeded, ""
	}
	r.create("m", store.UpgradeSpec{RequireConfirmation: true})
	r.waitStep("m", "n02", upgradeproto.StepAwaitingConfirmation)
	r.waitStep("m", "n00", upgradeproto.StepSucceeded)
	r.waitStep("m", "n01", upgradeproto.StepSucceeded)
	reg := prometheus.NewRegistry()
	for _, c := range r.c.Collectors() {
		reg.MustRegister(c)
	}
	want := `
# HELP tether_upgrade_bytes_pushed_total Artifact bytes the hub pushed to nodes through their tunnels.
# TYPE tether_upgrade_bytes_pushed_total counter
tether_upgrade_bytes_pushed_total 300
`
	if err := promtestutil.GatherAndCompare(reg, strings.NewReader(want),
		"tether_upgrade_bytes_pushed_total"); err != nil {
		t.Error(err)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			labels := ""
			for _, l := range m.GetLabel() {
				labels += l.GetName() + "=" + l.GetValue() + ","
			}
			switch {
			case m.GetGauge() != nil:
				got[mf.GetName()+"{"+labels+"}"] = m.GetGauge().GetValue()
			case m.GetHistogram() != nil:
				got[mf.GetName()+"{"+labels+"}"] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	for k, v := range map[string]float64{
		"tether_upgrade_rollouts{state=running,}":                                       1,
		"tether_upgrade_nodes{step=succeeded,upgrade=m,}":                               2,
		"tether_upgrade_nodes{step=awaiting_confirmation,upgrade=m,}":                   1,
		"tether_upgrade_step_duration_seconds{kind=bundle,step=pending,}":               3,
		"tether_upgrade_step_duration_seconds{kind=bundle,step=awaiting_confirmation,}": 0,
	} {
		if got[k] != v {
			t.Errorf("%s = %v, want %v", k, got[k], v)
		}
	}
}
