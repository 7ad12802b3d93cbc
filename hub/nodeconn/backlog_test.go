package nodeconn

import (
	"context"
	"errors"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"
)

// TestFleetBacklog: the handshake queue's bound is the enrolled nodes less
// the connected ones, answered from memory; the count is read once before
// the first session, again only when a refusal finds it older than
// backlogRefresh (in the background, one count at a time), a failed count
// keeps the last good one, and nothing is counted once the hub stops.
func TestFleetBacklog(t *testing.T) {
	var calls atomic.Int32
	var enrolled atomic.Int64
	var failing atomic.Bool
	var gate atomic.Pointer[chan struct{}] // set: counts wait for it
	enrolled.Store(10)
	count := func(ctx context.Context) (int, error) {
		calls.Add(1)
		if g := gate.Load(); g != nil {
			<-*g
		}
		if failing.Load() {
			return 0, errors.New("store down")
		}
		return int(enrolled.Load()), nil
	}
	reg := NewTable()
	b := NewFleetBacklog(t.Context(), count, reg, slog.New(slog.DiscardHandler))
	if calls.Load() != 1 {
		t.Fatalf("counts before the first session = %d, want 1", calls.Load())
	}
	if w := b.Waiting(); w != 10 {
		t.Fatalf("waiting with none connected = %d, want 10", w)
	}
	for _, name := range []string{"a", "b", "c"} {
		reg.Put(NewConn(name, name, nil, nil))
	}
	if w := b.Waiting(); w != 7 {
		t.Fatalf("waiting with 3 of 10 connected = %d, want 7", w)
	}
	if calls.Load() != 1 {
		t.Fatalf("a fresh count was read again: %d counts", calls.Load())
	}

	// Stale: the next refusals start one count between them and answer
	// from memory while it runs.
	enrolled.Store(2)
	g := make(chan struct{})
	gate.Store(&g)
	b.countedAt.Store(time.Now().Add(-2 * backlogRefresh).UnixNano())
	for range 5 {
		if w := b.Waiting(); w != 7 {
			t.Fatalf("waiting while the count runs = %d, want the last answer 7", w)
		}
	}
	waitFor(t, "the count to start", 5*time.Second, func() bool { return calls.Load() == 2 })
	time.Sleep(20 * time.Millisecond)
	if n := calls.Load(); n != 2 {
		t.Fatalf("five refusals while stale started %d counts, want one", n-1)
	}
	gate.Store(nil)
	close(g)
	waitFor(t, "the background count", 5*time.Second, func() bool { return b.nodes.Load() == 2 })
	if w := b.Waiting(); w != 0 {
		t.Fatalf("waiting with more connected than enrolled = %d, want 0", w)
	}
	if calls.Load() != 2 {
		t.Fatalf("counts = %d, want 2", calls.Load())
	}

	// A failed count keeps the last good one.
	failing.Store(true)
	enrolled.Store(50)
	b.countedAt.Store(time.Now().Add(-2 * backlogRefresh).UnixNano())
	b.Waiting()
	waitFor(t, "the failed count", 5*time.Second, func() bool {
		b.mu.Lock()
		defer b.mu.Unlock()
		return calls.Load() == 3 && !b.counting
	})
	if n := b.nodes.Load(); n != 2 {
		t.Fatalf("enrolled after a failed count = %d, want the last good 2", n)
	}

	// Stopped: no more counts, whatever the age.
	failing.Store(false)
	b.Wait()
	b.countedAt.Store(time.Now().Add(-2 * backlogRefresh).UnixNano())
	b.Waiting()
	time.Sleep(50 * time.Millisecond)
	if calls.Load() != 3 {
		t.Fatalf("counts after wait = %d, want 3", calls.Load())
	}
}

// TestFleetBacklogUnknown: before the store has ever answered, the bound is
// unknown (-1) rather than zero, which would ask every refused agent back
// in a second.
func TestFleetBacklogUnknown(t *testing.T) {
	b := NewFleetBacklog(
		t.Context(),
		func(context.Context) (int, error) { return 0, errors.New("store down") },
		NewTable(),
		slog.New(slog.DiscardHandler),
	)
	defer b.Wait()
	if w := b.Waiting(); w != -1 {
		t.Fatalf("waiting with no count = %d, want -1", w)
	}
}

// waitFor polls cond until it holds or timeout passes (internal/testenv
// would import this package back through the hub's features).
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(timeout); !cond(); time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %v waiting for %s", timeout, what)
		}
	}
}
