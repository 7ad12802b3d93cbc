package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tether-dev/tether/tunnel/siteproto"
)

// migrationDesired adds desired state sent down the tree of hubs (hub/desired):
// every object this hub holds, created here or received from its parent,
// with the highest generation stored (tombstones included: a tombstone
// refuses older generations and is passed on to sites that have not seen
// it); which generation each child site acknowledged; and each mission's
// per-node state at this hub (hub/mission).
const migrationDesired = `CREATE TABLE desired_objects (
		kind TEXT NOT NULL,
		origin TEXT NOT NULL,
		name TEXT NOT NULL,
		generation INTEGER NOT NULL,
		deleted INTEGER NOT NULL DEFAULT 0,
		spec TEXT NOT NULL DEFAULT '',
		updated_at INTEGER NOT NULL,
		PRIMARY KEY (kind, origin, name)
	);
	CREATE TABLE desired_acks (
		site TEXT NOT NULL,
		kind TEXT NOT NULL,
		origin TEXT NOT NULL,
		name TEXT NOT NULL,
		generation INTEGER NOT NULL,
		PRIMARY KEY (site, kind, origin, name)
	);
	CREATE TABLE mission_nodes (
		origin TEXT NOT NULL,
		name TEXT NOT NULL,
		node_id TEXT NOT NULL,
		node TEXT NOT NULL,
		generation INTEGER NOT NULL,
		phase TEXT NOT NULL,
		job_id TEXT NOT NULL DEFAULT '',
		error TEXT NOT NULL DEFAULT '',
		started_at INTEGER NOT NULL DEFAULT 0,
		finished_at INTEGER NOT NULL DEFAULT 0,
		check_state TEXT NOT NULL DEFAULT '',
		check_output TEXT NOT NULL DEFAULT '',
		checked_at INTEGER NOT NULL DEFAULT 0,
		updated_at INTEGER NOT NULL,
		PRIMARY KEY (origin, name, node_id)
	);`

// DesiredRecord is a stored desired object and when this hub stored its
// generation.
type DesiredRecord struct {
	siteproto.DesiredObject
	UpdatedAt time.Time `json:"updated_at"`
}

// DesiredStore persists desired state (hub/desired).
type DesiredStore interface {
	// StoreDesired stores o, in one transaction, if its generation is
	// higher than the one stored for its Kind/Origin/Name, and reports
	// whether it did. An older or equal generation changes nothing.
	StoreDesired(ctx context.Context, o siteproto.DesiredObject, at time.Time) (bool, error)
	// BumpDesired changes an object that originates at this hub: it stores
	// the next generation with spec (or a tombstone when deleted) and
	// returns it with true. It changes nothing and returns the stored
	// object with false when that already says the same (same spec and not
	// deleted, or already a tombstone), or when a tombstone is asked for an
	// object never stored (ErrNotFound then).
	BumpDesired(
		ctx context.Context, kind, origin, name string, spec []byte, deleted bool, at time.Time,
	) (siteproto.DesiredObject, bool, error)
	// GetDesired returns one object, tombstone or not (ErrNotFound if none).
	GetDesired(ctx context.Context, kind, origin, name string) (DesiredRecord, error)
	// ListDesired lists the objects of kind ("" = every kind), tombstones
	// included, by kind, origin and name.
	ListDesired(ctx context.Context, kind string) ([]DesiredRecord, error)
	// AckDesired records the generations child site acknowledged; a
	// lower generation than the one recorded changes nothing.
	AckDesired(ctx context.Context, site string, acks []siteproto.DesiredAck) error
	// UnackedDesired lists the objects whose stored generation the child
	// site has not acknowledged.
	UnackedDesired(ctx context.Context, site string) ([]siteproto.DesiredObject, error)

	MissionStore
}

// StoreDesired implements DesiredStore.
func (s *DB) StoreDesired(ctx context.Context, o siteproto.DesiredObject, at time.Time) (bool, error) {
	var stored bool
	err := s.inTx(ctx, "store desired "+o.Kind+"/"+o.Name, func(tx *sql.Tx) error {
		var gen int64
		err := tx.QueryRowContext(ctx,
			`SELECT generation FROM desired_objects WHERE kind = ? AND origin = ? AND name = ?`+s.d.forUpdate,
			o.Kind, o.Origin, o.Name).Scan(&gen)
		switch {
		case errors.Is(err, sql.ErrNoRows):
		case err != nil:
			return err
		case gen >= o.Generation:
			return nil
		}
		stored = true
		return putDesired(ctx, tx, o, at)
	})
	return stored, err
}

