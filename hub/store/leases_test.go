package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestLeaseAcquireRenewTakeover(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		a, err := s.AcquireLease(ctx, LeaderLease, "r-a", time.Hour)
		if err != nil || a.Epoch != 1 || a.Holder != "r-a" {
			t.Fatalf("first acquire = %+v, %v; want r-a at epoch 1", a, err)
		}
		if _, err := s.AcquireLease(ctx, LeaderLease, "r-b", time.Hour); !errors.Is(err, ErrLeaseHeld) {
			t.Fatalf("acquire of a held lease: %v, want ErrLeaseHeld", err)
		}
		// The same holder again (a restarted replica): a new term.
		again, err := s.AcquireLease(ctx, LeaderLease, "r-a", time.Hour)
		if err != nil || again.Epoch != 2 {
			t.Fatalf("holder's re-acquire = %+v, %v; want epoch 2", again, err)
		}
		if _, err := s.RenewLease(ctx, a, time.Hour); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("renew of the previous term: %v, want ErrLeaseLost", err)
		}
		if a, err = s.RenewLease(ctx, again, time.Hour); err != nil || a.Epoch != 2 {
			t.Fatalf("renew = %+v, %v", a, err)
		}
		// Released: the successor need not wait, and gets a new epoch.
		if err := s.ReleaseLease(ctx, a); err != nil {
			t.Fatal(err)
		}
		b, err := s.AcquireLease(ctx, LeaderLease, "r-b", time.Hour)
		if err != nil || b.Epoch != 3 {
			t.Fatalf("acquire after release = %+v, %v; want r-b at epoch 3", b, err)
		}
		if _, err := s.RenewLease(ctx, a, time.Hour); !errors.Is(err, ErrLeaseLost) {
			t.Fatalf("renew by the deposed holder: %v, want ErrLeaseLost", err)
		}
		// Expired: anyone takes it over, with a new epoch.
		short, err := s.AcquireLease(ctx, "other", "r-a", time.Millisecond)
		if err != nil {
			t.Fatal(err)
		}
		deadline := short.Expires.Add(2 * time.Millisecond)
		for time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		c, err := s.AcquireLease(ctx, "other", "r-c", time.Hour)
		if err != nil || c.Epoch != short.Epoch+1 {
			t.Fatalf("takeover of an expired lease = %+v, %v", c, err)
		}
		ls, err := s.ListLeases(ctx, "oth")
		if err != nil || len(ls) != 1 || ls[0].Holder != "r-c" {
			t.Fatalf("ListLeases = %+v, %v", ls, err)
		}
	})
}

// TestFencedWritesRefusedAfterTakeover is the fencing contract: a leader
// deposed while it slept cannot write the singletons' state.
func TestFencedWritesRefusedAfterTakeover(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		old, err := s.AcquireLease(ctx, LeaderLease, "r-a", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		oldCtx := WithFence(ctx, Fence{Lease: LeaderLease, Holder: old.Holder, Epoch: old.Epoch})
		now := time.Now()
		create := func(ctx context.Context, id string) error {
			return s.CreateJob(ctx, Job{
				ID:        id,
				Kind:      "run",
				Spec:      JobSpec{Command: "true"},
				State:     JobRunning,
				CreatedAt: now,
			}, refs("a"))
		}
		if err := create(oldCtx, "j-before"); err != nil {
			t.Fatalf("write by the current leader: %v", err)
		}
		if err := s.ReleaseLease(ctx, old); err != nil { // the leader "sleeps"; another takes over
			t.Fatal(err)
		}
		nu, err := s.AcquireLease(ctx, LeaderLease, "r-b", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		newCtx := WithFence(ctx, Fence{Lease: LeaderLease, Holder: nu.Holder, Epoch: nu.Epoch})
		for _, tc := range []struct {
			name  string
			write func(ctx context.Context) error
		}{
			{"create job", func(ctx context.Context) error { return create(ctx, "j-"+fenceHolder(ctx)) }},
			{"interrupt orphaned jobs",
				func(ctx context.Context) error { _, err := s.InterruptOrphanedJobs(ctx, 0, now); return err }},
			{"upgrade state", func(ctx context.Context) error {
				if err := s.SetUpgradeState(ctx, "nope", UpgradeRunning, "", now); errors.Is(err, ErrNotFound) {
					return nil // the fence passed; there is just no such upgrade
				} else {
					return err
				}
			}},
		} {
			if err := tc.write(oldCtx); !errors.Is(err, ErrFenced) {
				t.Errorf("%s by the deposed leader: %v, want ErrFenced", tc.name, err)
			}
			if err := tc.write(newCtx); err != nil {
				t.Errorf("%s by the new leader: %v", tc.name, err)
			}
		}
		if _, err := s.GetJob(ctx, "j-r-a"); !errors.Is(err, ErrNotFound) {
			t.Errorf("the deposed leader's job was stored: %v", err)
		}
	})
}

