package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// Rollout states of an upgrade. running, paused are live; halted (the
// failure tolerance was exceeded, or the artifact failed verification),
// cancelled and done are final.
const (
	UpgradeRunning   = "running"
	UpgradePaused    = "paused"
	UpgradeHalted    = "halted"
	UpgradeCancelled = "cancelled"
	UpgradeDone      = "done"
)

// UpgradeFinal reports whether a rollout state is final.
func UpgradeFinal(state string) bool {
	return state == UpgradeHalted || state == UpgradeCancelled || state == UpgradeDone
}

// UpgradeSpec is how an upgrade rolls out, as given at creation.
type UpgradeSpec struct {
	Selector string   `json:"selector,omitempty"` // as given, for display
	Nodes    []string `json:"nodes,omitempty"`    // as given, for display
	// Batch is "N" nodes or "P%" of the targets per batch ("" = all at once).
	Batch string `json:"batch,omitempty"`
	// Canary is the size of a first batch before the others (0 = none).
	Canary int `json:"canary,omitempty"`
	// MaxUnavailable bounds the nodes being upgraded at once (0 = the batch).
	MaxUnavailable int `json:"max_unavailable,omitempty"`
	// FailureTolerance is "N" or "P%" of the targets that may fail before
	// the rollout halts ("" = none may).
	FailureTolerance     string    `json:"failure_tolerance,omitempty"`
	RequireConfirmation  bool      `json:"require_confirmation,omitempty"`
	AllowDowngrade       bool      `json:"allow_downgrade,omitempty"`
	Deadline             time.Time `json:"deadline,omitzero"` // offline nodes wait until then (zero: forever)
	HealthTimeoutSeconds int       `json:"health_timeout_seconds"`
	// TimeoutSeconds bounds one node's offer, upload and apply (a bundle's
	// install script runs in it).
	TimeoutSeconds int    `json:"timeout_seconds"`
	Role           string `json:"role,omitempty"` // role of an API-token creator
}

// Upgrade is one rollout of an artifact pinned by digest.
type Upgrade struct {
	Name      string            `json:"name"`
	Kind      upgradeproto.Kind `json:"kind"`
	Reference string            `json:"reference"`
	Digest    string            `json:"digest"`
	Version   string            `json:"version"`
	// Pinned is the resolved artifact (hub/artifacts.Pinned as JSON): the
	// documents the nodes verify against Digest.
	Pinned    json.RawMessage `json:"pinned"`
	Spec      UpgradeSpec     `json:"spec"`
	State     string          `json:"state"`
	Reason    string          `json:"reason,omitempty"`
	Fetched   bool            `json:"fetched"` // the blobs are in the hub's blob store, verified
	CreatedBy string          `json:"created_by"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// UpgradeNode is one target node's place in an upgrade: the hub's view of
// the per-node state machine, with each step's time and reason.
type UpgradeNode struct {
	Upgrade     string                    `json:"upgrade"`
	NodeID      string                    `json:"node_id"`
	Node        string                    `json:"node"` // the node's name when the upgrade was created
	Batch       int                       `json:"batch"`
	Step        upgradeproto.Step         `json:"step"`
	Reason      string                    `json:"reason,omitempty"`
	FromVersion string                    `json:"from_version,omitempty"`
	ConfirmedBy string                    `json:"confirmed_by,omitempty"`
	History     []upgradeproto.Transition `json:"history"`
	JobID       string                    `json:"job_id,omitempty"` // the last job that drove the node
	StartedAt   time.Time                 `json:"started_at,omitzero"`
	UpdatedAt   time.Time                 `json:"updated_at"`
}

// UpgradeStore persists upgrades and their nodes.
type UpgradeStore interface {
	// CreateUpgrade stores u and its nodes at once (ErrNameTaken if an
	// upgrade has the name). An upgrade without a valid digest is refused.
	CreateUpgrade(ctx context.Context, u Upgrade, nodes []UpgradeNode) error
	GetUpgrade(ctx context.Context, name string) (Upgrade, error)
	// ListUpgrades lists upgrades, newest first.
	ListUpgrades(ctx context.Context) ([]Upgrade, error)
	// SetUpgradeState records the rollout's state and its reason.
	SetUpgradeState(ctx context.Context, name, state, reason string, at time.Time) error
	// SetUpgradeFetched records that the upgrade's blobs are held.
	SetUpgradeFetched(ctx context.Context, name string) error
	// PutUpgradeNode replaces a node's record (ErrNotFound if it has none).
	PutUpgradeNode(ctx context.Context, n UpgradeNode) error
	ListUpgradeNodes(ctx context.Context, name string) ([]UpgradeNode, error)
	// UpgradeNodesOf lists the records of the node with this ID, in every
	// upgrade.
	UpgradeNodesOf(ctx context.Context, nodeID string) ([]UpgradeNode, error)
}

// CreateUpgrade implements UpgradeStore.
func (s *DB) CreateUpgrade(ctx context.Context, u Upgrade, nodes []UpgradeNode) error {
	if !upgradeproto.ValidDigest(u.Digest) {
		return fmt.Errorf("store: upgrade %q: digest %q is not sha256:<64 hex> (an upgrade without a digest cannot exist)",
			u.Name, u.Digest)
	}
	spec, err := json.Marshal(u.Spec)
	if err != nil {
		return fmt.Errorf("store: upgrade %q: %w", u.Name, err)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: create upgrade %q: %w", u.Name, err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx,
		`INSERT INTO upgrades (name, kind, reference, digest, version, pinned, spec, state, reason, fetched, `+
			`created_by, created_at, updated_at)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		u.Name, string(u.Kind), u.Reference, u.Digest, u.Version, string(u.Pinned), string(spec),
		u.State, u.Reason, u.Fetched, u.CreatedBy, unix(u.CreatedAt), unix(u.UpdatedAt))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: upgrade %q: %w", u.Name, ErrNameTaken)
	}
	if err != nil {
		return fmt.Errorf("store: create upgrade %q: %w", u.Name, err)
	}
	for _, n := range nodes {
		n.Upgrade = u.Name
		if err := putUpgradeNode(ctx, tx, n, true); err != nil {
			return err
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: create upgrade %q: %w", u.Name, err)
	}
	return nil
}

