package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// KubeOne member roles.
const (
	KubeOneControlPlane = "control-plane"
	KubeOneWorker       = "worker"
)

// ErrInOtherCluster is wrapped when a node asked for as a member already
// belongs to another KubeOne cluster.
var ErrInOtherCluster = errors.New("node is a member of another KubeOne cluster")

// KubeOneCluster is a KubeOne cluster the hub manages: its members (by
// node ID), what the generated manifest says, and the public half of its
// SSH key (the private half is a file in the data dir, never here).
type KubeOneCluster struct {
	Name string `json:"name"`
	// ID is random per creation: a cluster deleted and created again under
	// the same name is another cluster, and nothing the first one was
	// granted (its certificate principal) reaches the second.
	ID         string `json:"id"`
	Kubernetes string `json:"kubernetes"` // the Kubernetes version, e.g. 1.30.5
	Login      string `json:"login"`      // the SSH login KubeOne uses on the members
	CNI        string `json:"cni"`
	// Extra is a JSON object merged into the generated manifest.
	Extra string `json:"extra,omitempty"`
	// PublicKey is the cluster's SSH public key (authorized_keys format).
	PublicKey string `json:"public_key"`
	Status    string `json:"status"`
	// Members are the control-plane nodes first, then the workers, each in
	// the order given.
	Members   []KubeOneMember `json:"members"`
	LastApply KubeOneApply    `json:"last_apply"`
	CreatedAt time.Time       `json:"created_at"`
	UpdatedAt time.Time       `json:"updated_at"`
}

// KubeOneMember is one member of a KubeOne cluster with its node as the
// store knows it now (name, online, facts).
type KubeOneMember struct {
	NodeID string `json:"node_id"`
	Role   string `json:"role"` // KubeOneControlPlane | KubeOneWorker
	Node   Node   `json:"node"`
}

// KubeOneApply is the last `kubeone apply` or `reset` run for a cluster.
type KubeOneApply struct {
	Job    string    `json:"job,omitempty"`
	Result string    `json:"result,omitempty"`
	At     time.Time `json:"at,omitzero"`
}

// KubeOneStore persists KubeOne clusters.
type KubeOneStore interface {
	// CreateKubeOneCluster stores a new cluster with its members (c.Members'
	// NodeID and Role). ErrNameTaken if the name is; ErrInOtherCluster if a
	// member already belongs to a cluster; a *KubernetesOwnerError if a
	// member's node has an engine of the cluster state machine; ErrNotFound
	// if a member's node is not registered. Nothing is stored then.
	CreateKubeOneCluster(ctx context.Context, c KubeOneCluster) error
	GetKubeOneCluster(ctx context.Context, name string) (KubeOneCluster, error)
	ListKubeOneClusters(ctx context.Context) ([]KubeOneCluster, error)
	// SetKubeOneMembers replaces the cluster's members, with the errors of
	// CreateKubeOneCluster.
	SetKubeOneMembers(ctx context.Context, name string, members []KubeOneMember, at time.Time) error
	// SetKubeOneStatus records the cluster's status and, if apply.Job is
	// set, its last apply.
	SetKubeOneStatus(ctx context.Context, name, status string, apply KubeOneApply, at time.Time) error
	DeleteKubeOneCluster(ctx context.Context, name string) error
}

// CreateKubeOneCluster implements KubeOneStore.
func (s *DB) CreateKubeOneCluster(ctx context.Context, c KubeOneCluster) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: create KubeOne cluster %s: %w", c.Name, err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx,
		`INSERT INTO kubeone_clusters (name, id, kubernetes, login, cni, extra, public_key, status, created_at, updated_at)
		VALUES (?,?,?,?,?,?,?,?,?,?)`,
		c.Name, c.ID, c.Kubernetes, c.Login, c.CNI, orEmptyObject(c.Extra), c.PublicKey, c.Status,
		unix(c.CreatedAt), unix(c.CreatedAt))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: KubeOne cluster %q: %w", c.Name, ErrNameTaken)
	}
	if err != nil {
		return fmt.Errorf("store: create KubeOne cluster %s: %w", c.Name, err)
	}
	if err := s.putMembers(ctx, tx, c.Name, c.Members); err != nil {
		return err
	}
	return tx.Commit()
}

