package mission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

var (
	selfID   = strings.Repeat("1", 64)
	parentID = strings.Repeat("2", 64)
	rootID   = strings.Repeat("3", 64)
)

func TestPlacesHub(t *testing.T) {
	cases := []struct {
		sites []string
		rel   string
		want  bool
	}{
		{nil, "", true},
		{nil, "berlin", true},
		{[]string{"berlin"}, "", false},
		{[]string{"berlin"}, "berlin", true},
		{[]string{"berlin"}, "sub.berlin", true},
		{[]string{"berlin"}, "munich", false},
		{[]string{"berlin"}, "xberlin", false},
		{[]string{"sub.berlin"}, "berlin", false},
		{[]string{"sub.berlin"}, "sub.berlin", true},
		{[]string{"munich", "berlin"}, "berlin", true},
	}
	for _, c := range cases {
		if got := (Placement{Sites: c.sites}).PlacesHub(c.rel); got != c.want {
			t.Errorf("sites %v at %q: %v, want %v", c.sites, c.rel, got, c.want)
		}
	}
}

func TestMatchesNode(t *testing.T) {
	cases := []struct {
		match  map[string]string
		rel    string
		labels map[string]string
		want   bool
	}{
		{nil, "", nil, true},
		{map[string]string{"role": "pos"}, "", map[string]string{"role": "pos"}, true},
		{map[string]string{"role": "pos"}, "", map[string]string{"role": "db"}, false},
		{map[string]string{"role": "pos"}, "", nil, false},
		{map[string]string{"role": "pos", "zone": "a"}, "", map[string]string{"role": "pos"}, false},
		// Below the origin the node carries site=PATH, replacing its own.
		{map[string]string{"site": "berlin"}, "berlin", map[string]string{"site": "elsewhere"}, true},
		{map[string]string{"site": "berlin"}, "munich", nil, false},
		{map[string]string{"site": "berlin"}, "", map[string]string{"site": "berlin"}, true},
	}
	for _, c := range cases {
		if got := (Placement{MatchLabels: c.match}).MatchesNode(c.rel, c.labels); got != c.want {
			t.Errorf("match %v at %q on %v: %v, want %v", c.match, c.rel, c.labels, got, c.want)
		}
	}
}

func TestRelativePath(t *testing.T) {
	cases := []struct {
		origin, path string
		ancestors    []string
		want         string
		ok           bool
	}{
		{selfID, "", nil, "", true},
		{parentID, "berlin.region", []string{parentID, rootID}, "berlin", true},
		{rootID, "berlin.region", []string{parentID, rootID}, "berlin.region", true},
		{strings.Repeat("9", 64), "berlin.region", []string{parentID, rootID}, "", false},
		{rootID, "", []string{parentID, rootID}, "", false},
	}
	for _, c := range cases {
		got, ok := RelativePath(selfID, c.origin, c.path, c.ancestors)
		if got != c.want || ok != c.ok {
			t.Errorf("origin %.4s path %q: %q %v, want %q %v", c.origin, c.path, got, ok, c.want, c.ok)
		}
	}
}

func TestSpecValidate(t *testing.T) {
	ok := Spec{
		Script:    "echo hi",
		Placement: Placement{Sites: []string{"berlin", "sub.berlin"}, MatchLabels: map[string]string{"role": "pos"}},
	}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	bad := []Spec{
		{},
		{Script: strings.Repeat("x", MaxScript+1)},
		{Script: "x", StateCheck: strings.Repeat("x", MaxStateCheck+1)},
		{Script: "x", CheckIntervalSeconds: 1},
		{Script: "x", TimeoutSeconds: -1},
		{Script: "x", Placement: Placement{Sites: []string{"Berlin"}}},
		{Script: "x", Placement: Placement{Sites: []string{"a..b"}}},
		{Script: "x", Placement: Placement{MatchLabels: map[string]string{"bad key!": "v"}}},
		{Script: "a\x00b"},
	}
	for i, s := range bad {
		if err := s.Validate(); !errors.Is(err, ErrInvalid) {
			t.Errorf("case %d: %v, want ErrInvalid", i, err)
		}
	}
}

// fakeConn runs "scripts" by recording them; exit codes by node.
type fakeNodes struct {
	mu    sync.Mutex
	runs  map[string][]string // node ID -> scripts run, in order
	exit  map[string]int      // script+node -> exit code
	block chan struct{}       // when set, runs of "slow" wait on it
}

type fakeConn struct {
	f  *fakeNodes
	id string
}

