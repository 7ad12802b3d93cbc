package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ErrStale means a presence update lost to a newer one: the node's tunnel
// was claimed again (a higher epoch) or moved to another replica since.
var ErrStale = errors.New("stale presence update")

// ReplicaStore is what hub replicas sharing one store know of each other:
// the replicas and their leases, which replica holds each node's tunnel
// (presence), and the secrets every replica presents alike (the hub
// identity).
//
// The SQL is plain enough to run on SQLite and PostgreSQL alike (ON
// CONFLICT upserts, RETURNING, integer milliseconds for times).
type ReplicaStore interface {
	// HeartbeatReplica records r (insert or update) and extends the lease
	// of every presence row r holds to r.LeaseUntil, in one transaction.
	HeartbeatReplica(ctx context.Context, r Replica) error
	// ListReplicas returns every replica ever recorded, expired leases
	// included (the caller compares LeaseUntil with the time).
	ListReplicas(ctx context.Context) ([]Replica, error)
	// DeleteReplica forgets a replica and releases its presence rows.
	DeleteReplica(ctx context.Context, id string) error

	// ClaimPresence records that p.ReplicaID now holds p.NodeID's tunnel
	// until p.LeaseUntil, with p.Session, and an epoch one above any the
	// node had (p.Epoch is ignored): the latest claim wins, whichever
	// replica made the earlier one.
	ClaimPresence(ctx context.Context, p Presence) (Presence, error)
	// ReleasePresence ends p's claim when the tunnel closes. It returns
	// ErrStale, and changes nothing, if the node was claimed again since
	// (another epoch or replica).
	ReleasePresence(ctx context.Context, p Presence) error
	// GetPresence returns the node's latest claim (ErrNotFound if it never
	// had one). A released claim has an empty ReplicaID; an expired one a
	// LeaseUntil in the past: neither holds the node.
	GetPresence(ctx context.Context, nodeID string) (Presence, error)
	// ListPresence returns every claim that has a replica.
	ListPresence(ctx context.Context) ([]Presence, error)
	// PresenceHeldBy returns replica id's claims with their Session, its
	// lease expired or not: what a replica that found id dead needs to
	// send id's agents over.
	PresenceHeldBy(ctx context.Context, id string) ([]Presence, error)

	// GetSecret returns the named shared secret (ErrNotFound if unset).
	GetSecret(ctx context.Context, name string) ([]byte, error)
	// PutSecretIfAbsent stores value under name unless the name is taken,
	// and returns what is stored now: value if this call won, the earlier
	// value otherwise. Two replicas racing end with one value.
	PutSecretIfAbsent(ctx context.Context, name string, value []byte) ([]byte, error)
}

// Replica is one hub process sharing the store.
type Replica struct {
	ID string
	// PeerAddr is where other replicas dial this one's peer listener.
	PeerAddr string
	// APIAddr and SSHAddr are the replica's API and bastion addresses, for
	// `tether replicas`.
	APIAddr, SSHAddr string
	Version          string
	Started          time.Time
	// LeaseUntil is when the replica counts as dead unless it heartbeats
	// again; its presence rows expire with it.
	LeaseUntil time.Time
	// Links are the replicas this one has a live peer link to (their IDs).
	Links []string
	// Hubs are the addresses agents dial for this replica (its
	// --advertise, or its own listener): join strings and welcomes name
	// every live replica's.
	Hubs []string
}

// Presence is which replica holds a node's tunnel.
type Presence struct {
	NodeID    string
	ReplicaID string // "" once released
	// Epoch grows by one with every claim of the node, so an update from
	// an earlier connection (a late disconnect) is told apart and refused.
	Epoch      int64
	LeaseUntil time.Time
	// Session is what the holder knows of the node's live session that
	// other replicas need (its agent's hello: state dir, updater), as the
	// hub encodes it; opaque to the store.
	Session []byte
}

// Live reports whether p names a replica whose lease runs at now.
func (p Presence) Live(now time.Time) bool {
	return p.ReplicaID != "" && p.LeaseUntil.After(now)
}

