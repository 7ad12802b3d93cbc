package leader

import (
	"context"
	"errors"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/store"
)

// failingStore fails every lease call while broken: a leader cut off from the
// database (or stalled) as its peers see it.
type failingStore struct {
	Store
	broken atomic.Bool
}

func (f *failingStore) RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error) {
	if f.broken.Load() {
		return l, errors.New("connection refused")
	}
	return f.Store.RenewLease(ctx, l, ttl)
}

func (f *failingStore) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error) {
	if f.broken.Load() {
		return store.Lease{}, errors.New("connection refused")
	}
	return f.Store.AcquireLease(ctx, name, holder, ttl)
}

type term struct {
	who   string
	epoch int64
	ctx   context.Context
}

func campaign(t *testing.T, ctx context.Context, s Store, who string, terms chan<- term) context.CancelFunc {
	t.Helper()
	e, err := New(Config{Store: s, Lease: store.LeaderLease, Holder: who, TTL: 600 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		e.Run(ctx, func(ctx context.Context) {
			f, _ := store.FenceFrom(ctx)
			terms <- term{who: who, epoch: f.Epoch, ctx: ctx}
			<-ctx.Done()
		})
	}()
	return func() { cancel(); <-done }
}

func next(t *testing.T, terms <-chan term) term {
	t.Helper()
	select {
	case tm := <-terms:
		return tm
	case <-time.After(20 * time.Second):
		t.Fatal("no replica became leader")
		return term{}
	}
}

func TestLeadershipMovesWithANewEpoch(t *testing.T) {
	db, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	terms := make(chan term, 10)
	a := &failingStore{Store: db}
	stopA := campaign(t, ctx, a, "a", terms)
	defer stopA()
	first := next(t, terms)
	if first.who != "a" || first.epoch != 1 {
		t.Fatalf("first term = %s at epoch %d, want a at 1", first.who, first.epoch)
	}
	stopB := campaign(t, ctx, db, "b", terms)
	defer stopB()
	stopC := campaign(t, ctx, db, "c", terms)
	defer stopC()

	// The leader is cut off from the store: it steps down on its own, and
	// another replica leads with a new epoch.
	a.broken.Store(true)
	second := next(t, terms)
	if second.who == "a" || second.epoch != 2 {
		t.Fatalf("after the leader was cut off: %s leads at epoch %d, want b or c at 2", second.who, second.epoch)
	}
	select {
	case <-first.ctx.Done():
	case <-time.After(20 * time.Second):
		t.Fatal("the cut-off leader did not stop its work")
	}
	// Its late writes are refused.
	late := store.WithFence(ctx, store.Fence{Lease: store.LeaderLease, Holder: "a", Epoch: first.epoch})
	if err := db.SetUpgradeState(late, "x", store.UpgradeRunning, "", time.Now()); !errors.Is(err, store.ErrFenced) {
		t.Fatalf("write of the deposed leader: %v, want ErrFenced", err)
	}

	// A clean stop releases the lease; the last replica leads next.
	if second.who == "b" {
		stopB()
	} else {
		stopC()
	}
	third := next(t, terms)
	if third.who == second.who || third.epoch != 3 {
		t.Fatalf("after a clean stop: %s leads at epoch %d, want the other replica at 3", third.who, third.epoch)
	}
}

// TestTryHoldOncePerFleet: work held by one replica's lease (a KubeOne run
// of one cluster) is refused to another until it is released.
func TestTryHoldOncePerFleet(t *testing.T) {
	db, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx := context.Background()
	// A TTL far above scheduling delays on a loaded machine: what is
	// asserted is that renewals happen, not how promptly.
	const ttl = 1500 * time.Millisecond
	cfg := func(who string) Config {
		return Config{Store: db, Lease: "kubeone/c1", Holder: who, TTL: ttl}
	}
	release, err := TryHold(ctx, cfg("a"))
	if err != nil {
		t.Fatal(err)
	}
	held := func() store.Lease {
		t.Helper()
		ls, err := db.ListLeases(ctx, "kubeone/c1")
		if err != nil || len(ls) != 1 {
			t.Fatalf("leases: %v %v", ls, err)
		}
		return ls[0]
	}
	first := held()
	// Renewals keep it past its first expiry: wait (bounded) until the
	// clock is past that expiry while the store shows the lease still a's
	// and running.
	deadline := time.Now().Add(15 * time.Second)
	for {
		l := held()
		if now := time.Now(); now.After(first.Expires) && l.Holder == "a" && l.Expires.After(now) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("lease not renewed past its first expiry %v: %+v", first.Expires, l)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := TryHold(ctx, cfg("b")); !errors.Is(err, store.ErrLeaseHeld) {
		t.Fatalf("second holder while the first holds: %v, want ErrLeaseHeld", err)
	}
	release()
	release() // twice is harmless
	again, err := TryHold(ctx, cfg("b"))
	if err != nil {
		t.Fatalf("after release: %v", err)
	}
	again()
}
