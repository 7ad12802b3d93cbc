package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestJobsLifecycleAndInterrupt(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		t.Parallel()
		ctx := context.Background()
		loc := b.newLoc(t)
		s, err := b.open(ctx, loc)
		if err != nil {
			t.Fatal(err)
		}
		now := time.Now().UTC().Truncate(time.Millisecond)
		spec := JobSpec{Command: "true", Parallel: 5, TimeoutSeconds: 60, MaxFailures: "10%", Role: "automation"}
		if err := s.CreateJob(ctx, Job{
			ID:        "j1",
			Kind:      "run",
			Spec:      spec,
			CreatedBy: "admin",
			State:     JobRunning,
			CreatedAt: now,
		}, refs("a", "b", "c")); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateJob(ctx, Job{
			ID:        "j2",
			Kind:      "run",
			Spec:      JobSpec{Command: "x"},
			State:     JobRunning,
			CreatedAt: now.Add(time.Second),
		}, refs("a")); err != nil {
			t.Fatal(err)
		}
		zero, one := 0, 1
		if err := s.UpdateJobNodes(ctx, []JobNode{
			{
				JobID:      "j1",
				NodeID:     "id-a",
				Node:       "a",
				State:      RunOK,
				ExitCode:   &zero,
				StartedAt:  now,
				FinishedAt: now.Add(time.Second),
				LogHead:    []byte("hello\n"),
				LogBytes:   6,
			},
			{JobID: "j1", NodeID: "id-b", Node: "b", State: RunRunning, StartedAt: now},
			{JobID: "j2", NodeID: "id-a", Node: "a", State: RunFailed, ExitCode: &one, StartedAt: now, FinishedAt: now},
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.FinishJob(ctx, "j2", JobFailed, "1 node failed", now); err != nil {
			t.Fatal(err)
		}
		j, err := s.GetJob(ctx, "j1")
		if err != nil {
			t.Fatal(err)
		}
		if j.Total != 3 || j.Counts[RunOK] != 1 || j.Counts[RunRunning] != 1 || j.Counts[RunPending] != 1 ||
			j.Spec.MaxFailures != "10%" {
			t.Fatalf("job = %+v", j)
		}
		jobs, err := s.ListJobs(ctx, JobFilter{})
		if err != nil || len(jobs) != 2 || jobs[0].ID != "j2" {
			t.Fatalf("ListJobs = %+v, %v (want newest first)", jobs, err)
		}
		if jobs, _ := s.ListJobs(ctx, JobFilter{Role: "automation"}); len(jobs) != 1 || jobs[0].ID != "j1" {
			t.Fatalf("ListJobs(role) = %+v", jobs)
		}
		n, err := s.GetJobNode(ctx, "j1", "a")
		if err != nil || string(n.LogHead) != "hello\n" || n.ExitCode == nil || *n.ExitCode != 0 {
			t.Fatalf("GetJobNode = %+v, %v", n, err)
		}
		if _, err := s.GetJobNode(ctx, "j1", "zz"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing node: %v", err)
		}
		if _, err := s.GetJob(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing job: %v", err)
		}
		s.Close()

		// A restart: the running job and its live runs become interrupted; the
		// finished ones keep their result.
		s, err = b.open(ctx, loc)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if got, err := s.InterruptJobs(ctx, now.Add(time.Minute)); err != nil || got != 1 {
			t.Fatalf("InterruptJobs = %d, %v", got, err)
		}
		j, _ = s.GetJob(ctx, "j1")
		if j.State != JobInterrupted || j.Counts[RunInterrupted] != 2 || j.Counts[RunOK] != 1 {
			t.Fatalf("after restart: %+v", j)
		}
		nodes, _ := s.ListJobNodes(ctx, "j1")
		for _, n := range nodes {
			if n.Node == "c" && !n.FinishedAt.IsZero() {
				t.Errorf("never-started run got a finish time: %+v", n)
			}
			if n.Node == "b" && (n.FinishedAt.IsZero() || n.Error == "") {
				t.Errorf("interrupted run lacks finish time or reason: %+v", n)
			}
		}
		if j2, _ := s.GetJob(ctx, "j2"); j2.State != JobFailed {
			t.Fatalf("finished job changed: %+v", j2)
		}
	})
}

