package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ClusterMember is a node's Kubernetes engine membership: what the operator
// wants (Desired) and where the node is in the cluster-agent state machine
// (inactive → registering → install_in_progress → active → deregistering →
// uninstall_in_progress; see provisioners/cluster). A member belongs to one
// node ID and goes when that node is removed.
type ClusterMember struct {
	NodeID         string    `json:"node_id"`
	Node           string    `json:"node"` // the node's name, read from the nodes table
	Engine         string    `json:"engine"`
	Desired        string    `json:"desired"` // active | inactive
	State          string    `json:"state"`   // inactive, registering, install_in_progress, active, deregistering, uninstall_in_progress
	EngineDigest   string    `json:"engine_digest,omitempty"`
	LastTransition time.Time `json:"last_transition,omitzero"`
	LastError      string    `json:"last_error,omitempty"`
	LastJob        string    `json:"last_job,omitempty"`
	UpdatedAt      time.Time `json:"updated_at"`
}

// ClusterStore persists cluster memberships, keyed by node ID.
type ClusterStore interface {
	// PutClusterMember creates or replaces a member record; ErrNotFound if
	// its node is not registered (or was removed meanwhile).
	PutClusterMember(ctx context.Context, m ClusterMember) error
	GetClusterMember(ctx context.Context, nodeID string) (ClusterMember, error)
	// ListClusterMembers lists members by node name.
	ListClusterMembers(ctx context.Context) ([]ClusterMember, error)
}

// PutClusterMember implements ClusterStore.
func (s *SQLite) PutClusterMember(ctx context.Context, m ClusterMember) error {
	_, err := s.fencedExec(ctx, `INSERT INTO cluster_members (node_id, engine, desired, state, engine_digest, last_transition, last_error, last_job, updated_at)
		VALUES (?,?,?,?,?,?,?,?,?) ON CONFLICT (node_id) DO UPDATE SET engine = excluded.engine, desired = excluded.desired, state = excluded.state,
		engine_digest = excluded.engine_digest, last_transition = excluded.last_transition, last_error = excluded.last_error,
		last_job = excluded.last_job, updated_at = excluded.updated_at`,
		m.NodeID, m.Engine, m.Desired, m.State, m.EngineDigest, unix(m.LastTransition), m.LastError, m.LastJob, unix(m.UpdatedAt))
	if isForeignKeyViolation(err) {
		return fmt.Errorf("store: cluster member: node %s (%s): %w", m.NodeID, m.Node, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("store: put cluster member %s (%s): %w", m.NodeID, m.Node, err)
	}
	return nil
}

// memberSelect reads members with their node's name; a caller adds its
// conditions with AND. The CROSS JOIN keeps cluster_members the outer loop
// on SQLite: its planner, which has no table statistics, otherwise walked
// every node to find the few members (the cluster controller's re-read,
// every 30 s: 100,000 rows at a hub of 100,000 nodes, a twentieth of its
// idle CPU). PostgreSQL plans a CROSS JOIN with a WHERE as any inner join.
const memberSelect = `SELECT m.node_id, n.name, m.engine, m.desired, m.state, m.engine_digest, m.last_transition, m.last_error, m.last_job, m.updated_at
	FROM cluster_members m CROSS JOIN nodes n WHERE n.id = m.node_id`

// listMembers is ListClusterMembers' query.
const listMembers = memberSelect + ` ORDER BY n.name`

func scanMember(r scanner) (ClusterMember, error) {
	var m ClusterMember
	var last, updated int64
	if err := r.Scan(&m.NodeID, &m.Node, &m.Engine, &m.Desired, &m.State, &m.EngineDigest, &last, &m.LastError, &m.LastJob, &updated); err != nil {
		return ClusterMember{}, err
	}
	m.LastTransition, m.UpdatedAt = fromUnix(last), fromUnix(updated)
	return m, nil
}

// GetClusterMember implements ClusterStore.
func (s *SQLite) GetClusterMember(ctx context.Context, nodeID string) (ClusterMember, error) {
	m, err := scanMember(s.db.QueryRowContext(ctx, memberSelect+` AND m.node_id = ?`, nodeID))
	if errors.Is(err, sql.ErrNoRows) {
		return ClusterMember{}, fmt.Errorf("store: cluster member %s: %w", nodeID, ErrNotFound)
	}
	if err != nil {
		return ClusterMember{}, fmt.Errorf("store: cluster member %s: %w", nodeID, err)
	}
	return m, nil
}

// ListClusterMembers implements ClusterStore.
func (s *SQLite) ListClusterMembers(ctx context.Context) ([]ClusterMember, error) {
	rows, err := s.db.QueryContext(ctx, listMembers)
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
