package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tether-dev/tether/tunnel/control"
)

// Node is a registered edge node.
type Node struct {
	ID   string `json:"id"`
	Name string `json:"name"`
	// Labels are set by the hub (join token, `tether nodes label`): the
	// only labels roles select on.
	Labels map[string]string `json:"labels"`
	// ReportedLabels are what the node's agent says about itself (its
	// labels file). A compromised node can say anything, so they are shown,
	// never used in an access decision.
	ReportedLabels map[string]string `json:"reported_labels"`
	Hostname       string            `json:"hostname"`
	OS             string            `json:"os"`
	Arch           string            `json:"arch"`
	MachineID      string            `json:"machine_id"`
	AgentVersion   string            `json:"agent_version"`
	Transport      string            `json:"transport"` // of the live or last session: quic|tcp
	Online         bool              `json:"online"`
	LastSeen       time.Time         `json:"last_seen"`
	CreatedAt      time.Time         `json:"created_at"`
	CertSerial     string            `json:"cert_serial"`
	CertExpires    time.Time         `json:"cert_expires"`
	RevokedAt      time.Time         `json:"revoked_at,omitzero"` // non-zero: refused for good
	// Filled by the API from the cluster members (not stored with the node).
	ClusterEngine string `json:"cluster_engine,omitempty"`
	ClusterState  string `json:"cluster_state,omitempty"`
	// Facts are what the agent reported in its latest hello. Like
	// ReportedLabels they are the node's word: shown and used to address
	// it on its own network, never in an access decision.
	Facts control.Facts `json:"facts"`
}

// Seen is the connection status update for a node.
type Seen struct {
	Online       bool
	Transport    string
	AgentVersion string
	At           time.Time
}

// NodeStore persists enrolled nodes: their identity, certificate, labels,
// facts and connection status.
type NodeStore interface {
	// Join atomically checks and consumes one use of token id (check compares
	// the secret and is called inside the transaction), and creates node with
	// the token's labels merged in. The node's name must be free. A site
	// token (Token.IsSite) also creates the site's row in sites.
	Join(ctx context.Context, tokenID string, check func(Token) error, n Node) (Node, error)

	GetNode(ctx context.Context, id string) (Node, error)
	GetNodeByName(ctx context.Context, name string) (Node, error)
	ListNodes(ctx context.Context) ([]Node, error)
	// CountNodes is how many nodes are enrolled and not revoked.
	CountNodes(ctx context.Context) (int, error)
	UpdateNodeSeen(ctx context.Context, id string, s Seen) error
	// MarkAllOffline is called at hub start: no session survives a restart.
	MarkAllOffline(ctx context.Context) error
	DeleteNode(ctx context.Context, id string) error

	// UpdateNodeCert records a renewed certificate.
	UpdateNodeCert(ctx context.Context, id, serial string, expires time.Time) error
	// RevokeNode marks a node refused for good (its record is kept).
	RevokeNode(ctx context.Context, id string, at time.Time) error
	// LabelNodes applies c to the hub-set labels of the nodes with these
	// IDs, atomically, and returns them as changed (ErrNotFound if one is
	// gone; nothing changes then, nor when check refuses a node).
	LabelNodes(ctx context.Context, ids []string, c LabelChange, check func(Node) error) ([]Node, error)
	// SetReportedLabels records the labels a node's agent reported. They
	// are kept apart from the hub-set labels and never select a node.
	SetReportedLabels(ctx context.Context, id string, labels map[string]string) error
	// SetNodeFacts records the facts of a node's latest hello.
	SetNodeFacts(ctx context.Context, id string, facts control.Facts) error
}