func TestClusterMembersAndAPITokens(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		t.Parallel()
		ctx := context.Background()
		s := openTest(t)
		now := time.Now().UTC().Truncate(time.Millisecond)
		m := ClusterMember{NodeID: "id-n1", Engine: "k3s", Desired: "active", State: "inactive", UpdatedAt: now}
		if err := s.PutClusterMember(ctx, m); !errors.Is(err, ErrNotFound) {
			t.Fatalf("member of an unregistered node: %v, want ErrNotFound", err)
		}
		addNode(t, s, "id-n1", "n1")
		if err := s.PutClusterMember(ctx, m); err != nil {
			t.Fatal(err)
		}
		m.State, m.LastTransition, m.LastError = "registering", now, "x"
		if err := s.PutClusterMember(ctx, m); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetClusterMember(ctx, "id-n1")
		if err != nil || got.Node != "n1" || got.State != "registering" || !got.LastTransition.Equal(now) ||
			got.LastError != "x" {
			t.Fatalf("GetClusterMember = %+v, %v", got, err)
		}
		if all, _ := s.ListClusterMembers(ctx); len(all) != 1 {
			t.Fatalf("list = %+v", all)
		}

		tok := APIToken{ID: "t1", SecretHash: []byte{1, 2}, Role: "automation", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
		if err := s.CreateAPIToken(ctx, tok); err != nil {
			t.Fatal(err)
		}
		if got, err := s.GetAPIToken(ctx, "t1"); err != nil || got.Role != "automation" ||
			string(got.SecretHash) != "\x01\x02" {
			t.Fatalf("GetAPIToken = %+v, %v", got, err)
		}
		if err := s.DeleteAPIToken(ctx, "t1"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteAPIToken(ctx, "t1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}
	})
}

// A data dir may hold characters a SQLite URI treats as syntax.
func TestOpenPathWithURICharacters(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "hub 100% #1?x")
	s, err := OpenSQLite(context.Background(), filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if _, err := os.Stat(filepath.Join(dir, "tether.db")); err != nil {
		t.Fatalf("database not at the given path: %v", err)
	}
}

// refs names job targets whose IDs are "id-" + name.
func refs(names ...string) []NodeRef {
	out := make([]NodeRef, len(names))
	for i, n := range names {
		out[i] = NodeRef{ID: "id-" + n, Name: n}
	}
	return out
}

// TestListClusterMembersReadsMembersFirst checks SQLite's plan for the
// cluster controller's periodic re-read: it must walk cluster_members and
// look each member's node up, not walk every node (as it did, ordered by
// name, with no table statistics to tell it members are few). The plan is
// the point: at test sizes both orders are fast. The names must still come
// out in order.
func TestListClusterMembersReadsMembersFirst(t *testing.T) {
	ctx := context.Background()
	s, _ := openTestStore(t)
	for _, n := range []string{"n3", "n1", "n2"} {
		addNode(t, s, "id-"+n, n)
		if n != "n2" {
			if err := s.PutClusterMember(ctx, ClusterMember{
				NodeID:    "id-" + n,
				Engine:    "k3s",
				Desired:   "active",
				State:     "inactive",
				UpdatedAt: time.Now(),
			}); err != nil {
				t.Fatal(err)
			}
		}
	}
	rows, err := s.db.QueryContext(ctx, "EXPLAIN QUERY PLAN "+listMembers)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var plan []string
	for rows.Next() {
		var id, parent, unused int
		var detail string
		if err := rows.Scan(&id, &parent, &unused, &detail); err != nil {
			t.Fatal(err)
		}
		plan = append(plan, detail)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	if len(plan) == 0 || !strings.HasPrefix(plan[0], "SCAN m") ||
		slices.ContainsFunc(plan, func(d string) bool { return strings.HasPrefix(d, "SCAN n") }) {
		t.Fatalf("plan %q: want cluster_members (m) scanned and nodes (n) searched by ID", plan)
	}
	all, err := s.ListClusterMembers(ctx)
	if err != nil || len(all) != 2 || all[0].Node != "n1" || all[1].Node != "n3" {
		t.Fatalf("ListClusterMembers = %+v, %v; want n1, n3", all, err)
	}
}

// addNode registers a node through a join token of its own.
func addNode(t *testing.T, s *DB, id, name string) Node {
	t.Helper()
	ctx := context.Background()
	if err := s.CreateToken(ctx, Token{
		ID:         "tok-" + id,
		SecretHash: []byte("h"),
		UsesLeft:   1,
		ExpiresAt:  time.Now().Add(time.Hour),
	}); err != nil {
		t.Fatal(err)
	}
	n, err := s.Join(ctx, "tok-"+id, accept, Node{ID: id, Name: name})
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// A node that is removed and a new machine that joins under its name: the
// newcomer inherits neither the cluster membership (else it would get k3s
// installed as root with no operator action) nor the runs that were waiting
// for the old node, and the job engine cannot bring those runs back.
func TestRemovedNodeNameInheritsNothing(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		t.Parallel()
		ctx := context.Background()
		s := openTest(t)
		now := time.Now().UTC().Truncate(time.Millisecond)
		old := addNode(t, s, "id-old", "edge-1")
		addNode(t, s, "id-other", "edge-2")
		if err := s.PutClusterMember(ctx, ClusterMember{
			NodeID:    old.ID,
			Engine:    "k3s",
			Desired:   "active",
			State:     "active",
			UpdatedAt: now,
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutClusterMember(ctx, ClusterMember{
			NodeID:    "id-other",
			Engine:    "k3s",
			Desired:   "active",
			State:     "active",
			UpdatedAt: now,
		}); err != nil {
			t.Fatal(err)
		}
		targets := []NodeRef{{ID: old.ID, Name: old.Name}, {ID: "id-other", Name: "edge-2"}}
		if err := s.CreateJob(ctx, Job{
			ID:        "j1",
			Kind:      "run",
			Spec:      JobSpec{Command: "true", WaitOnlineSecs: 3600},
			State:     JobRunning,
			CreatedAt: now,
		}, targets); err != nil {
			t.Fatal(err)
		}
		waiting := JobNode{JobID: "j1", NodeID: old.ID, Node: old.Name, State: RunWaiting}
		if err := s.UpdateJobNodes(ctx, []JobNode{
			waiting, {JobID: "j1", NodeID: "id-other", Node: "edge-2", State: RunWaiting},
		}); err != nil {
			t.Fatal(err)
		}

		if err := s.DeleteNode(ctx, old.ID); err != nil {
			t.Fatal(err)
		}
		// A stale write from a job engine that missed the removal.
		if err := s.UpdateJobNodes(ctx, []JobNode{waiting}); err != nil {
			t.Fatal(err)
		}
		newcomer := addNode(t, s, "id-new", "edge-1")

		if m, err := s.GetClusterMember(ctx, newcomer.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("the newcomer %s inherited a cluster membership: %+v, %v", newcomer.Name, m, err)
		}
		if _, err := s.GetClusterMember(ctx, old.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("the removed node kept its cluster membership: %v", err)
		}
		if all, _ := s.ListClusterMembers(ctx); len(all) != 1 || all[0].NodeID != "id-other" {
			t.Errorf("members after the removal = %+v, want only edge-2", all)
		}
		run, err := s.GetJobNode(ctx, "j1", "edge-1")
		if err != nil {
			t.Fatal(err)
		}
		if run.State != RunSkipped || run.Error != NodeRemovedReason || run.NodeID != old.ID {
			t.Errorf("the removed node's waiting run = %+v, want skipped (%q) and bound to %s", run, NodeRemovedReason, old.ID)
		}
		if other, _ := s.GetJobNode(ctx, "j1", "edge-2"); other.State != RunWaiting {
			t.Errorf("another node's run was touched: %+v", other)
		}
		if err := s.DeleteNode(ctx, old.ID); !errors.Is(err, ErrNotFound) {
			t.Errorf("second removal: %v, want ErrNotFound", err)
		}
	})
}

// A data dir from before runs and members were keyed by node ID upgrades:
// names map to the IDs of the nodes that held them, and what belonged to a
// node that is gone (or to an earlier holder of a recycled name) is not
// handed to anyone.
func TestMigrateNamesToNodeIDs(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	// edge-3 (id-3b) joined after job j1 was created: the job's edge-3 was
	// an earlier machine under that name.
	path := dataDirAt(t, 4,
		`INSERT INTO nodes (id, name, created_at) VALUES ('id-1', 'edge-1', 1), ('id-2', 'edge-2', 1), ('id-3b', `+
			`'edge-3', 2000)`,
		`INSERT INTO cluster_members (node, engine, desired, state, updated_at) VALUES
			('edge-1', 'k3s', 'active', 'active', 3000), ('gone', 'k3s', 'active', 'install_in_progress', 5), ('edge-3', `+
			`'k3s', 'active', 'active', 5)`,
		`INSERT INTO jobs (id, kind, spec, state, created_at) VALUES ('j1', 'run', '{}', 'running', 1000)`,
		`INSERT INTO job_nodes (job_id, node, state) VALUES ('j1', 'edge-1', 'waiting'), ('j1', 'edge-2', 'ok'), ('j1', `+
			`'gone', 'failed'), ('j1', 'edge-3', 'waiting')`,
	)

	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	members, err := s.ListClusterMembers(ctx)
	if err != nil {
		t.Fatal(err)
	}
	// The member of "gone" has no node; edge-3's was last written before
	// the current edge-3 joined: both are dropped.
	var got []string
	for _, m := range members {
		got = append(got, m.NodeID+"="+m.Node)
	}
	if want := []string{"id-1=edge-1"}; !slices.Equal(got, want) {
		t.Errorf("members after migration = %v, want %v", got, want)
	}
	runs, err := s.ListJobNodes(ctx, "j1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]string{ // name -> node ID, state
		"edge-1": {"id-1", RunWaiting},
		"edge-2": {"id-2", RunOK},
		"gone":   {"", RunFailed},  // history kept
		"edge-3": {"", RunSkipped}, // the name was taken again after the job: not the same node
	}
	for _, r := range runs {
		if w := want[r.Node]; r.NodeID != w[0] || r.State != w[1] {
			t.Errorf("run on %s after migration: node_id %q state %s, want %q %s", r.Node, r.NodeID, r.State, w[0], w[1])
		}
	}
	if len(runs) != len(want) {
		t.Errorf("runs after migration: %d, want %d", len(runs), len(want))
	}
}

// A hub that died with jobs running is down until it starts again; the
// runs it interrupted end at its last sign of life (MarkJobsAlive, or the
// job's creation), not at the restart, so their durations leave the
// downtime out. A run started after the last mark ends when it started;
// one never started gets no end; a mark after the restart (clocks) is not
// taken.
func TestInterruptedRunsLeaveTheDowntimeOut(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		t.Parallel()
		ctx := context.Background()
		s := openTest(t)
		for _, n := range []string{"a", "b", "c"} {
			addNode(t, s, "id-"+n, n)
		}
		t0 := time.Now().UTC().Truncate(time.Millisecond)
		for _, id := range []string{"marked", "unmarked", "future"} {
			j := Job{ID: id, Kind: "run", State: JobRunning, CreatedAt: t0, Spec: JobSpec{Command: "x", Parallel: 3}}
			if err := s.CreateJob(ctx, j, refs("a", "b", "c")); err != nil {
				t.Fatal(err)
			}
			if err := s.UpdateJobNodes(ctx, []JobNode{
				{JobID: id, NodeID: "id-a", Node: "a", State: RunRunning, StartedAt: t0.Add(time.Second)},
				{JobID: id, NodeID: "id-b", Node: "b", State: RunRunning, StartedAt: t0.Add(20 * time.Second)},
			}); err != nil {
				t.Fatal(err)
			}
		}
		alive, restart := t0.Add(10*time.Second), t0.Add(time.Hour)
		if err := s.MarkJobsAlive(ctx, []string{"marked"}, alive); err != nil {
			t.Fatal(err)
		}
		if err := s.MarkJobsAlive(ctx, []string{"future"}, restart.Add(time.Minute)); err != nil {
			t.Fatal(err)
		}
		if n, err := s.InterruptJobs(ctx, restart); err != nil || n != 3 {
			t.Fatalf("InterruptJobs = %d, %v", n, err)
		}
		for _, tc := range []struct {
			job            string
			end            time.Time
			durA, durB     time.Duration
			jobFinishedEnd time.Time
		}{
			{"marked", alive, 9 * time.Second, 0, alive},
			{"unmarked", t0, 0, 0, t0}, // ended no later than its creation's mark: 0, not the hour down
			{"future", restart, time.Hour - time.Second, time.Hour - 20*time.Second, restart},
		} {
			j, err := s.GetJob(ctx, tc.job)
			if err != nil || j.State != JobInterrupted || !j.FinishedAt.Equal(tc.jobFinishedEnd) {
				t.Fatalf("%s: %+v, %v; want interrupted, finished at %s", tc.job, j, err, tc.jobFinishedEnd)
			}
			nodes, err := s.ListJobNodes(ctx, tc.job)
			if err != nil {
				t.Fatal(err)
			}
			for _, n := range nodes {
				var want time.Duration
				switch n.Node {
				case "a":
					want = tc.durA
				case "b":
					want = tc.durB
				case "c":
					if !n.FinishedAt.IsZero() || n.Duration(restart) != 0 {
						t.Errorf("%s: the run never started got an end: %+v", tc.job, n)
					}
					continue
				}
				if got := n.Duration(restart.Add(time.Hour)); got != want || n.State != RunInterrupted {
					t.Errorf("%s/%s: %s, duration %s; want interrupted after %s", tc.job, n.Node, n.State, got, want)
				}
			}
		}
	})
}
