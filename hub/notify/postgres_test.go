package notify

import (
	"context"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/testenv/pgtest"
)

// TestPGNudger: on PostgreSQL a change recorded in the store (which sends
// NOTIFY in the change's own transaction) reaches a replica listening on
// its own connection.
func TestPGNudger(t *testing.T) {
	srv := pgtest.Own(t)
	dsn, err := srv.CreateDB("nudge")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	db, err := store.OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	n := NewPGNudger(dsn)
	calls := make(chan struct{}, 10)
	done := make(chan error, 1)
	go func() { done <- n.Listen(ctx, func() { calls <- struct{}{} }) }()
	select { // Listen calls fn once when it starts listening
	case <-calls:
	case err := <-done:
		t.Fatalf("listen: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("listener never started")
	}
	if _, err := db.RecordChange(ctx, store.Change{Kind: store.ChangeAccess, Origin: "elsewhere"}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-calls:
	case err := <-done:
		t.Fatalf("listen: %v", err)
	case <-time.After(30 * time.Second):
		t.Fatal("the change's notification never reached the listener")
	}
	cancel()
	<-done
}