// Join implements NodeStore.
func (s *DB) Join(ctx context.Context, tokenID string, check func(Token) error, n Node) (Node, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Node{}, fmt.Errorf("store: join: %w", err)
	}
	defer tx.Rollback()
	// The token's row stays locked until commit (PostgreSQL): two replicas
	// joining on a token's last use cannot both spend it.
	t, err := scanToken(tx.QueryRowContext(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE id = ?`+s.d.forUpdate, tokenID))
	if errors.Is(err, sql.ErrNoRows) {
		return Node{}, ErrTokenUnknown
	}
	if err != nil {
		return Node{}, fmt.Errorf("store: join: read token: %w", err)
	}
	if err := check(t); err != nil {
		return Node{}, err
	}
	now := time.Now()
	if !now.Before(t.ExpiresAt) {
		return Node{}, fmt.Errorf("%w at %s", ErrTokenExpired, t.ExpiresAt.Format(time.RFC3339))
	}
	if t.UsesLeft <= 0 {
		return Node{}, ErrTokenUsedUp
	}
	if _, err := tx.ExecContext(ctx, `UPDATE tokens SET uses_left = uses_left - 1 WHERE id = ?`, tokenID); err != nil {
		return Node{}, fmt.Errorf("store: join: consume token: %w", err)
	}
	labels := map[string]string{}
	for k, v := range t.Labels {
		labels[k] = v
	}
	for k, v := range n.Labels {
		labels[k] = v
	}
	n.Labels = labels
	if n.CreatedAt.IsZero() {
		n.CreatedAt = now
	}
	if err := insertNode(ctx, tx, n); err != nil {
		return Node{}, err
	}
	if t.IsSite() {
		// In the same transaction: a site's certificate is recognized by
		// this row, so no site exists without it, nor it without the node.
		if err := insertSiteTx(ctx, tx, n); err != nil {
			return Node{}, err
		}
	}
	if err := tx.Commit(); err != nil {
		return Node{}, fmt.Errorf("store: join: commit: %w", err)
	}
	return n, nil
}

func insertNode(ctx context.Context, tx *sql.Tx, n Node) error {
	facts, err := json.Marshal(n.Facts)
	if err != nil {
		return fmt.Errorf("store: node %q facts: %w", n.Name, err)
	}
	_, err = tx.ExecContext(ctx,
		`INSERT INTO nodes (id, name, labels, hostname, os, arch, machine_id, agent_version, transport, online, last_seen, `+
			`created_at, cert_serial, cert_expires, facts)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		n.ID, n.Name, encodeLabels(n.Labels), n.Hostname, n.OS, n.Arch, n.MachineID, n.AgentVersion, n.Transport, n.Online,
		unix(n.LastSeen), unix(n.CreatedAt), n.CertSerial, unix(n.CertExpires), string(facts))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: node %q: %w", n.Name, ErrNameTaken)
	}
	if err != nil {
		return fmt.Errorf("store: insert node %q: %w", n.Name, err)
	}
	return nil
}

const nodeColumns = `id, name, labels, hostname, os, arch, machine_id, agent_version, transport, online, last_seen, ` +
	`created_at, cert_serial, cert_expires, revoked_at, reported_labels, facts`

func scanNode(r scanner) (Node, error) {
	var n Node
	var labels, reported, facts string
	var lastSeen, created, certExp, revoked int64
	if err := r.Scan(&n.ID, &n.Name, &labels, &n.Hostname, &n.OS, &n.Arch, &n.MachineID, &n.AgentVersion, &n.Transport,
		&n.Online, &lastSeen, &created, &n.CertSerial, &certExp, &revoked, &reported, &facts); err != nil {
		return Node{}, err
	}
	var err error
	if n.Labels, err = decodeLabels(labels); err != nil {
		return Node{}, fmt.Errorf("store: node %s: %w", n.ID, err)
	}
	if n.ReportedLabels, err = decodeLabels(reported); err != nil {
		return Node{}, fmt.Errorf("store: node %s: reported %w", n.ID, err)
	}
	if err := json.Unmarshal([]byte(facts), &n.Facts); err != nil {
		return Node{}, fmt.Errorf("store: node %s: facts: %w", n.ID, err)
	}
	n.LastSeen, n.CreatedAt, n.CertExpires, n.RevokedAt =
		fromUnix(lastSeen), fromUnix(created), fromUnix(certExp), fromUnix(revoked)
	return n, nil
}

func (s *DB) getNode(ctx context.Context, where, arg string) (Node, error) {
	n, err := scanNode(s.hot().QueryRowContext(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE `+where+` = ?`, arg))
	if errors.Is(err, sql.ErrNoRows) {
		return Node{}, fmt.Errorf("store: node %q: %w", arg, ErrNotFound)
	}
	if err != nil {
		return Node{}, fmt.Errorf("store: node %q: %w", arg, err)
	}
	return n, nil
}

// GetNode implements NodeStore.
func (s *DB) GetNode(ctx context.Context, id string) (Node, error) {
	return s.getNode(ctx, "id", id)
}

// GetNodeByName implements NodeStore.
func (s *DB) GetNodeByName(ctx context.Context, name string) (Node, error) {
	return s.getNode(ctx, "name", name)
}

// ListNodes implements NodeStore.
func (s *DB) ListNodes(ctx context.Context) ([]Node, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+nodeColumns+` FROM nodes ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list nodes: %w", err)
	}
	defer rows.Close()
	out := []Node{}
	for rows.Next() {
		n, err := scanNode(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, n)
	}
	return out, rows.Err()
}

// CountNodes implements NodeStore.
func (s *DB) CountNodes(ctx context.Context) (int, error) {
	var n int
	if err := s.db.QueryRowContext(ctx, `SELECT COUNT(*) FROM nodes WHERE revoked_at = 0`).Scan(&n); err != nil {
		return 0, fmt.Errorf("store: count nodes: %w", err)
	}
	return n, nil
}

// MarkAllOffline implements NodeStore.
func (s *DB) MarkAllOffline(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE nodes SET online = 0 WHERE online != 0`); err != nil {
		return fmt.Errorf("store: mark nodes offline: %w", err)
	}
	return nil
}

// DeleteNode implements NodeStore. In the same transaction it removes the
// node's cluster membership and ends its runs that have not started
// (pending, waiting for the node) as skipped with NodeRemovedReason, so
// nothing of the node passes to a machine that joins later under its name.
// A run already running is left to the job engine: the node's tunnel closes
// with the removal and the run fails.
func (s *DB) DeleteNode(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: delete node %s: %w", id, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx, `DELETE FROM cluster_members WHERE node_id = ?`, id); err != nil {
		return fmt.Errorf("store: delete node %s: cluster membership: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE job_nodes SET state = ?, error = ? WHERE node_id = ? AND state IN (?,?)`,
		RunSkipped, NodeRemovedReason, id, RunPending, RunWaiting); err != nil {
		return fmt.Errorf("store: delete node %s: end its job runs: %w", id, err)
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM nodes WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("store: delete node %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: node %s: %w", id, ErrNotFound)
	}
	return tx.Commit()
}