// migrationReplicas adds the tables of hub replicas sharing a store: the
// replicas, presence (which replica holds each node's tunnel), and shared
// secrets (the hub identity every replica presents).
const migrationReplicas = `CREATE TABLE replicas (
		id TEXT PRIMARY KEY,
		peer_addr TEXT NOT NULL DEFAULT '',
		api_addr TEXT NOT NULL DEFAULT '',
		ssh_addr TEXT NOT NULL DEFAULT '',
		version TEXT NOT NULL DEFAULT '',
		started INTEGER NOT NULL DEFAULT 0,
		lease_until INTEGER NOT NULL DEFAULT 0,
		links TEXT NOT NULL DEFAULT '[]'
	);
	CREATE TABLE presence (
		node_id TEXT PRIMARY KEY,
		replica_id TEXT NOT NULL DEFAULT '',
		epoch BIGINT NOT NULL DEFAULT 0,
		lease_until BIGINT NOT NULL DEFAULT 0,
		session TEXT NOT NULL DEFAULT ''
	);
	CREATE INDEX presence_replica ON presence (replica_id);
	CREATE TABLE secrets (
		name TEXT PRIMARY KEY,
		value BLOB NOT NULL,
		created_at BIGINT NOT NULL
	);`

// migrationReplicaHubs adds the addresses agents dial for each replica.
const migrationReplicaHubs = `ALTER TABLE replicas ADD COLUMN hubs TEXT NOT NULL DEFAULT '[]';`