func (f *fakeNodes) connect(_ context.Context, nodeID string) (jobs.Conn, error) {
	return fakeConn{f, nodeID}, nil
}

func (f *fakeNodes) count(nodeID, script string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := 0
	for _, s := range f.runs[nodeID] {
		if s == script {
			n++
		}
	}
	return n
}

func (c fakeConn) Run(ctx context.Context, cmd jobs.Command, stdout, stderr io.Writer) (int, error) {
	script := string(cmd.Script)
	c.f.mu.Lock()
	c.f.runs[c.id] = append(c.f.runs[c.id], script)
	code := c.f.exit[script+"@"+c.id]
	c.f.mu.Unlock()
	if cmd.Env[EnvMission] == "" {
		return 1, errors.New("no mission in the environment")
	}
	fmt.Fprintf(stdout, "ran %s on %s\n", script, c.id)
	return code, nil
}

func (fakeConn) Upload(context.Context, io.Reader, int64, string, os.FileMode, bool) (string, error) {
	return "", errors.New("no uploads")
}
func (fakeConn) Exists(context.Context, string) (bool, error) { return false, nil }
func (fakeConn) Close() error                                 { return nil }

type rig struct {
	t      *testing.T
	st     *store.DB
	nodes  *fakeNodes
	m      *Manager
	engine *jobs.Engine
	clock  *clock
	path   string
}

