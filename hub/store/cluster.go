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
	NodeID  string `json:"node_id"`
	Node    string `json:"node"` // the node's name, read from the nodes table
	Engine  string `json:"engine"`
	Desired string `json:"desired"` // active | inactive
	// State: inactive, registering, install_in_progress, active, deregistering, uninstall_in_progress
	State          string    `json:"state"`
	EngineDigest   string    `json:"engine_digest,omitempty"`
	LastTransition time.Time `json:"last_transition,omitzero"`
	LastError      string    `json:"last_error,omitempty"`
	LastJob        string    `json:"last_job,omitempty"`
	UpdatedAt      time.Time `json:"updated_at"`
}

// ErrKubernetesOwned is what a *KubernetesOwnerError matches (errors.Is):
// a node asked to take a Kubernetes already has one, from the cluster
// state machine's engines or from a KubeOne cluster. One node, one
// Kubernetes: two would fight over the kubelet, the container runtime
// and the ports.
var ErrKubernetesOwned = errors.New("node already runs another Kubernetes")

// ErrMemberMoved is returned when the controller records progress on a
// member whose state a request moved meanwhile: read it again.
var ErrMemberMoved = errors.New("cluster member's state changed meanwhile")

// KubernetesOwnerError names the owner of a node's Kubernetes.
type KubernetesOwnerError struct {
	NodeID string
	// KubeOneCluster is the KubeOne cluster the node is a member of, or "".
	KubeOneCluster string
	// Engine, Desired and State describe the node's membership in the
	// cluster state machine when that owns it (Engine is then not "").
	Engine, Desired, State string
}

func (e *KubernetesOwnerError) Error() string {
	if e.KubeOneCluster != "" {
		return fmt.Sprintf("node %s is a member of KubeOne cluster %q", e.NodeID, e.KubeOneCluster)
	}
	return fmt.Sprintf("node %s has the %s engine of the cluster state machine (desired %s, state %s)",
		e.NodeID, e.Engine, e.Desired, e.State)
}

// Is makes every KubernetesOwnerError match ErrKubernetesOwned.
func (e *KubernetesOwnerError) Is(target error) bool { return target == ErrKubernetesOwned }

// The member values the ownership checks read (provisioners/cluster's
// names): a member owns its node's Kubernetes while it is desired active
// or not yet back in inactive (an uninstall still under way).
const (
	memberDesiredActive = "active"
	memberStateInactive = "inactive"
)

// MemberChange edits a member inside ChangeClusterMember's transaction;
// exists is false for a node without one.
type MemberChange func(m *ClusterMember, exists bool) error

// ClusterStore persists cluster memberships, keyed by node ID.
type ClusterStore interface {
	// PutClusterMember creates or replaces a member record; ErrNotFound if
	// its node is not registered (or was removed meanwhile), and, for a
	// member desired active, a *KubernetesOwnerError if the node is a
	// member of a KubeOne cluster.
	PutClusterMember(ctx context.Context, m ClusterMember) error
	// ChangeClusterMember is an operator's request on the member of the
	// node with this ID: in one transaction it reads the member (exists is
	// false, and m carries only NodeID and Node, if there is none), lets
	// change edit it, and stores the result unless change returns an
	// error, which it returns. The rules of PutClusterMember hold; the
	// ownership check and the write are one transaction, so a KubeOne
	// cluster taking the node at the same moment cannot also succeed.
	ChangeClusterMember(ctx context.Context, nodeID string, change MemberChange) (ClusterMember, error)
	// AdvanceClusterMember records the controller's progress on a member
	// (state, engine digest, last transition, error and job, updated at)
	// if its stored state is still from. Desired and Engine are never
	// written: only requests change those, and a request made during a
	// step must survive the step's end. ErrMemberMoved if a request moved
	// the state meanwhile; ErrNotFound if the member is gone.
	AdvanceClusterMember(ctx context.Context, m ClusterMember, from string) error
	GetClusterMember(ctx context.Context, nodeID string) (ClusterMember, error)
	// ListClusterMembers lists members by node name.
	ListClusterMembers(ctx context.Context) ([]ClusterMember, error)
}

// PutClusterMember implements ClusterStore.
func (s *DB) PutClusterMember(ctx context.Context, m ClusterMember) error {
	return s.fencedTx(ctx, func(tx *sql.Tx) error { return s.putMember(ctx, tx, m) })
}

// ChangeClusterMember implements ClusterStore.
func (s *DB) ChangeClusterMember(ctx context.Context, nodeID string, change MemberChange) (ClusterMember, error) {
	var out ClusterMember
	err := s.fencedTx(ctx, func(tx *sql.Tx) error {
		name, err := s.lockNode(ctx, tx, nodeID)
		if err != nil {
			return err
		}
		m, err := scanMember(tx.QueryRowContext(ctx, memberSelect+` AND m.node_id = ?`, nodeID))
		exists := err == nil
		switch {
		case errors.Is(err, sql.ErrNoRows):
			m = ClusterMember{NodeID: nodeID, Node: name}
		case err != nil:
			return fmt.Errorf("store: cluster member %s: %w", nodeID, err)
		}
		if err := change(&m, exists); err != nil {
			return err
		}
		m.NodeID, m.Node = nodeID, name
		if err := s.putMember(ctx, tx, m); err != nil {
			return err
		}
		out = m
		return nil
	})
	return out, err
}

