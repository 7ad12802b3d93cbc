package store

import (
	"context"
	"fmt"
	"time"
)

// AuditEvent is one entry of the append-only audit log.
type AuditEvent struct {
	ID int64 `json:"id"`
	// At is when it happened; AppendAudit stamps an event without one.
	At time.Time `json:"at"`
	// Kind: join, jump, revoke, remove, operator_add, operator_remove, role_put, role_remove
	Kind           string    `json:"kind"`
	Operator       string    `json:"operator,omitempty"`
	Node           string    `json:"node,omitempty"`
	KeyFingerprint string    `json:"key_fingerprint,omitempty"`
	Remote         string    `json:"remote,omitempty"`
	Result         string    `json:"result"`
	Detail         string    `json:"detail,omitempty"`
	EndedAt        time.Time `json:"ended_at,omitzero"`
	BytesToNode    int64     `json:"bytes_to_node,omitempty"`
	BytesFromNode  int64     `json:"bytes_from_node,omitempty"`
}

// AuditFilter selects audit events; zero fields do not filter.
type AuditFilter struct {
	Node     string
	Operator string
	Kind     string
	Since    time.Time
	Until    time.Time // events before it
	Limit    int       // newest N, default 1000
}

// AuditStore is the append-only audit log.
type AuditStore interface {
	AppendAudit(ctx context.Context, e AuditEvent) error
	ListAudit(ctx context.Context, f AuditFilter) ([]AuditEvent, error)
}

// AppendAudit implements AuditStore. An event without a time is stamped with
// the store's clock: every writer (hub, API, controllers) goes through
// here, and a row at time zero would fall outside every --since window.
func (s *DB) AppendAudit(ctx context.Context, e AuditEvent) error {
	if e.At.IsZero() {
		e.At = time.Now()
	}
	if _, err := s.db.ExecContext(ctx,
		`INSERT INTO audit (at, kind, operator, node, key_fingerprint, remote, result, detail, ended_at, `+
			`bytes_to_node, bytes_from_node)
		VALUES (?,?,?,?,?,?,?,?,?,?,?)`,
		unix(e.At), e.Kind, e.Operator, e.Node, e.KeyFingerprint, e.Remote, e.Result, e.Detail,
		unix(e.EndedAt), e.BytesToNode, e.BytesFromNode); err != nil {
		return fmt.Errorf("store: append audit event %s: %w", e.Kind, err)
	}
	return nil
}

// ListAudit implements AuditStore.
func (s *DB) ListAudit(ctx context.Context, f AuditFilter) ([]AuditEvent, error) {
	q := `SELECT id, at, kind, operator, node, key_fingerprint, remote, result, detail, ended_at, bytes_to_node, ` +
		`bytes_from_node FROM audit WHERE 1=1`
	var args []any
	if f.Node != "" {
		q += ` AND node = ?`
		args = append(args, f.Node)
	}
	if f.Operator != "" {
		q += ` AND operator = ?`
		args = append(args, f.Operator)
	}
	if f.Kind != "" {
		q += ` AND kind = ?`
		args = append(args, f.Kind)
	}
	if !f.Since.IsZero() {
		q += ` AND at >= ?`
		args = append(args, unix(f.Since))
	}
	if !f.Until.IsZero() {
		q += ` AND at < ?`
		args = append(args, unix(f.Until))
	}
	limit := f.Limit
	if limit <= 0 || limit > 10000 {
		limit = 1000
	}
	// The newest `limit` events, returned oldest first.
	q = `SELECT * FROM (` + q + ` ORDER BY id DESC LIMIT ?) AS newest ORDER BY id`
	args = append(args, limit)
	rows, err := s.db.QueryContext(ctx, q, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list audit: %w", err)
	}
	defer rows.Close()
	out := []AuditEvent{}
	for rows.Next() {
		var e AuditEvent
		var at, ended int64
		if err := rows.Scan(&e.ID, &at, &e.Kind, &e.Operator, &e.Node, &e.KeyFingerprint, &e.Remote, &e.Result, &e.Detail,
			&ended, &e.BytesToNode, &e.BytesFromNode); err != nil {
			return nil, err
		}
		e.At, e.EndedAt = fromUnix(at), fromUnix(ended)
		out = append(out, e)
	}
	return out, rows.Err()
}
