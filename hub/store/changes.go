package store

import (
	"context"
	"fmt"
	"time"
)

// Kinds of Change.
const (
	// ChangeAccess: operators, roles, revoked keys or KubeOne clusters
	// changed; every replica reloads its door and re-checks live jumps.
	ChangeAccess = "access"
	// ChangeNodeRevoked: node Subject (its ID) was revoked; the replica
	// that holds its tunnel closes it.
	ChangeNodeRevoked = "node_revoked"
	// ChangeAdminRevoked: admin certificates issued before now are
	// refused; every replica re-reads the revocation time.
	ChangeAdminRevoked = "admin_revoked"
	// ChangeWork: a cluster member, upgrade or KubeOne cluster was asked
	// for something; the leader's controllers look now.
	ChangeWork = "work"
)

// ChangesChannel is the PostgreSQL notification channel a recorded change
// is announced on.
const ChangesChannel = "tether_changes"

// changesKept is how many changes the feed keeps: far more than a replica
// reads between two polls, so none is missed but by a replica that was
// away long enough to reload everything anyway.
const changesKept = 10000

// Change is one entry of the change feed that carries changes made on one
// replica to the others' live state.
type Change struct {
	Seq     int64     `json:"seq"`
	Kind    string    `json:"kind"`
	Subject string    `json:"subject,omitempty"`
	Origin  string    `json:"origin,omitempty"` // replica that made it (it applied it already)
	At      time.Time `json:"at"`
}

// ChangeStore is the change feed.
type ChangeStore interface {
	// RecordChange appends c (Seq and At are set by the store) and returns
	// its sequence number.
	RecordChange(ctx context.Context, c Change) (int64, error)
	// ChangesSince returns the changes after seq, oldest first, at most
	// limit of them.
	ChangesSince(ctx context.Context, seq int64, limit int) ([]Change, error)
	// LastChange returns the newest sequence number (0 if none).
	LastChange(ctx context.Context) (int64, error)
}

// RecordChange implements ChangeStore.
func (s *DB) RecordChange(ctx context.Context, c Change) (int64, error) {
	var seq int64
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, fmt.Errorf("store: record change %s: %w", c.Kind, err)
	}
	defer tx.Rollback()
	if s.d.lockChanges != "" {
		if _, err := tx.ExecContext(ctx, s.d.lockChanges); err != nil {
			return 0, fmt.Errorf("store: record change %s: %w", c.Kind, err)
		}
	}
	if err := tx.QueryRowContext(ctx, `INSERT INTO changes (kind, subject, origin, at) VALUES (?,?,?,?) RETURNING seq`,
		c.Kind, c.Subject, c.Origin, unix(time.Now())).Scan(&seq); err != nil {
		return 0, fmt.Errorf("store: record change %s: %w", c.Kind, err)
	}
	if s.d.name == "postgres" {
		// Delivered at commit, with the entry: listeners read it at once
		// (hub/notify); nothing rides on the notification itself.
		if _, err := tx.ExecContext(ctx, `SELECT pg_notify('`+ChangesChannel+`', '')`); err != nil {
			return 0, fmt.Errorf("store: record change %s: notify: %w", c.Kind, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return 0, fmt.Errorf("store: record change %s: %w", c.Kind, err)
	}
	if seq%100 == 0 {
		if _, err := s.db.ExecContext(ctx, `DELETE FROM changes WHERE seq <= ?`, seq-changesKept); err != nil {
			return seq, fmt.Errorf("store: prune changes: %w", err)
		}
	}
	return seq, nil
}

// ChangesSince implements ChangeStore. The feed polls it four times a
// second on SQLite, so it is prepared once: parsing was two thirds of an
// idle hub's poll.
func (s *DB) ChangesSince(ctx context.Context, seq int64, limit int) ([]Change, error) {
	rows, err := s.hot().QueryContext(ctx,
		`SELECT seq, kind, subject, origin, at FROM changes WHERE seq > ? ORDER BY seq LIMIT ?`, seq, limit)
	if err != nil {
		return nil, fmt.Errorf("store: read changes: %w", err)
	}
	defer rows.Close()
	out := []Change{}
	for rows.Next() {
		var c Change
		var at int64
		if err := rows.Scan(&c.Seq, &c.Kind, &c.Subject, &c.Origin, &at); err != nil {
			return nil, fmt.Errorf("store: read changes: %w", err)
		}
		c.At = fromUnix(at)
		out = append(out, c)
	}
	return out, rows.Err()
}

// LastChange implements ChangeStore.
func (s *DB) LastChange(ctx context.Context) (int64, error) {
	var seq int64
	if err := s.db.QueryRowContext(ctx, `SELECT COALESCE(MAX(seq), 0) FROM changes`).Scan(&seq); err != nil {
		return 0, fmt.Errorf("store: read changes: %w", err)
	}
	return seq, nil
}