type clock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *clock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// newRig opens (or reopens) a hub's store at path with a manager and a
// real job engine whose mission runs go to fake nodes.
func newRig(t *testing.T, path string, nodes *fakeNodes) *rig {
	t.Helper()
	st, err := store.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, st: st, nodes: nodes, clock: &clock{now: time.Now()}, path: path}
	r.m, err = New(Config{Store: st, HubID: selfID, Connect: nodes.connect, Now: r.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.engine = jobs.New(ctx, jobs.Config{
		Store:   st,
		Connect: nodes.connect,
		Local:   map[string]jobs.Local{JobKind: r.m.Local()},
	})
	r.m.AttachJobs(r.engine)
	t.Cleanup(func() {
		cancel()
		r.engine.Close()
		r.m.wg.Wait()
		st.Close()
	})
	return r
}

func (r *rig) addNode(id, name string, labels map[string]string) {
	r.t.Helper()
	ctx := context.Background()
	if err := r.st.CreateToken(ctx, store.Token{
		ID:         "tok-" + id,
		SecretHash: []byte("h"),
		UsesLeft:   1,
		ExpiresAt:  time.Now().Add(time.Hour),
		Labels:     labels,
	}); err != nil {
		r.t.Fatal(err)
	}
	if _, err := r.st.Join(ctx, "tok-"+id, func(store.Token) error { return nil },
		store.Node{ID: id, Name: name}); err != nil {
		r.t.Fatal(err)
	}
}

func (r *rig) put(name string, gen int64, spec Spec) {
	r.t.Helper()
	raw, _ := json.Marshal(spec)
	if _, err := r.st.StoreDesired(context.Background(), siteproto.DesiredObject{
		Kind:       Kind,
		Origin:     selfID,
		Name:       name,
		Generation: gen,
		Spec:       raw,
	}, time.Now()); err != nil {
		r.t.Fatal(err)
	}
}

// settle reconciles and waits (bounded) until no node of the mission is
// pending or running on an online node.
func (r *rig) settle(name string, want map[string]string) []store.MissionNode {
	r.t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := r.m.Reconcile(ctx); err != nil {
			r.t.Fatal(err)
		}
		recs, err := r.st.ListMissionNodes(ctx, selfID, name)
		if err != nil {
			r.t.Fatal(err)
		}
		got := map[string]string{}
		for _, rec := range recs {
			got[rec.Node] = rec.Phase
		}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return recs
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("mission %s nodes: %v, want %v", name, got, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestOncePerGeneration: placement by labels selects the nodes; each runs
// a generation once however often placement is evaluated; a new
// generation runs again; a generation that no longer places a node drops
// its record.
func TestOncePerGeneration(t *testing.T) {
	nodes := &fakeNodes{runs: map[string][]string{}, exit: map[string]int{"v1@id3": 0}}
	r := newRig(t, filepath.Join(t.TempDir(), "hub.db"), nodes)
	r.addNode("id1", "n1", map[string]string{"role": "pos"})
	r.addNode("id2", "n2", map[string]string{"role": "pos"})
	r.addNode("id3", "n3", map[string]string{"role": "db"})
	nodes.exit["v1@id2"] = 3

	r.put("m", 1, Spec{Script: "v1", Placement: Placement{MatchLabels: map[string]string{"role": "pos"}}})
	recs := r.settle("m", map[string]string{"n1": store.MissionApplied, "n2": store.MissionFailed})
	for _, rec := range recs {
		if rec.Node == "n2" && rec.Error != "exit status 3" {
			t.Errorf("n2 error = %q", rec.Error)
		}
	}
	for range 3 {
		if err := r.m.Reconcile(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	r.m.wg.Wait()
	if a, b, c := nodes.count("id1", "v1"), nodes.count("id2", "v1"),
		nodes.count("id3", "v1"); a != 1 || b != 1 || c != 0 {
		t.Fatalf("runs of generation 1: n1 %d, n2 %d, n3 %d; want 1, 1 (failed: not retried), 0", a, b, c)
	}

	// Generation 2 places n1 and n3 (role in any): n2's record goes.
	r.put("m", 2, Spec{Script: "v2"})
	r.settle("m", map[string]string{"n1": store.MissionApplied, "n2": store.MissionApplied, "n3": store.MissionApplied})
	r.put("m", 3, Spec{Script: "v3", Placement: Placement{MatchLabels: map[string]string{"role": "db"}}})
	r.settle("m", map[string]string{"n3": store.MissionApplied})
	if n := nodes.count("id1", "v2") + nodes.count("id2", "v2") + nodes.count("id3", "v2") +
		nodes.count("id3", "v3"); n != 4 {
		t.Errorf("runs of generations 2 and 3: %d, want 4", n)
	}

	// A placement that names sites does not take the origin's own nodes.
	r.put("m", 4, Spec{Script: "v4", Placement: Placement{Sites: []string{"berlin"}}})
	r.settle("m", map[string]string{})

	// A tombstone drops the mission's records.
	r.put("other", 1, Spec{Script: "o"})
	r.settle("other", map[string]string{
		"n1": store.MissionApplied, "n2": store.MissionApplied, "n3": store.MissionApplied,
	})
	if _, err := r.st.StoreDesired(context.Background(), siteproto.DesiredObject{
		Kind:       Kind,
		Origin:     selfID,
		Name:       "other",
		Generation: 2,
		Deleted:    true,
	}, time.Now()); err != nil {
		t.Fatal(err)
	}
	r.settle("other", map[string]string{})
}

// TestInterruptedNotRerun: a hub that died while a node's run was live
// (its record running) marks it failed at start and never runs it again;
// a node whose run had not started (pending) runs after the restart.
func TestInterruptedNotRerun(t *testing.T) {
	path := filepath.Join(t.TempDir(), "hub.db")
	nodes := &fakeNodes{runs: map[string][]string{}, exit: map[string]int{}}
	r := newRig(t, path, nodes)
	r.addNode("id1", "n1", nil)
	r.addNode("id2", "n2", nil)
	r.put("m", 1, Spec{Script: "v1"})
	ctx := context.Background()
	// The previous process planned both nodes and started n1's run, then
	// was killed: n1's script may be running on the node.
	for _, id := range []string{"id1", "id2"} {
		if _, err := r.st.PlanMissionNode(ctx, store.MissionNode{
			Origin:     selfID,
			Mission:    "m",
			NodeID:     id,
			Node:       "n" + id[2:],
			Generation: 1,
			UpdatedAt:  time.Now(),
		}); err != nil {
			t.Fatal(err)
		}
	}
	if ok, err := r.st.StartMissionNode(ctx, selfID, "m", "id1", 1, "job-before-kill", time.Now()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	// Another replica on the same store runs mission o on n3 right now:
	// its record is running under a job that is running; it is left alone.
	r.addNode("id3", "n3", map[string]string{"role": "elsewhere"})
	if err := r.st.CreateJob(ctx, store.Job{
		ID:        "live",
		Kind:      JobKind,
		State:     store.JobRunning,
		CreatedAt: time.Now(),
		Owner:     "other-replica",
		Spec:      store.JobSpec{Script: "o", Parallel: 1, TimeoutSeconds: 60},
	}, []store.NodeRef{{ID: "id3", Name: "n3"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := r.st.PlanMissionNode(ctx, store.MissionNode{
		Origin:     selfID,
		Mission:    "o",
		NodeID:     "id3",
		Node:       "n3",
		Generation: 1,
		UpdatedAt:  time.Now(),
	}); err != nil {
		t.Fatal(err)
	}
	if ok, err := r.st.StartMissionNode(ctx, selfID, "o", "id3", 1, "live", time.Now()); err != nil || !ok {
		t.Fatal(ok, err)
	}
	n, err := r.m.Recover(ctx)
	if err != nil || n != 1 {
		t.Fatalf("recover = %d, %v; want 1", n, err)
	}
	if recs, _ := r.st.ListMissionNodes(ctx, selfID, "o"); len(recs) != 1 || recs[0].Phase != store.MissionRunning {
		t.Errorf("a run live under another replica's job = %+v, want it left running", recs)
	}
	recs := r.settle("m", map[string]string{
		"n1": store.MissionFailed, "n2": store.MissionApplied, "n3": store.MissionApplied,
	})
	for _, rec := range recs {
		if rec.Node == "n1" && rec.Error != InterruptedReason {
			t.Errorf("n1 error = %q", rec.Error)
		}
	}
	r.m.wg.Wait()
	if a, b := nodes.count("id1", "v1"), nodes.count("id2", "v1"); a != 0 || b != 1 {
		t.Errorf("runs after the restart: n1 %d (want 0: it was live at the kill), n2 %d (want 1)", a, b)
	}
	// The engine's own gate: a run handed over twice starts once.
	code, err := r.m.Local().Run(ctx, store.Job{ID: "again", Spec: store.JobSpec{Script: "v1",
		Env: map[string]string{EnvMission: "m", EnvOrigin: selfID, EnvGeneration: "1"}}}, "id2", io.Discard, io.Discard)
	if err != nil || code != 0 || nodes.count("id2", "v1") != 1 {
		t.Errorf("second hand-over: code %d, %v, runs %d; want it refused without running", code, err,
			nodes.count("id2", "v1"))
	}
}

// TestStateCheck: the check runs after the run, records ok or failed,
// and again only when the interval has passed.
func TestStateCheck(t *testing.T) {
	nodes := &fakeNodes{runs: map[string][]string{}, exit: map[string]int{"check@id2": 1}}
	r := newRig(t, filepath.Join(t.TempDir(), "hub.db"), nodes)
	r.addNode("id1", "n1", nil)
	r.addNode("id2", "n2", nil)
	r.put("m", 1, Spec{Script: "v1", StateCheck: "check", CheckIntervalSeconds: 30})
	r.settle("m", map[string]string{"n1": store.MissionApplied, "n2": store.MissionApplied})
	ctx := context.Background()
	checks := func() {
		r.m.runChecks(ctx)
		r.m.wg.Wait()
	}
	checks()
	recs, _ := r.st.ListMissionNodes(ctx, selfID, "m")
	got := map[string]string{}
	for _, rec := range recs {
		got[rec.Node] = rec.CheckState
	}
	if got["n1"] != CheckOK || got["n2"] != CheckFailed {
		t.Fatalf("check states = %v", got)
	}
	checks()
	if c := nodes.count("id1", "check"); c != 1 {
		t.Errorf("checks before the interval passed: %d, want 1", c)
	}
	r.clock.add(31 * time.Second)
	checks()
	if c := nodes.count("id1", "check"); c != 2 {
		t.Errorf("checks after the interval: %d, want 2", c)
	}

	// The state reports both nodes with their checks.
	states, err := r.m.States(ctx, "", "")
	if err != nil || len(states) != 1 {
		t.Fatalf("states = %+v, %v", states, err)
	}
	s := states[0]
	if !s.Placed || s.ObservedGeneration != 1 || s.Own.Applied != 2 || s.Own.CheckOK != 1 || s.Own.CheckFailed != 1 ||
		len(s.Nodes) != 2 {
		t.Errorf("state = %+v", s)
	}
}

// TestAggregate: a hub's view nests its sites' states from their nested
// statuses, totals add up, its own report carries only its nodes and the
// totals, and a stale site marks everything below it stale when flattened.
func TestAggregate(t *testing.T) {
	sub := State{Origin: rootID, Name: "m", Generation: 2, ObservedGeneration: 2, Placed: true,
		Own: Counts{Nodes: 1, Applied: 1}, Total: Counts{Nodes: 1, Applied: 1}, Nodes: []NodeState{
			{Node: "n9", Generation: 2, Phase: store.MissionApplied},
		}}
	berlin := State{Origin: rootID, Name: "m", Generation: 2, ObservedGeneration: 2, Placed: true,
		Own: Counts{Nodes: 2, Applied: 1, Failed: 1}, Total: Counts{Nodes: 3, Applied: 2, Failed: 1},
		Nodes: []NodeState{{Node: "n1", Phase: store.MissionApplied}, {Node: "n2", Phase: store.MissionFailed}}}
	subRaw, _ := json.Marshal(Report{Missions: []State{sub}})
	berlinRaw, _ := json.Marshal(Report{Missions: []State{berlin}})
	at := time.Now()
	berlinStatus := &siteproto.Status{Health: siteproto.Degraded, At: at, Missions: berlinRaw, Sites: []siteproto.SubSite{
		{
			Name:          "sub",
			Connected:     false,
			LastHeartbeat: at.Add(-time.Minute),
			Status:        &siteproto.Status{Health: siteproto.Stale, Missions: subRaw},
		}}}

	st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "hub.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	m, err := New(Config{Store: st, HubID: selfID, Connect: (&fakeNodes{}).connect,
		Where: func(origin string) (string, bool) { return "region", origin == rootID },
		Sites: func() []SiteView {
			return []SiteView{
				{Name: "berlin", Connected: true, Status: berlinStatus}, {Name: "munich", Stale: true, StaleFor: time.Minute},
			}
		}})
	if err != nil {
		t.Fatal(err)
	}
	spec, _ := json.Marshal(Spec{Script: "x", Placement: Placement{Sites: []string{"berlin.region"}}})
	if _, err := st.StoreDesired(context.Background(), siteproto.DesiredObject{
		Kind:       Kind,
		Origin:     rootID,
		Name:       "m",
		Generation: 2,
		Spec:       spec,
	}, time.Now()); err != nil {
		t.Fatal(err)
	}
	states, err := m.States(context.Background(), "", "")
	if err != nil || len(states) != 1 {
		t.Fatalf("states = %+v, %v", states, err)
	}
	got := states[0]
	if got.Total.Nodes != 3 || got.Total.Applied != 2 || got.Placed {
		t.Errorf("aggregate = %+v", got)
	}
	sites, nodes := Flatten(got)
	want := []string{"berlin false 2", "munich true 0", "sub.berlin true 1"}
	var have []string
	for _, s := range sites {
		have = append(have, fmt.Sprintf("%s %v %d", s.Path, s.Stale, s.Own.Nodes))
	}
	if fmt.Sprint(have) != fmt.Sprint(want) {
		t.Errorf("site rows = %v, want %v", have, want)
	}
	var names []string
	for _, n := range nodes {
		names = append(names, n.Node)
	}
	if fmt.Sprint(names) != "[n1.berlin n2.berlin n9.sub.berlin]" {
		t.Errorf("node rows = %v", names)
	}

	var status siteproto.Status
	m.FillStatus(context.Background(), &status)
	if len(status.ReceivedMissions) != 1 || len(status.ActiveMissions) != 0 {
		t.Errorf("received %v active %v; want one received, none active (placed on berlin only)", status.ReceivedMissions,
			status.ActiveMissions)
	}
	var rep Report
	if err := json.Unmarshal(status.Missions, &rep); err != nil || len(rep.Missions) != 1 {
		t.Fatalf("report = %s, %v", status.Missions, err)
	}
	if r := rep.Missions[0]; r.Total.Nodes != 3 || len(r.Sites) != 0 {
		t.Errorf("report = %+v: want the totals, and the sites' detail left to their nested statuses", r)
	}
}

// countingStore counts ListNodes calls.
type countingStore struct {
	*store.DB
	listNodes atomic.Int32
}

func (s *countingStore) ListNodes(ctx context.Context) ([]store.Node, error) {
	s.listNodes.Add(1)
	return s.DB.ListNodes(ctx)
}

// TestReconcileWithoutMissionsReadsNoNodes: reconciliation runs every few
// seconds, and reading every node row each time was the largest share of an
// idle hub's CPU at 10k nodes; with no mission to place it reads none.
func TestReconcileWithoutMissionsReadsNoNodes(t *testing.T) {
	ctx := context.Background()
	db, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "hub.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	st := &countingStore{DB: db}
	m, err := New(Config{Store: st, HubID: selfID, Connect: (&fakeNodes{}).connect})
	if err != nil {
		t.Fatal(err)
	}
	if err := m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if n := st.listNodes.Load(); n != 0 {
		t.Errorf("Reconcile without missions listed the nodes %d times, want 0", n)
	}
	spec, _ := json.Marshal(Spec{Script: "x", Placement: Placement{MatchLabels: map[string]string{"a": "b"}}})
	if _, err := db.StoreDesired(ctx, siteproto.DesiredObject{
		Kind:       Kind,
		Origin:     selfID,
		Name:       "m",
		Generation: 1,
		Spec:       spec,
	}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := m.Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	if n := st.listNodes.Load(); n != 1 {
		t.Errorf("Reconcile with one mission listed the nodes %d times, want 1", n)
	}
}