// lockNode reads the name of the node with this ID, locking its row on
// PostgreSQL: the writes that give a node a Kubernetes (cluster members,
// KubeOne members) all lock it first, so they run one after the other
// and each sees what the other stored. ErrNotFound if there is no such
// node.
func (s *DB) lockNode(ctx context.Context, tx *sql.Tx, nodeID string) (string, error) {
	var name string
	err := tx.QueryRowContext(ctx, `SELECT name FROM nodes WHERE id = ?`+s.d.forUpdate, nodeID).Scan(&name)
	if errors.Is(err, sql.ErrNoRows) {
		return "", fmt.Errorf("store: node %s: %w", nodeID, ErrNotFound)
	}
	if err != nil {
		return "", fmt.Errorf("store: node %s: %w", nodeID, err)
	}
	return name, nil
}

// putMember writes m in tx after the ownership check.
func (s *DB) putMember(ctx context.Context, tx *sql.Tx, m ClusterMember) error {
	if _, err := s.lockNode(ctx, tx, m.NodeID); err != nil {
		return fmt.Errorf("store: cluster member (%s): %w", m.Node, err)
	}
	if m.Desired == memberDesiredActive {
		var cluster string
		err := tx.QueryRowContext(ctx, `SELECT cluster FROM kubeone_members WHERE node_id = ?`, m.NodeID).Scan(&cluster)
		switch {
		case err == nil:
			return &KubernetesOwnerError{NodeID: m.NodeID, KubeOneCluster: cluster}
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("store: cluster member %s: KubeOne membership: %w", m.NodeID, err)
		}
	}
	_, err := tx.ExecContext(ctx, `INSERT INTO cluster_members (node_id, engine, desired, state, engine_digest,
		last_transition, last_error, last_job, updated_at) VALUES (?,?,?,?,?,?,?,?,?)
		ON CONFLICT (node_id) DO UPDATE SET engine = excluded.engine, desired = excluded.desired, state = excluded.state,
		engine_digest = excluded.engine_digest, last_transition = excluded.last_transition, last_error = excluded.last_error,
		last_job = excluded.last_job, updated_at = excluded.updated_at`,
		m.NodeID, m.Engine, m.Desired, m.State, m.EngineDigest, unix(m.LastTransition), m.LastError, m.LastJob,
		unix(m.UpdatedAt))
	if isForeignKeyViolation(err) {
		return fmt.Errorf("store: cluster member: node %s (%s): %w", m.NodeID, m.Node, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("store: put cluster member %s (%s): %w", m.NodeID, m.Node, err)
	}
	return nil
}

// AdvanceClusterMember implements ClusterStore.
func (s *DB) AdvanceClusterMember(ctx context.Context, m ClusterMember, from string) error {
	return s.fencedTx(ctx, func(tx *sql.Tx) error {
		res, err := tx.ExecContext(ctx, `UPDATE cluster_members SET state = ?, engine_digest = ?, last_transition = ?,
			last_error = ?, last_job = ?, updated_at = ? WHERE node_id = ? AND state = ?`,
			m.State, m.EngineDigest, unix(m.LastTransition), m.LastError, m.LastJob, unix(m.UpdatedAt), m.NodeID, from)
		if err != nil {
			return fmt.Errorf("store: cluster member %s (%s): %w", m.NodeID, m.Node, err)
		}
		if n, _ := res.RowsAffected(); n == 1 {
			return nil
		}
		var state string
		err = tx.QueryRowContext(ctx, `SELECT state FROM cluster_members WHERE node_id = ?`, m.NodeID).Scan(&state)
		switch {
		case errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("store: cluster member %s (%s): %w", m.NodeID, m.Node, ErrNotFound)
		case err != nil:
			return fmt.Errorf("store: cluster member %s (%s): %w", m.NodeID, m.Node, err)
		}
		return fmt.Errorf("store: cluster member %s (%s): state %s, not %s: %w",
			m.NodeID, m.Node, state, from, ErrMemberMoved)
	})
}

// memberSelect reads members with their node's name; a caller adds its
// conditions with AND. The CROSS JOIN keeps cluster_members the outer loop
// on SQLite: its planner, which has no table statistics, otherwise walked
// every node to find the few members (the cluster controller's re-read,
// every 30 s: 100,000 rows at a hub of 100,000 nodes, a twentieth of its
// idle CPU). PostgreSQL plans a CROSS JOIN with a WHERE as any inner join.
const memberSelect = `SELECT m.node_id, n.name, m.engine, m.desired, m.state, m.engine_digest, m.last_transition, ` +
	`m.last_error, m.last_job, m.updated_at
	FROM cluster_members m CROSS JOIN nodes n WHERE n.id = m.node_id`

// listMembers is ListClusterMembers' query.
const listMembers = memberSelect + ` ORDER BY n.name`

func scanMember(r scanner) (ClusterMember, error) {
	var m ClusterMember
	var last, updated int64
	if err := r.Scan(&m.NodeID, &m.Node, &m.Engine, &m.Desired, &m.State, &m.EngineDigest, &last, &m.LastError, &m.LastJob,
		&updated); err != nil {
		return ClusterMember{}, err
	}
	m.LastTransition, m.UpdatedAt = fromUnix(last), fromUnix(updated)
	return m, nil
}

// GetClusterMember implements ClusterStore.
func (s *DB) GetClusterMember(ctx context.Context, nodeID string) (ClusterMember, error) {
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
func (s *DB) ListClusterMembers(ctx context.Context) ([]ClusterMember, error) {
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