type execer interface {
	ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error)
}

func putUpgradeNode(ctx context.Context, db execer, n UpgradeNode, insert bool) error {
	if n.History == nil {
		n.History = []upgradeproto.Transition{}
	}
	hist, err := json.Marshal(n.History)
	if err != nil {
		return fmt.Errorf("store: upgrade %q node %s: %w", n.Upgrade, n.Node, err)
	}
	if insert {
		_, err = db.ExecContext(ctx,
			`INSERT INTO upgrade_nodes (upgrade, node_id, node, batch, step, reason, from_version, confirmed_by, `+
				`history, job_id, started_at, updated_at)
			VALUES (?,?,?,?,?,?,?,?,?,?,?,?)`,
			n.Upgrade, n.NodeID, n.Node, n.Batch, string(n.Step), n.Reason, n.FromVersion, n.ConfirmedBy,
			string(hist), n.JobID, unix(n.StartedAt), unix(n.UpdatedAt))
		if err != nil {
			return fmt.Errorf("store: upgrade %q node %s: %w", n.Upgrade, n.Node, err)
		}
		return nil
	}
	res, err := db.ExecContext(ctx,
		`UPDATE upgrade_nodes SET step = ?, reason = ?, from_version = ?, confirmed_by = ?, history = ?, job_id = ?,
		started_at = ?, updated_at = ? WHERE upgrade = ? AND node_id = ?`,
		string(n.Step), n.Reason, n.FromVersion, n.ConfirmedBy, string(hist),
		n.JobID, unix(n.StartedAt), unix(n.UpdatedAt), n.Upgrade, n.NodeID)
	if err != nil {
		return fmt.Errorf("store: upgrade %q node %s: %w", n.Upgrade, n.Node, err)
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("store: upgrade %q node %s: %w", n.Upgrade, n.Node, ErrNotFound)
	}
	return nil
}

const upgradeSelect = `SELECT name, kind, reference, digest, version, pinned, spec, state, reason, fetched, ` +
	`created_by, created_at, updated_at FROM upgrades`

func scanUpgrade(r scanner) (Upgrade, error) {
	var u Upgrade
	var kind, pinned, spec string
	var created, updated int64
	if err := r.Scan(&u.Name, &kind, &u.Reference, &u.Digest, &u.Version, &pinned, &spec, &u.State, &u.Reason, &u.Fetched,
		&u.CreatedBy, &created, &updated); err != nil {
		return Upgrade{}, err
	}
	u.Kind, u.Pinned, u.CreatedAt, u.UpdatedAt =
		upgradeproto.Kind(kind), json.RawMessage(pinned), fromUnix(created), fromUnix(updated)
	if err := json.Unmarshal([]byte(spec), &u.Spec); err != nil {
		return Upgrade{}, fmt.Errorf("upgrade %q spec: %w", u.Name, err)
	}
	return u, nil
}

