package store

import (
	"context"
	"testing"
	"time"
)

// TestAppendAuditStampsTime: an event written without a time gets the
// store's clock, so `tether audit --since` finds it; a writer's own time
// (a jump's start) is kept.
func TestAppendAuditStampsTime(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		s := openTest(t)
		ctx := context.Background()
		given := time.Now().Add(-time.Hour).Truncate(time.Millisecond).UTC()
		before := time.Now().Truncate(time.Millisecond)
		for _, e := range []AuditEvent{
			{Kind: "upgrade_done", Result: "ok"},
			{At: given, Kind: "jump", Result: "ok"},
		} {
			if err := s.AppendAudit(ctx, e); err != nil {
				t.Fatal(err)
			}
		}
		after := time.Now()
		recent, err := s.ListAudit(ctx, AuditFilter{Since: before})
		if err != nil {
			t.Fatal(err)
		}
		if len(recent) != 1 || recent[0].Kind != "upgrade_done" || recent[0].At.Before(before) || recent[0].At.After(after) {
			t.Fatalf("events since %s: %+v; want the unstamped upgrade_done, stamped between then and %s", before, recent, after)
		}
		all, err := s.ListAudit(ctx, AuditFilter{})
		if err != nil {
			t.Fatal(err)
		}
		if len(all) != 2 || !all[1].At.Equal(given) {
			t.Fatalf("all events: %+v; want the jump kept at %s", all, given)
		}
	})
}
