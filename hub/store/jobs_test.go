package store

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestJobsLifecycleAndInterrupt(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dir := t.TempDir()
	s, err := OpenSQLite(ctx, filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Millisecond)
	spec := JobSpec{Command: "true", Parallel: 5, TimeoutSeconds: 60, MaxFailures: "10%", Role: "automation"}
	if err := s.CreateJob(ctx, Job{ID: "j1", Kind: "run", Spec: spec, CreatedBy: "admin", State: JobRunning, CreatedAt: now}, []string{"a", "b", "c"}); err != nil {
		t.Fatal(err)
	}
	if err := s.CreateJob(ctx, Job{ID: "j2", Kind: "run", Spec: JobSpec{Command: "x"}, State: JobRunning, CreatedAt: now.Add(time.Second)}, []string{"a"}); err != nil {
		t.Fatal(err)
	}
	zero, one := 0, 1
	if err := s.UpdateJobNodes(ctx, []JobNode{
		{JobID: "j1", Node: "a", State: RunOK, ExitCode: &zero, StartedAt: now, FinishedAt: now.Add(time.Second), LogHead: []byte("hello\n"), LogBytes: 6},
		{JobID: "j1", Node: "b", State: RunRunning, StartedAt: now},
		{JobID: "j2", Node: "a", State: RunFailed, ExitCode: &one, StartedAt: now, FinishedAt: now},
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
	if j.Total != 3 || j.Counts[RunOK] != 1 || j.Counts[RunRunning] != 1 || j.Counts[RunPending] != 1 || j.Spec.MaxFailures != "10%" {
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
	s, err = OpenSQLite(ctx, filepath.Join(dir, "tether.db"))
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
}

func TestClusterMembersAndAPITokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	s := openTest(t)
	now := time.Now().UTC().Truncate(time.Millisecond)
	m := ClusterMember{Node: "n1", Engine: "k3s", Desired: "active", State: "inactive", UpdatedAt: now}
	if err := s.PutClusterMember(ctx, m); err != nil {
		t.Fatal(err)
	}
	m.State, m.LastTransition, m.LastError = "registering", now, "x"
	if err := s.PutClusterMember(ctx, m); err != nil {
		t.Fatal(err)
	}
	got, err := s.GetClusterMember(ctx, "n1")
	if err != nil || got.State != "registering" || !got.LastTransition.Equal(now) || got.LastError != "x" {
		t.Fatalf("GetClusterMember = %+v, %v", got, err)
	}
	if all, _ := s.ListClusterMembers(ctx); len(all) != 1 {
		t.Fatalf("list = %+v", all)
	}
	if err := s.DeleteClusterMember(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetClusterMember(ctx, "n1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("deleted member: %v", err)
	}

	tok := APIToken{ID: "t1", SecretHash: []byte{1, 2}, Role: "automation", CreatedAt: now, ExpiresAt: now.Add(time.Hour)}
	if err := s.CreateAPIToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	if got, err := s.GetAPIToken(ctx, "t1"); err != nil || got.Role != "automation" || string(got.SecretHash) != "\x01\x02" {
		t.Fatalf("GetAPIToken = %+v, %v", got, err)
	}
	if err := s.DeleteAPIToken(ctx, "t1"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteAPIToken(ctx, "t1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
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
