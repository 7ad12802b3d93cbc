package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// consoleSchemaVersion is the schema version that adds the console's
// tables (migrationConsole); the one constant to change if migrations are
// renumbered.
const consoleSchemaVersion = 14

func TestConsoleMigrationAndCodes(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, _ func(t *testing.T) *DB) {
		ctx := context.Background()
		if migrations[consoleSchemaVersion-1] != migrationConsole {
			t.Fatalf("migration v%d is not migrationConsole", consoleSchemaVersion)
		}
		// SQLite migrates a database a v13 hub left; PostgreSQL starts empty.
		path := b.newLoc(t)
		if b.name == "sqlite" {
			path = dataDirAt(t, consoleSchemaVersion-1)
		}
		s, err := b.open(ctx, path)
		if err != nil {
			t.Fatalf("migrate v%d to the console's tables: %v", consoleSchemaVersion-1, err)
		}
		defer s.Close()
		now := time.Now()
		for _, c := range []ConsoleCode{
			{Hash: "fresh", Operator: "alice", KeyTag: "k1", CreatedAt: now, ExpiresAt: now.Add(time.Minute)},
			{Hash: "old", Operator: "alice", CreatedAt: now.Add(-2 * time.Minute), ExpiresAt: now.Add(-time.Minute)},
		} {
			if err := s.CreateConsoleCode(ctx, c); err != nil {
				t.Fatal(err)
			}
		}
		for _, tt := range []struct {
			hash string
			want error
		}{
			{"fresh", nil},
			{"fresh", ErrNotFound}, // once only
			{"old", ErrExpired},
			{"old", ErrNotFound}, // deleted by the refused take too
			{"never", ErrNotFound},
		} {
			c, err := s.TakeConsoleCode(ctx, tt.hash, now)
			if !errors.Is(err, tt.want) || (err == nil && (c.Operator != "alice" || c.KeyTag != "k1")) {
				t.Fatalf("take %s: %+v, %v; want %v", tt.hash, c, err, tt.want)
			}
		}
		sess := ConsoleSession{
			Hash:      "s1",
			Operator:  "alice",
			KeyTag:    "k1",
			Admin:     true,
			CSRF:      "tok",
			CreatedAt: now,
			ExpiresAt: now.Add(time.Hour),
		}
		if err := s.CreateConsoleSession(ctx, sess); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetConsoleSession(ctx, "s1", now)
		if err != nil || got.Operator != "alice" || !got.Admin || got.CSRF != "tok" || got.KeyTag != "k1" {
			t.Fatalf("session %+v, %v", got, err)
		}
		if _, err := s.GetConsoleSession(ctx, "s1", now.Add(2*time.Hour)); !errors.Is(err, ErrNotFound) {
			t.Fatalf("an expired session: %v", err)
		}
		if err := s.PruneConsole(ctx, now.Add(2*time.Hour)); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetConsoleSession(ctx, "s1", now); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a pruned session: %v", err)
		}
	})
}