// GetUpgrade implements UpgradeStore.
func (s *DB) GetUpgrade(ctx context.Context, name string) (Upgrade, error) {
	u, err := scanUpgrade(s.db.QueryRowContext(ctx, upgradeSelect+` WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return Upgrade{}, fmt.Errorf("store: upgrade %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return Upgrade{}, fmt.Errorf("store: upgrade %q: %w", name, err)
	}
	return u, nil
}

// ListUpgrades implements UpgradeStore.
func (s *DB) ListUpgrades(ctx context.Context) ([]Upgrade, error) {
	rows, err := s.hot().QueryContext(ctx, upgradeSelect+` ORDER BY created_at DESC, name`)
	if err != nil {
		return nil, fmt.Errorf("store: list upgrades: %w", err)
	}
	defer rows.Close()
	out := []Upgrade{}
	for rows.Next() {
		u, err := scanUpgrade(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list upgrades: %w", err)
		}
		out = append(out, u)
	}
	return out, rows.Err()
}

// SetUpgradeState implements UpgradeStore.
func (s *DB) SetUpgradeState(ctx context.Context, name, state, reason string, at time.Time) error {
	return s.updateUpgrade(ctx, name, `UPDATE upgrades SET state = ?, reason = ?, updated_at = ? WHERE name = ?`, state,
		reason, unix(at), name)
}

// SetUpgradeFetched implements UpgradeStore.
func (s *DB) SetUpgradeFetched(ctx context.Context, name string) error {
	return s.updateUpgrade(ctx, name, `UPDATE upgrades SET fetched = 1 WHERE name = ?`, name)
}

func (s *DB) updateUpgrade(ctx context.Context, name, q string, args ...any) error {
	res, err := s.fencedExec(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("store: upgrade %q: %w", name, err)
	}
	if k, _ := res.RowsAffected(); k == 0 {
		return fmt.Errorf("store: upgrade %q: %w", name, ErrNotFound)
	}
	return nil
}

// PutUpgradeNode implements UpgradeStore.
func (s *DB) PutUpgradeNode(ctx context.Context, n UpgradeNode) error {
	if _, ok := FenceFrom(ctx); ok {
		return s.fencedTx(ctx, func(tx *sql.Tx) error { return putUpgradeNode(ctx, tx, n, false) })
	}
	return putUpgradeNode(ctx, s.db, n, false)
}

const upgradeNodeSelect = `SELECT upgrade, node_id, node, batch, step, reason, from_version, confirmed_by, history, ` +
	`job_id, started_at, updated_at FROM upgrade_nodes`

func (s *DB) listUpgradeNodes(ctx context.Context, where string, arg string) ([]UpgradeNode, error) {
	rows, err := s.hot().QueryContext(ctx, upgradeNodeSelect+` WHERE `+where+` ORDER BY batch, node`, arg)
	if err != nil {
		return nil, fmt.Errorf("store: upgrade nodes: %w", err)
	}
	defer rows.Close()
	out := []UpgradeNode{}
	for rows.Next() {
		var n UpgradeNode
		var step, hist string
		var started, updated int64
		if err := rows.Scan(&n.Upgrade, &n.NodeID, &n.Node, &n.Batch, &step, &n.Reason, &n.FromVersion, &n.ConfirmedBy, &hist,
			&n.JobID, &started, &updated); err != nil {
			return nil, fmt.Errorf("store: upgrade nodes: %w", err)
		}
		n.Step, n.StartedAt, n.UpdatedAt = upgradeproto.Step(step), fromUnix(started), fromUnix(updated)
		if err := json.Unmarshal([]byte(hist), &n.History); err != nil {
			return nil, fmt.Errorf("store: upgrade %q node %s history: %w", n.Upgrade, n.Node, err)
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// ListUpgradeNodes implements UpgradeStore.
func (s *DB) ListUpgradeNodes(ctx context.Context, name string) ([]UpgradeNode, error) {
	return s.listUpgradeNodes(ctx, "upgrade = ?", name)
}

// UpgradeNodesOf implements UpgradeStore.
func (s *DB) UpgradeNodesOf(ctx context.Context, nodeID string) ([]UpgradeNode, error) {
	return s.listUpgradeNodes(ctx, "node_id = ?", nodeID)
}