// fenceHolder names the holder of ctx's fence.
func fenceHolder(ctx context.Context) string { f, _ := FenceFrom(ctx); return f.Holder }

func TestInterruptOrphanedJobsOnlyDeadReplicas(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		now := time.Now()
		if _, err := s.AcquireLease(ctx, ReplicaLeasePrefix+"alive", "alive", time.Hour); err != nil {
			t.Fatal(err)
		}
		dead, err := s.AcquireLease(ctx, ReplicaLeasePrefix+"dead", "dead", time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if err := s.ReleaseLease(ctx, dead); err != nil {
			t.Fatal(err)
		}
		for _, owner := range []string{"alive", "dead", "never-seen", ""} {
			j := Job{
				ID:        "j-" + owner,
				Kind:      "run",
				Spec:      JobSpec{Command: "true"},
				State:     JobRunning,
				CreatedAt: now,
				Owner:     owner,
			}
			if err := s.CreateJob(ctx, j, refs("a")); err != nil {
				t.Fatal(err)
			}
		}
		// Within the grace a lapsed lease still counts (its replica may
		// take it again after a database outage); no lease at all does not.
		n, err := s.InterruptOrphanedJobs(ctx, time.Hour, time.Now())
		if err != nil || n != 1 {
			t.Fatalf("InterruptOrphanedJobs with a grace = %d, %v; want 1 (never-seen)", n, err)
		}
		n, err = s.InterruptOrphanedJobs(ctx, 0, time.Now())
		if err != nil || n != 1 {
			t.Fatalf("InterruptOrphanedJobs = %d, %v; want 1 (dead)", n, err)
		}
		for owner, want := range map[string]string{
			"alive": JobRunning, "dead": JobInterrupted, "never-seen": JobInterrupted, "": JobRunning,
		} {
			j, err := s.GetJob(ctx, "j-"+owner)
			if err != nil || j.State != want || j.Owner != owner {
				t.Errorf("job of %q: %s owner %q, %v; want %s", owner, j.State, j.Owner, err, want)
			}
		}
		runs, err := s.ListJobNodes(ctx, "j-dead")
		if err != nil || len(runs) != 1 || runs[0].State != RunInterrupted {
			t.Errorf("dead replica's runs = %+v, %v; want interrupted (resumable by rerun)", runs, err)
		}
		if n, err := s.InterruptJobsOf(ctx, []string{"", "alive"}, now); err != nil || n != 2 {
			t.Errorf("InterruptJobsOf = %d, %v; want 2", n, err)
		}
	})
}

func TestChangeFeed(t *testing.T) {
	t.Parallel()
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		if seq, err := s.LastChange(ctx); err != nil || seq != 0 {
			t.Fatalf("LastChange of an empty feed = %d, %v", seq, err)
		}
		var seqs []int64
		for _, c := range []Change{
			{Kind: ChangeAccess, Origin: "r-a"},
			{Kind: ChangeNodeRevoked, Subject: "node-id", Origin: "r-b"},
			{Kind: ChangeWork},
		} {
			seq, err := s.RecordChange(ctx, c)
			if err != nil {
				t.Fatal(err)
			}
			seqs = append(seqs, seq)
		}
		got, err := s.ChangesSince(ctx, seqs[0], 10)
		if err != nil || len(got) != 2 || got[0].Kind != ChangeNodeRevoked || got[0].Subject != "node-id" ||
			got[0].Origin != "r-b" || got[1].Seq != seqs[2] {
			t.Fatalf("ChangesSince = %+v, %v", got, err)
		}
		if last, err := s.LastChange(ctx); err != nil || last != seqs[2] {
			t.Fatalf("LastChange = %d, %v; want %d", last, err, seqs[2])
		}
	})
}