func putDesired(ctx context.Context, tx *sql.Tx, o siteproto.DesiredObject, at time.Time) error {
	_, err := tx.ExecContext(ctx,
		`INSERT INTO desired_objects (kind, origin, name, generation, deleted, spec, updated_at) VALUES (?,?,?,?,?,?,?)
		ON CONFLICT (kind, origin, name) DO UPDATE SET generation = excluded.generation, deleted = excluded.deleted, `+
			`spec = excluded.spec, updated_at = excluded.updated_at`,
		o.Kind, o.Origin, o.Name, o.Generation, o.Deleted, string(o.Spec), unix(at))
	return err
}

// BumpDesired implements DesiredStore.
func (s *DB) BumpDesired(
	ctx context.Context, kind, origin, name string, spec []byte, deleted bool, at time.Time,
) (siteproto.DesiredObject, bool, error) {
	var (
		out     siteproto.DesiredObject
		changed bool
	)
	err := s.inTx(ctx, "change desired "+kind+"/"+name, func(tx *sql.Tx) error {
		cur, err := scanDesired(tx.QueryRowContext(ctx,
			`SELECT kind, origin, name, generation, deleted, spec, updated_at FROM desired_objects
			WHERE kind = ? AND origin = ? AND name = ?`+s.d.forUpdate, kind, origin, name))
		switch {
		case errors.Is(err, ErrNotFound):
			if deleted {
				return fmt.Errorf("%s %q: %w", kind, name, ErrNotFound)
			}
		case err != nil:
			return err
		case deleted && cur.Deleted, !deleted && !cur.Deleted && string(cur.Spec) == string(spec):
			out = cur.DesiredObject
			return nil
		}
		out = siteproto.DesiredObject{
			Kind:       kind,
			Origin:     origin,
			Name:       name,
			Generation: cur.Generation + 1,
			Deleted:    deleted,
		}
		if !deleted {
			out.Spec = append([]byte(nil), spec...)
		}
		changed = true
		return putDesired(ctx, tx, out, at)
	})
	return out, changed, err
}

// inTx runs f in a transaction and commits it; what names the work in errors.
func (s *DB) inTx(ctx context.Context, what string, f func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	defer tx.Rollback()
	if err := f(tx); err != nil {
		if errors.Is(err, ErrNotFound) {
			return err
		}
		return fmt.Errorf("store: %s: %w", what, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: %s: %w", what, err)
	}
	return nil
}

func scanDesired(r scanner) (DesiredRecord, error) {
	var (
		d       DesiredRecord
		spec    string
		updated int64
	)
	err := r.Scan(&d.Kind, &d.Origin, &d.Name, &d.Generation, &d.Deleted, &spec, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return d, ErrNotFound
	}
	if err != nil {
		return d, err
	}
	if spec != "" {
		d.Spec = []byte(spec)
	}
	d.UpdatedAt = fromUnix(updated)
	return d, nil
}

// GetDesired implements DesiredStore.
func (s *DB) GetDesired(ctx context.Context, kind, origin, name string) (DesiredRecord, error) {
	d, err := scanDesired(s.db.QueryRowContext(ctx,
		`SELECT kind, origin, name, generation, deleted, spec, updated_at FROM desired_objects
		WHERE kind = ? AND origin = ? AND name = ?`, kind, origin, name))
	if errors.Is(err, ErrNotFound) {
		return d, fmt.Errorf("%s %q: %w", kind, name, ErrNotFound)
	}
	if err != nil {
		return d, fmt.Errorf("store: get desired %s/%s: %w", kind, name, err)
	}
	return d, nil
}

// ListDesired implements DesiredStore.
func (s *DB) ListDesired(ctx context.Context, kind string) ([]DesiredRecord, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT kind, origin, name, generation, deleted, spec, updated_at FROM desired_objects
		WHERE ? = '' OR kind = ? ORDER BY kind, origin, name`, kind, kind)
	if err != nil {
		return nil, fmt.Errorf("store: list desired: %w", err)
	}
	defer rows.Close()
	var out []DesiredRecord
	for rows.Next() {
		d, err := scanDesired(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list desired: %w", err)
		}
		out = append(out, d)
	}
	return out, rows.Err()
}

// AckDesired implements DesiredStore.
func (s *DB) AckDesired(ctx context.Context, site string, acks []siteproto.DesiredAck) error {
	return s.inTx(ctx, "record acks of site "+site, func(tx *sql.Tx) error {
		for _, a := range acks {
			if _, err := tx.ExecContext(ctx, `INSERT INTO desired_acks (site, kind, origin, name, generation) VALUES (?,?,?,?,?)
				ON CONFLICT (site, kind, origin, name) DO UPDATE SET generation = excluded.generation
				WHERE desired_acks.generation < excluded.generation`, site, a.Kind, a.Origin, a.Name, a.Generation); err != nil {
				return err
			}
		}
		return nil
	})
}

// UnackedDesired implements DesiredStore.
func (s *DB) UnackedDesired(ctx context.Context, site string) ([]siteproto.DesiredObject, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT o.kind, o.origin, o.name, o.generation, o.deleted, o.spec, o.updated_at FROM desired_objects o
		LEFT JOIN desired_acks a ON a.site = ? AND a.kind = o.kind AND a.origin = o.origin AND a.name = o.name
		WHERE a.generation IS NULL OR a.generation < o.generation ORDER BY o.kind, o.origin, o.name`, site)
	if err != nil {
		return nil, fmt.Errorf("store: unacked desired of site %s: %w", site, err)
	}
	defer rows.Close()
	var out []siteproto.DesiredObject
	for rows.Next() {
		d, err := scanDesired(rows)
		if err != nil {
			return nil, fmt.Errorf("store: unacked desired of site %s: %w", site, err)
		}
		out = append(out, d.DesiredObject)
	}
	return out, rows.Err()
}

