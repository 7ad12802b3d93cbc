package notify

import (
	"context"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/store"
)

// TestChangesReachTheOtherReplicas: a change published on one replica is
// applied by the others, not again by itself, and one made before a
// replica started is not replayed to it.
func TestChangesReachTheOtherReplicas(t *testing.T) {
	db, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	if _, err := db.RecordChange(ctx, store.Change{Kind: store.ChangeAccess, Subject: "before-start"}); err != nil {
		t.Fatal(err)
	}
	applied := map[string]chan store.Change{"a": make(chan store.Change, 10), "c": make(chan store.Change, 10)}
	feeds := map[string]*Feed{}
	ready := make(chan struct{}, 2)
	for who, ch := range applied {
		f, err := New(Config{Store: readyStore{db, ready}, Origin: who, Poll: 5 * time.Millisecond,
			Apply: func(_ context.Context, cs []store.Change) {
				for _, c := range cs {
					ch <- c
				}
			}})
		if err != nil {
			t.Fatal(err)
		}
		feeds[who] = f
		go f.Run(ctx)
	}
	<-ready
	<-ready
	if err := feeds["a"].Publish(ctx, store.ChangeNodeRevoked, "node-7"); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-applied["c"]:
		if c.Kind != store.ChangeNodeRevoked || c.Subject != "node-7" || c.Origin != "a" {
			t.Fatalf("replica c applied %+v, want node-7's revocation from a", c)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("replica c never applied the change")
	}
	// a's own change and the one from before the start are not applied:
	// publish a marker from c and check it is the first thing a sees.
	if err := feeds["c"].Publish(ctx, store.ChangeWork, "marker"); err != nil {
		t.Fatal(err)
	}
	select {
	case c := <-applied["a"]:
		if c.Subject != "marker" {
			t.Fatalf("replica a applied %+v first, want only c's marker", c)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("replica a never applied c's change")
	}
}

// readyStore signals when a feed has read where it starts.
type readyStore struct {
	*store.DB
	ready chan<- struct{}
}

func (r readyStore) LastChange(ctx context.Context) (int64, error) {
	seq, err := r.DB.LastChange(ctx)
	r.ready <- struct{}{}
	return seq, err
}