// HeartbeatReplica implements ReplicaStore.
func (s *DB) HeartbeatReplica(ctx context.Context, r Replica) error {
	links, _ := json.Marshal(nonNil(r.Links))
	hubs, _ := json.Marshal(nonNil(r.Hubs))
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: heartbeat replica %s: %w", r.ID, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO replicas (id, peer_addr, api_addr, ssh_addr, version, started, lease_until, links, hubs)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
		ON CONFLICT (id) DO UPDATE SET peer_addr = excluded.peer_addr, api_addr = excluded.api_addr, `+
			`ssh_addr = excluded.ssh_addr,
			version = excluded.version, started = excluded.started, lease_until = excluded.lease_until, links = excluded.links,
			hubs = excluded.hubs`,
		r.ID, r.PeerAddr, r.APIAddr, r.SSHAddr, r.Version, unix(r.Started), unix(r.LeaseUntil), string(links),
		string(hubs)); err != nil {
		return fmt.Errorf("store: heartbeat replica %s: %w", r.ID, err)
	}
	if _, err := tx.ExecContext(ctx, `UPDATE presence SET lease_until = ? WHERE replica_id = ?`, unix(r.LeaseUntil),
		r.ID); err != nil {
		return fmt.Errorf("store: renew presence of replica %s: %w", r.ID, err)
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("store: heartbeat replica %s: %w", r.ID, err)
	}
	return nil
}

func nonNil(s []string) []string {
	if s == nil {
		return []string{}
	}
	return s
}

// ListReplicas implements ReplicaStore.
func (s *DB) ListReplicas(ctx context.Context) ([]Replica, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT id, peer_addr, api_addr, ssh_addr, version, started, lease_until, links, hubs FROM replicas ORDER BY id`)
	if err != nil {
		return nil, fmt.Errorf("store: list replicas: %w", err)
	}
	defer rows.Close()
	var out []Replica
	for rows.Next() {
		var (
			r              Replica
			started, lease int64
			links, hubs    string
		)
		if err := rows.Scan(&r.ID, &r.PeerAddr, &r.APIAddr, &r.SSHAddr, &r.Version, &started, &lease, &links,
			&hubs); err != nil {
			return nil, fmt.Errorf("store: list replicas: %w", err)
		}
		r.Started, r.LeaseUntil = fromUnix(started), fromUnix(lease)
		if err := json.Unmarshal([]byte(links), &r.Links); err != nil {
			return nil, fmt.Errorf("store: replica %s: links: %w", r.ID, err)
		}
		if err := json.Unmarshal([]byte(hubs), &r.Hubs); err != nil {
			return nil, fmt.Errorf("store: replica %s: hubs: %w", r.ID, err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// DeleteReplica implements ReplicaStore.
func (s *DB) DeleteReplica(ctx context.Context, id string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: delete replica %s: %w", id, err)
	}
	defer tx.Rollback()
	if _, err := tx.ExecContext(ctx,
		`UPDATE presence SET replica_id = '', lease_until = 0, session = '' WHERE replica_id = ?`, id); err != nil {
		return fmt.Errorf("store: release presence of replica %s: %w", id, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM replicas WHERE id = ?`, id); err != nil {
		return fmt.Errorf("store: delete replica %s: %w", id, err)
	}
	return tx.Commit()
}

// ClaimPresence implements ReplicaStore.
func (s *DB) ClaimPresence(ctx context.Context, p Presence) (Presence, error) {
	err := s.db.QueryRowContext(ctx,
		`INSERT INTO presence (node_id, replica_id, epoch, lease_until, session) VALUES (?, ?, 1, ?, ?)
		ON CONFLICT (node_id) DO UPDATE SET replica_id = excluded.replica_id, epoch = presence.epoch + 1,
			lease_until = excluded.lease_until, session = excluded.session
		RETURNING epoch`, p.NodeID, p.ReplicaID, unix(p.LeaseUntil), string(p.Session)).Scan(&p.Epoch)
	if err != nil {
		return Presence{}, fmt.Errorf("store: claim presence of node %s for replica %s: %w", p.NodeID, p.ReplicaID, err)
	}
	return p, nil
}

// ReleasePresence implements ReplicaStore. The row stays (with its epoch),
// so the next claim's epoch is still higher than any before.
func (s *DB) ReleasePresence(ctx context.Context, p Presence) error {
	res, err := s.db.ExecContext(ctx,
		`UPDATE presence SET replica_id = '', lease_until = 0, session = '' WHERE node_id = ? AND replica_id = ? `+
			`AND epoch = ?`,
		p.NodeID, p.ReplicaID, p.Epoch)
	if err != nil {
		return fmt.Errorf("store: release presence of node %s: %w", p.NodeID, err)
	}
	if n, err := res.RowsAffected(); err == nil && n == 0 {
		return fmt.Errorf("store: release presence of node %s (replica %s, epoch %d): %w", p.NodeID, p.ReplicaID, p.Epoch,
			ErrStale)
	}
	return nil
}

// GetPresence implements ReplicaStore.
func (s *DB) GetPresence(ctx context.Context, nodeID string) (Presence, error) {
	p := Presence{NodeID: nodeID}
	var (
		lease   int64
		session string
	)
	err := s.db.QueryRowContext(ctx, `SELECT replica_id, epoch, lease_until, session FROM presence WHERE node_id = ?`,
		nodeID).Scan(&p.ReplicaID, &p.Epoch, &lease, &session)
	if errors.Is(err, sql.ErrNoRows) {
		return Presence{}, fmt.Errorf("store: presence of node %s: %w", nodeID, ErrNotFound)
	}
	if err != nil {
		return Presence{}, fmt.Errorf("store: presence of node %s: %w", nodeID, err)
	}
	p.LeaseUntil = fromUnix(lease)
	if session != "" {
		p.Session = []byte(session)
	}
	return p, nil
}

// ListPresence implements ReplicaStore.
func (s *DB) ListPresence(ctx context.Context) ([]Presence, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT node_id, replica_id, epoch, lease_until FROM presence WHERE replica_id <> '' ORDER BY node_id`)
	if err != nil {
		return nil, fmt.Errorf("store: list presence: %w", err)
	}
	defer rows.Close()
	var out []Presence
	for rows.Next() {
		var (
			p     Presence
			lease int64
		)
		if err := rows.Scan(&p.NodeID, &p.ReplicaID, &p.Epoch, &lease); err != nil {
			return nil, fmt.Errorf("store: list presence: %w", err)
		}
		p.LeaseUntil = fromUnix(lease)
		out = append(out, p)
	}
	return out, rows.Err()
}

// PresenceHeldBy implements ReplicaStore.
func (s *DB) PresenceHeldBy(ctx context.Context, id string) ([]Presence, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT node_id, epoch, lease_until, session FROM presence WHERE replica_id = ? ORDER BY node_id`, id)
	if err != nil {
		return nil, fmt.Errorf("store: presence held by replica %s: %w", id, err)
	}
	defer rows.Close()
	var out []Presence
	for rows.Next() {
		p := Presence{ReplicaID: id}
		var (
			lease   int64
			session string
		)
		if err := rows.Scan(&p.NodeID, &p.Epoch, &lease, &session); err != nil {
			return nil, fmt.Errorf("store: presence held by replica %s: %w", id, err)
		}
		p.LeaseUntil = fromUnix(lease)
		if session != "" {
			p.Session = []byte(session)
		}
		out = append(out, p)
	}
	return out, rows.Err()
}

// GetSecret implements ReplicaStore.
func (s *DB) GetSecret(ctx context.Context, name string) ([]byte, error) {
	var v []byte
	err := s.db.QueryRowContext(ctx, `SELECT value FROM secrets WHERE name = ?`, name).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return nil, fmt.Errorf("store: secret %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("store: secret %q: %w", name, err)
	}
	return v, nil
}

// PutSecretIfAbsent implements ReplicaStore.
func (s *DB) PutSecretIfAbsent(ctx context.Context, name string, value []byte) ([]byte, error) {
	if _, err := s.db.ExecContext(ctx,
		`INSERT INTO secrets (name, value, created_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING`,
		name, value, unix(time.Now())); err != nil {
		return nil, fmt.Errorf("store: put secret %q: %w", name, err)
	}
	return s.GetSecret(ctx, name)
}