// Mission phases of one node (hub/mission).
const (
	MissionPending = "pending" // the node matches; its run has not started
	MissionRunning = "running" // the run started (durably recorded first)
	MissionApplied = "applied" // the script exited 0
	MissionFailed  = "failed"  // the script failed, or its run was interrupted
)

// MissionNode is one node's state in one mission at this hub.
type MissionNode struct {
	Origin string `json:"origin"`
	// Mission is the mission's name at its origin.
	Mission    string    `json:"mission"`
	NodeID     string    `json:"node_id"`
	Node       string    `json:"node"`
	Generation int64     `json:"generation"`
	Phase      string    `json:"phase"`
	JobID      string    `json:"job_id,omitempty"`
	Error      string    `json:"error,omitempty"`
	StartedAt  time.Time `json:"started_at,omitzero"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// CheckState is the state check's last result: "ok", "failed" or ""
	// (not run yet, or the mission has none).
	CheckState  string    `json:"check_state,omitempty"`
	CheckOutput string    `json:"check_output,omitempty"`
	CheckedAt   time.Time `json:"checked_at,omitzero"`
	UpdatedAt   time.Time `json:"updated_at"`
}

// MissionStore persists missions' per-node state.
type MissionStore interface {
	// PlanMissionNode records that node n is to run its mission at
	// n.Generation (phase pending), unless the node's record is already at
	// that generation or a later one; it reports whether it changed.
	PlanMissionNode(ctx context.Context, n MissionNode) (bool, error)
	// StartMissionNode moves the node's record from pending to running at
	// generation gen, atomically, and reports whether it did: false means
	// the run started before (or the generation moved on), so it must not
	// start again.
	StartMissionNode(
		ctx context.Context, origin, mission, nodeID string, gen int64, jobID string, at time.Time,
	) (bool, error)
	// FinishMissionNode records a run's end (applied or failed) for a node
	// running at generation gen; false if it was not running at gen.
	FinishMissionNode(
		ctx context.Context, origin, mission, nodeID string, gen int64, phase, errMsg string, at time.Time,
	) (bool, error)
	// SetMissionCheck records a state check's result.
	SetMissionCheck(ctx context.Context, origin, mission, nodeID, state, output string, at time.Time) error
	// ListMissionNodes lists the node records of a mission ("" and "": of
	// every mission), by mission and node name.
	ListMissionNodes(ctx context.Context, origin, mission string) ([]MissionNode, error)
	// DeleteMissionNodes removes a mission's node records (its tombstone
	// arrived); with nodeID only that node's.
	DeleteMissionNodes(ctx context.Context, origin, mission, nodeID string) error
}

// PlanMissionNode implements MissionStore.
func (s *DB) PlanMissionNode(ctx context.Context, n MissionNode) (bool, error) {
	res, err := s.db.ExecContext(ctx,
		`INSERT INTO mission_nodes (origin, name, node_id, node, generation, phase, updated_at) VALUES (?,?,?,?,?,?,?)
		ON CONFLICT (origin, name, node_id) DO UPDATE SET node = excluded.node, generation = excluded.generation, `+
			`phase = excluded.phase,
			job_id = '', error = '', started_at = 0, finished_at = 0, updated_at = excluded.updated_at
		WHERE mission_nodes.generation < excluded.generation`,
		n.Origin, n.Mission, n.NodeID, n.Node, n.Generation, MissionPending, unix(n.UpdatedAt))
	if err != nil {
		return false, fmt.Errorf("store: plan mission %s on node %s: %w", n.Mission, n.Node, err)
	}
	k, _ := res.RowsAffected()
	return k > 0, nil
}

// StartMissionNode implements MissionStore.
func (s *DB) StartMissionNode(
	ctx context.Context, origin, mission, nodeID string, gen int64, jobID string, at time.Time,
) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE mission_nodes SET phase = ?, job_id = ?, started_at = ?, updated_at = ?
		WHERE origin = ? AND name = ? AND node_id = ? AND generation = ? AND phase = ?`,
		MissionRunning, jobID, unix(at), unix(at), origin, mission, nodeID, gen, MissionPending)
	if err != nil {
		return false, fmt.Errorf("store: start mission %s on node %s: %w", mission, nodeID, err)
	}
	k, _ := res.RowsAffected()
	return k > 0, nil
}

