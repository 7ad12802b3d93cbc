package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// TestSeenGroupCommit: writes that arrive while a commit runs share the
// next one, and each caller still gets its own write's outcome: a missing
// node fails alone, two writes for one node apply in the order they came,
// and every other row says what its write said.
func TestSeenGroupCommit(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		const nodes = 40
		for i := range nodes {
			addNode(t, s, fmt.Sprint("id", i), fmt.Sprint("n", i))
		}
		at := time.Now().Truncate(time.Second)

		// Hold the commit as a running commit would: everything below
		// queues, and the first caller to get the commit writes it all.
		s.seen.commit.Lock()
		var wg sync.WaitGroup
		errs := make([]error, nodes+1)
		for i := range nodes {
			wg.Go(func() {
				errs[i] = s.UpdateNodeSeen(ctx, fmt.Sprint("id", i), Seen{
					Online:    i%2 == 0,
					Transport: fmt.Sprint("t", i),
					At:        at.Add(time.Duration(i) * time.Second),
				})
			})
		}
		wg.Go(func() { errs[nodes] = s.UpdateNodeSeen(ctx, "missing", Seen{Online: true, At: at}) })
		waitPending(t, s, nodes+1)
		// A second write for id0 queued after the first: it wins.
		second := make(chan error, 1)
		go func() { second <- s.UpdateNodeSeen(ctx, "id0", Seen{Online: false, At: at.Add(time.Hour)}) }()
		waitPending(t, s, nodes+2)
		s.seen.commit.Unlock()
		wg.Wait()
		if err := <-second; err != nil {
			t.Fatalf("second write for id0: %v", err)
		}

		for i := range nodes {
			if errs[i] != nil {
				t.Fatalf("write %d: %v", i, errs[i])
			}
		}
		if !errors.Is(errs[nodes], ErrNotFound) {
			t.Fatalf("write for a missing node: %v, want ErrNotFound", errs[nodes])
		}
		for i := 1; i < nodes; i++ {
			n, err := s.GetNode(ctx, fmt.Sprint("id", i))
			if err != nil {
				t.Fatal(err)
			}
			if n.Online != (i%2 == 0) || n.Transport != fmt.Sprint("t", i) ||
				!n.LastSeen.Equal(at.Add(time.Duration(i)*time.Second)) {
				t.Fatalf("node %d after the group commit: online=%v transport=%q last_seen=%v", i, n.Online, n.Transport,
					n.LastSeen)
			}
		}
		if n, _ := s.GetNode(ctx, "id0"); n.Online || !n.LastSeen.Equal(at.Add(time.Hour)) || n.Transport != "t0" {
			t.Fatalf("id0: online=%v last_seen=%v transport=%q, want the later write's offline at %v, transport kept", n.Online,
				n.LastSeen, n.Transport, at.Add(time.Hour))
		}
	})
}

func waitPending(t *testing.T, s *DB, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		s.seen.mu.Lock()
		k := len(s.seen.pending)
		s.seen.mu.Unlock()
		if k >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d writes pending after 10 s, want %d", k, n)
		}
		time.Sleep(time.Millisecond)
	}
}