// RevokeNode implements NodeStore.
func (s *DB) RevokeNode(ctx context.Context, id string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET revoked_at = ?, online = 0 WHERE id = ? AND revoked_at = 0`,
		unix(at), id)
	if err != nil {
		return fmt.Errorf("store: revoke node %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		if _, err := s.GetNode(ctx, id); err != nil {
			return err
		}
	}
	return nil
}

// UpdateNodeCert implements NodeStore.
func (s *DB) UpdateNodeCert(ctx context.Context, id, serial string, expires time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET cert_serial = ?, cert_expires = ? WHERE id = ?`, serial,
		unix(expires), id)
	if err != nil {
		return fmt.Errorf("store: update node %s certificate: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: node %s: %w", id, ErrNotFound)
	}
	return nil
}

// LabelChange is an edit of hub-set labels: Set adds or overwrites keys,
// Remove deletes keys (absent keys are no error).
type LabelChange struct {
	Set    map[string]string
	Remove []string
}

// Apply returns labels with the change applied (labels is not modified).
func (c LabelChange) Apply(labels map[string]string) map[string]string {
	out := make(map[string]string, len(labels)+len(c.Set))
	for k, v := range labels {
		out[k] = v
	}
	for _, k := range c.Remove {
		delete(out, k)
	}
	for k, v := range c.Set {
		out[k] = v
	}
	return out
}

// LabelNodes implements NodeStore. All nodes change in one transaction: after a
// crash either every node carries the change or none does. check, if not
// nil, sees each node's new labels and may refuse the whole change.
func (s *DB) LabelNodes(ctx context.Context, ids []string, c LabelChange, check func(Node) error) ([]Node, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("store: label nodes: %w", err)
	}
	defer tx.Rollback()
	out := make([]Node, 0, len(ids))
	for _, id := range ids {
		n, err := scanNode(tx.QueryRowContext(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE id = ?`+s.d.forUpdate, id))
		if errors.Is(err, sql.ErrNoRows) {
			return nil, fmt.Errorf("store: node %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return nil, fmt.Errorf("store: label node %s: %w", id, err)
		}
		n.Labels = c.Apply(n.Labels)
		if check != nil {
			if err := check(n); err != nil {
				return nil, err
			}
		}
		if _, err := tx.ExecContext(ctx, `UPDATE nodes SET labels = ? WHERE id = ?`, encodeLabels(n.Labels), id); err != nil {
			return nil, fmt.Errorf("store: label node %s: %w", id, err)
		}
		out = append(out, n)
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("store: label nodes: commit: %w", err)
	}
	return out, nil
}

// SetReportedLabels implements NodeStore.
func (s *DB) SetReportedLabels(ctx context.Context, id string, labels map[string]string) error {
	res, err := s.hot().ExecContext(ctx, `UPDATE nodes SET reported_labels = ? WHERE id = ?`, encodeLabels(labels), id)
	if err != nil {
		return fmt.Errorf("store: node %s reported labels: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: node %s: %w", id, ErrNotFound)
	}
	return nil
}

// SetNodeFacts implements NodeStore.
func (s *DB) SetNodeFacts(ctx context.Context, id string, facts control.Facts) error {
	b, err := json.Marshal(facts)
	if err != nil {
		return fmt.Errorf("store: node %s facts: %w", id, err)
	}
	res, err := s.hot().ExecContext(ctx, `UPDATE nodes SET facts = ? WHERE id = ?`, string(b), id)
	if err != nil {
		return fmt.Errorf("store: node %s facts: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: node %s: %w", id, ErrNotFound)
	}
	return nil
}