// FinishMissionNode implements MissionStore.
func (s *DB) FinishMissionNode(
	ctx context.Context, origin, mission, nodeID string, gen int64, phase, errMsg string, at time.Time,
) (bool, error) {
	res, err := s.db.ExecContext(ctx, `UPDATE mission_nodes SET phase = ?, error = ?, finished_at = ?, updated_at = ?
		WHERE origin = ? AND name = ? AND node_id = ? AND generation = ? AND phase = ?`,
		phase, errMsg, unix(at), unix(at), origin, mission, nodeID, gen, MissionRunning)
	if err != nil {
		return false, fmt.Errorf("store: finish mission %s on node %s: %w", mission, nodeID, err)
	}
	k, _ := res.RowsAffected()
	return k > 0, nil
}

// SetMissionCheck implements MissionStore.
func (s *DB) SetMissionCheck(ctx context.Context, origin, mission, nodeID, state, output string, at time.Time) error {
	_, err := s.db.ExecContext(ctx,
		`UPDATE mission_nodes SET check_state = ?, check_output = ?, checked_at = ?, updated_at = ?
		WHERE origin = ? AND name = ? AND node_id = ?`, state, output, unix(at), unix(at), origin, mission, nodeID)
	if err != nil {
		return fmt.Errorf("store: record state check of mission %s on node %s: %w", mission, nodeID, err)
	}
	return nil
}

// ListMissionNodes implements MissionStore.
func (s *DB) ListMissionNodes(ctx context.Context, origin, mission string) ([]MissionNode, error) {
	q := `SELECT origin, name, node_id, node, generation, phase, job_id, error, started_at, finished_at, check_state, ` +
		`check_output, checked_at, updated_at
		FROM mission_nodes`
	var args []any
	if origin != "" || mission != "" {
		q += ` WHERE origin = ? AND name = ?`
		args = append(args, origin, mission)
	}
	rows, err := s.db.QueryContext(ctx, q+` ORDER BY origin, name, node`, args...)
	if err != nil {
		return nil, fmt.Errorf("store: list mission nodes: %w", err)
	}
	defer rows.Close()
	var out []MissionNode
	for rows.Next() {
		var (
			n                                     MissionNode
			started, finished, checked, updatedAt int64
		)
		if err := rows.Scan(&n.Origin, &n.Mission, &n.NodeID, &n.Node, &n.Generation, &n.Phase, &n.JobID, &n.Error,
			&started, &finished, &n.CheckState, &n.CheckOutput, &checked, &updatedAt); err != nil {
			return nil, fmt.Errorf("store: list mission nodes: %w", err)
		}
		n.StartedAt, n.FinishedAt, n.CheckedAt, n.UpdatedAt =
			fromUnix(started), fromUnix(finished), fromUnix(checked), fromUnix(updatedAt)
		out = append(out, n)
	}
	return out, rows.Err()
}

// DeleteMissionNodes implements MissionStore.
func (s *DB) DeleteMissionNodes(ctx context.Context, origin, mission, nodeID string) error {
	q, args := `DELETE FROM mission_nodes WHERE origin = ? AND name = ?`, []any{origin, mission}
	if nodeID != "" {
		q += ` AND node_id = ?`
		args = append(args, nodeID)
	}
	if _, err := s.db.ExecContext(ctx, q, args...); err != nil {
		return fmt.Errorf("store: delete mission %s nodes: %w", strings.TrimSpace(mission), err)
	}
	return nil
}
