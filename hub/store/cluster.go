package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ClusterMember is a node's Kubernetes engine membership: what the operator
// wants (Desired) and where the seed-001 state machine is (State).
type ClusterMember struct {
	Node           string    `json:"node"`
	Engine         string    `json:"engine"`
	Desired        string    `json:"desired"` // active | inactive
	State          string    `json:"state"`   // inactive, registering, install_in_progress, active, deregistering, uninstall_in_progress
	EngineDigest   string    `json:"engine_digest,omitempty"`
	LastTransition time.Time `json:"last_transition,omitzero"`
	LastError      string    `json:"last_error,omitempty"`
	LastJob        string    `json:"last_job,omitempty"`
	UpdatedAt      time.Time `json:"updated_at"`
}

// ClusterStore persists cluster memberships.
type ClusterStore interface {
	// PutClusterMember creates or replaces a member record.
	PutClusterMember(ctx context.Context, m ClusterMember) error
	GetClusterMember(ctx context.Context, node string) (ClusterMember, error)
	ListClusterMembers(ctx context.Context) ([]ClusterMember, error)
	DeleteClusterMember(ctx context.Context, node string) error
}

// PutClusterMember implements ClusterStore.
func (s *SQLite) PutClusterMember(ctx context.Context, m ClusterMember) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO cluster_members (node, engine, desired, state, engine_digest, last_transition, last_error, last_job, updated_at)
		VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT (node) DO UPDATE SET engine = excluded.engine, desired = excluded.desired, state = excluded.state,
		engine_digest = excluded.engine_digest, last_transition = excluded.last_transition, last_error = excluded.last_error,
		last_job = excluded.last_job, updated_at = excluded.updated_at`,
		m.Node, m.Engine, m.Desired, m.State, m.EngineDigest, unix(m.LastTransition), m.LastError, m.LastJob, unix(m.UpdatedAt))
	if err != nil {
		return fmt.Errorf("store: put cluster member %s: %w", m.Node, err)
	}
	return nil
}

const memberColumns = `node, engine, desired, state, engine_digest, last_transition, last_error, last_job, updated_at`

func scanMember(r scanner) (ClusterMember, error) {
	var m ClusterMember
	var last, updated int64
	if err := r.Scan(&m.Node, &m.Engine, &m.Desired, &m.State, &m.EngineDigest, &last, &m.LastError, &m.LastJob, &updated); err != nil {
		return ClusterMember{}, err
	}
	m.LastTransition, m.UpdatedAt = fromUnix(last), fromUnix(updated)
	return m, nil
}

// GetClusterMember implements ClusterStore.
func (s *SQLite) GetClusterMember(ctx context.Context, node string) (ClusterMember, error) {
	m, err := scanMember(s.db.QueryRowContext(ctx, `SELECT `+memberColumns+` FROM cluster_members WHERE node = ?`, node))
	if errors.Is(err, sql.ErrNoRows) {
		return ClusterMember{}, fmt.Errorf("store: cluster member %s: %w", node, ErrNotFound)
	}
	if err != nil {
		return ClusterMember{}, fmt.Errorf("store: cluster member %s: %w", node, err)
	}
	return m, nil
}

// ListClusterMembers implements ClusterStore.
func (s *SQLite) ListClusterMembers(ctx context.Context) ([]ClusterMember, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+memberColumns+` FROM cluster_members ORDER BY node`)
	if err != nil {
		return nil, fmt.Errorf("store: list cluster members: %w", err)
	}
	defer rows.Close()
	out := []ClusterMember{}
	for rows.Next() {
		m, err := scanMember(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, m)
	}
	return out, rows.Err()
}

// DeleteClusterMember implements ClusterStore.
func (s *SQLite) DeleteClusterMember(ctx context.Context, node string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM cluster_members WHERE node = ?`, node)
	if err != nil {
		return fmt.Errorf("store: delete cluster member %s: %w", node, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: cluster member %s: %w", node, ErrNotFound)
	}
	return nil
}