func orEmptyObject(s string) string {
	if strings.TrimSpace(s) == "" {
		return "{}"
	}
	return s
}

// putMembers replaces cluster's members in tx. Each member's node must be
// free of any other Kubernetes: no other KubeOne cluster
// (ErrInOtherCluster) and no engine of the cluster state machine (a
// *KubernetesOwnerError). The nodes are locked first, in ID order, as a
// cluster member's write locks its node, so the two never both win.
func (s *DB) putMembers(ctx context.Context, tx *sql.Tx, cluster string, members []KubeOneMember) error {
	ids := make([]string, 0, len(members))
	for _, m := range members {
		ids = append(ids, m.NodeID)
	}
	slices.Sort(ids)
	for _, id := range ids {
		if _, err := s.lockNode(ctx, tx, id); err != nil {
			return fmt.Errorf("store: KubeOne cluster %s: %w", cluster, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM kubeone_members WHERE cluster = ?`, cluster); err != nil {
		return fmt.Errorf("store: KubeOne cluster %s: members: %w", cluster, err)
	}
	for i, m := range members {
		var other string
		err := tx.QueryRowContext(ctx, `SELECT cluster FROM kubeone_members WHERE node_id = ?`, m.NodeID).Scan(&other)
		switch {
		case err == nil:
			return fmt.Errorf("store: node %s is in KubeOne cluster %q: %w", m.NodeID, other, ErrInOtherCluster)
		case !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("store: KubeOne cluster %s: member %s: %w", cluster, m.NodeID, err)
		}
		var engine, desired, state string
		err = tx.QueryRowContext(ctx, `SELECT engine, desired, state FROM cluster_members WHERE node_id = ?`, m.NodeID).
			Scan(&engine, &desired, &state)
		switch {
		case err == nil && (desired == memberDesiredActive || state != memberStateInactive):
			return &KubernetesOwnerError{NodeID: m.NodeID, Engine: engine, Desired: desired, State: state}
		case err != nil && !errors.Is(err, sql.ErrNoRows):
			return fmt.Errorf("store: KubeOne cluster %s: member %s: engine: %w", cluster, m.NodeID, err)
		}
		_, err = tx.ExecContext(ctx, `INSERT INTO kubeone_members (node_id, cluster, role, position) VALUES (?,?,?,?)`,
			m.NodeID, cluster, m.Role, i)
		if isForeignKeyViolation(err) {
			return fmt.Errorf("store: KubeOne cluster %s: node %s: %w", cluster, m.NodeID, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("store: KubeOne cluster %s: member %s: %w", cluster, m.NodeID, err)
		}
	}
	return nil
}

const kubeOneColumns = `name, id, kubernetes, login, cni, extra, public_key, status, last_apply_job, ` +
	`last_apply_result, last_apply_at, created_at, updated_at`

func scanKubeOne(r scanner) (KubeOneCluster, error) {
	var c KubeOneCluster
	var applyAt, created, updated int64
	if err := r.Scan(&c.Name, &c.ID, &c.Kubernetes, &c.Login, &c.CNI, &c.Extra, &c.PublicKey, &c.Status,
		&c.LastApply.Job, &c.LastApply.Result, &applyAt, &created, &updated); err != nil {
		return KubeOneCluster{}, err
	}
	if c.Extra == "{}" {
		c.Extra = ""
	}
	c.LastApply.At, c.CreatedAt, c.UpdatedAt = fromUnix(applyAt), fromUnix(created), fromUnix(updated)
	return c, nil
}

// GetKubeOneCluster implements KubeOneStore.
func (s *DB) GetKubeOneCluster(ctx context.Context, name string) (KubeOneCluster, error) {
	c, err := scanKubeOne(s.db.QueryRowContext(ctx, `SELECT `+kubeOneColumns+` FROM kubeone_clusters WHERE name = ?`,
		name))
	if errors.Is(err, sql.ErrNoRows) {
		return KubeOneCluster{}, fmt.Errorf("store: KubeOne cluster %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return KubeOneCluster{}, fmt.Errorf("store: KubeOne cluster %s: %w", name, err)
	}
	all, err := s.kubeOneMembers(ctx, name)
	if err != nil {
		return KubeOneCluster{}, err
	}
	c.Members = all[name]
	return c, nil
}

// ListKubeOneClusters implements KubeOneStore (by name).
func (s *DB) ListKubeOneClusters(ctx context.Context) ([]KubeOneCluster, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+kubeOneColumns+` FROM kubeone_clusters ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list KubeOne clusters: %w", err)
	}
	defer rows.Close()
	var out []KubeOneCluster
	for rows.Next() {
		c, err := scanKubeOne(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list KubeOne clusters: %w", err)
		}
		out = append(out, c)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list KubeOne clusters: %w", err)
	}
	rows.Close()
	all, err := s.kubeOneMembers(ctx, "")
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Members = all[out[i].Name]
	}
	return out, nil
}

// kubeOneMembers returns the members of cluster ("" for every cluster)
// with their nodes, per cluster, control-plane first, each in its order.
func (s *DB) kubeOneMembers(ctx context.Context, cluster string) (map[string][]KubeOneMember, error) {
	cols := make([]string, 0, 20)
	for c := range strings.SplitSeq(nodeColumns, ",") {
		cols = append(cols, "n."+strings.TrimSpace(c))
	}
	rows, err := s.db.QueryContext(ctx, `SELECT m.cluster, m.role, `+strings.Join(cols, ", ")+`
		FROM kubeone_members m JOIN nodes n ON n.id = m.node_id
		WHERE ? = '' OR m.cluster = ? ORDER BY m.cluster, m.role = '`+KubeOneWorker+`', m.position`, cluster, cluster)
	if err != nil {
		return nil, fmt.Errorf("store: KubeOne members: %w", err)
	}
	defer rows.Close()
	out := map[string][]KubeOneMember{}
	for rows.Next() {
		var name, role string
		n, err := scanNode(rowPrefix{rows, []any{&name, &role}})
		if err != nil {
			return nil, fmt.Errorf("store: KubeOne members: %w", err)
		}
		out[name] = append(out[name], KubeOneMember{NodeID: n.ID, Role: role, Node: n})
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: KubeOne members: %w", err)
	}
	return out, nil
}

// rowPrefix scans dest first, then what scanNode asks for.
type rowPrefix struct {
	r    scanner
	dest []any
}

func (p rowPrefix) Scan(dest ...any) error { return p.r.Scan(append(p.dest, dest...)...) }

// SetKubeOneMembers implements KubeOneStore.
func (s *DB) SetKubeOneMembers(ctx context.Context, name string, members []KubeOneMember, at time.Time) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: KubeOne cluster %s: members: %w", name, err)
	}
	defer tx.Rollback()
	res, err := tx.ExecContext(ctx, `UPDATE kubeone_clusters SET updated_at = ? WHERE name = ?`, unix(at), name)
	if err != nil {
		return fmt.Errorf("store: KubeOne cluster %s: members: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: KubeOne cluster %q: %w", name, ErrNotFound)
	}
	if err := s.putMembers(ctx, tx, name, members); err != nil {
		return err
	}
	return tx.Commit()
}

// SetKubeOneStatus implements KubeOneStore.
func (s *DB) SetKubeOneStatus(ctx context.Context, name, status string, apply KubeOneApply, at time.Time) error {
	q := `UPDATE kubeone_clusters SET status = ?, updated_at = ? WHERE name = ?`
	args := []any{status, unix(at), name}
	if apply.Job != "" {
		q = `UPDATE kubeone_clusters SET status = ?, updated_at = ?, last_apply_job = ?, last_apply_result = ?, ` +
			`last_apply_at = ? WHERE name = ?`
		args = []any{status, unix(at), apply.Job, apply.Result, unix(apply.At), name}
	}
	res, err := s.fencedExec(ctx, q, args...)
	if err != nil {
		return fmt.Errorf("store: KubeOne cluster %s: status: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: KubeOne cluster %q: %w", name, ErrNotFound)
	}
	return nil
}

// DeleteKubeOneCluster implements KubeOneStore (its members go with it).
func (s *DB) DeleteKubeOneCluster(ctx context.Context, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM kubeone_clusters WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("store: delete KubeOne cluster %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: KubeOne cluster %q: %w", name, ErrNotFound)
	}
	return nil
}
