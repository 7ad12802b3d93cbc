package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"maps"
	"time"
)

// Onboarding of machines already in the field: an on-site person runs the
// onboarding CLI on the machine with an onboarding credential; the hub
// matches the machine's OS to an OS profile and creates its node. The node
// is bound to the machine's UUID and the public key of its CSR, so a retry
// from the same machine finds the same node and a second machine claiming
// the UUID is refused.

// Sentinel errors of onboarding, each a refusal reason the hub audits.
var (
	ErrCredentialUnknown = errors.New("onboarding credential unknown")
	ErrCredentialRevoked = errors.New("onboarding credential revoked")
	ErrCredentialExpired = errors.New("onboarding credential expired")
	ErrCredentialUsedUp  = errors.New("onboarding credential exhausted (no uses left)")
	// ErrMachineKeyMismatch: the machine UUID is bound to a node whose key
	// differs from the one presented (a second machine with the same UUID,
	// or the first one reinstalled without its key).
	ErrMachineKeyMismatch = errors.New("machine already onboarded with another key")
)

// OnboardingCredential is what `tether onboarding create` makes: one
// credential for an on-site person, good for Uses nodes until ExpiresAt.
// The secret itself is never stored.
type OnboardingCredential struct {
	ID         string            `json:"id"`
	Name       string            `json:"name"`
	SecretHash []byte            `json:"-"`
	Role       string            `json:"role"`   // the permission it carries: access.RoleOnboarder
	Labels     map[string]string `json:"labels"` // set on every node it creates (they win over requested ones)
	Uses       int               `json:"uses"`
	UsesLeft   int               `json:"uses_left"`
	ExpiresAt  time.Time         `json:"expires_at"`
	CreatedAt  time.Time         `json:"created_at"`
	RevokedAt  time.Time         `json:"revoked_at,omitzero"`
}

// Usable says why c cannot create a node at now (revoked, expired,
// exhausted), or nil.
func (c OnboardingCredential) Usable(now time.Time) error {
	switch {
	case !c.RevokedAt.IsZero():
		return fmt.Errorf("%w at %s", ErrCredentialRevoked, c.RevokedAt.UTC().Format(time.RFC3339))
	case !now.Before(c.ExpiresAt):
		return fmt.Errorf("%w at %s", ErrCredentialExpired, c.ExpiresAt.UTC().Format(time.RFC3339))
	case c.UsesLeft <= 0:
		return fmt.Errorf("%w: all %d used", ErrCredentialUsedUp, c.Uses)
	}
	return nil
}

// OSProfile says how a machine running one OS is onboarded: the cloud-init
// template its user-data is rendered from ("" for the built-in default).
type OSProfile struct {
	Name      string    `json:"name"`
	Distro    string    `json:"distro"`           // os-release ID
	Version   string    `json:"version"`          // os-release VERSION_ID
	Family    string    `json:"family,omitempty"` // matched against ID_LIKE when no distro+version profile fits
	CloudInit string    `json:"cloud_init,omitempty"`
	CreatedAt time.Time `json:"created_at"`
}

// Machine binds a machine in the field to its node.
type Machine struct {
	UUID         string    `json:"uuid"`
	NodeID       string    `json:"node_id"`
	PublicKey    string    `json:"public_key"` // SHA-256 of the CSR's SubjectPublicKeyInfo, hex
	CredentialID string    `json:"credential_id"`
	CreatedAt    time.Time `json:"created_at"`
}

// OnboardingStore is the onboarding part of the Store.
type OnboardingStore interface {
	// CreateOnboardingCredential stores c (ErrNameTaken if its name is).
	CreateOnboardingCredential(ctx context.Context, c OnboardingCredential) error
	ListOnboardingCredentials(ctx context.Context) ([]OnboardingCredential, error)
	// GetOnboardingCredential returns credential id (ErrNotFound).
	GetOnboardingCredential(ctx context.Context, id string) (OnboardingCredential, error)
	// RevokeOnboardingCredential marks the credential named name revoked
	// (ErrNotFound if there is none). It is kept, so a later use is
	// refused as revoked rather than unknown.
	RevokeOnboardingCredential(ctx context.Context, name string, at time.Time) (OnboardingCredential, error)

	// AddOSProfile stores p (ErrNameTaken if its name, or its distro and
	// version, are taken).
	AddOSProfile(ctx context.Context, p OSProfile) error
	ListOSProfiles(ctx context.Context) ([]OSProfile, error)
	DeleteOSProfile(ctx context.Context, name string) error

	// GetMachine returns the binding of machine uuid (ErrNotFound).
	GetMachine(ctx context.Context, uuid string) (Machine, error)
	// Onboard creates node n for machine m in one transaction: if m.UUID
	// is bound already, with the same key it returns that node and
	// existing=true (nothing is spent), with another key
	// ErrMachineKeyMismatch. Otherwise it reads credential credID, calls
	// check on it (the secret comparison), refuses it if not Usable,
	// consumes one use, creates n with the credential's labels merged over
	// n's, and binds m to it. A crash leaves either nothing or all of it.
	Onboard(
		ctx context.Context, credID string, check func(OnboardingCredential) error, m Machine, n Node,
	) (node Node, existing bool, err error)
}

// migrationOnboarding: credentials (hashed), OS profiles, and the machine
// UUID → node binding. A binding goes with its node: a removed node's
// machine may be onboarded again.
const migrationOnboarding = `CREATE TABLE onboarding_credentials (
		id TEXT PRIMARY KEY,
		name TEXT NOT NULL UNIQUE,
		secret_hash BLOB NOT NULL,
		role TEXT NOT NULL,
		labels TEXT NOT NULL DEFAULT '{}',
		uses INTEGER NOT NULL,
		uses_left INTEGER NOT NULL,
		expires_at INTEGER NOT NULL,
		created_at INTEGER NOT NULL,
		revoked_at INTEGER NOT NULL DEFAULT 0
	);
	CREATE TABLE os_profiles (
		name TEXT PRIMARY KEY,
		distro TEXT NOT NULL,
		version TEXT NOT NULL,
		family TEXT NOT NULL DEFAULT '',
		cloud_init TEXT NOT NULL DEFAULT '',
		created_at INTEGER NOT NULL,
		UNIQUE (distro, version)
	);
	CREATE TABLE machines (
		uuid TEXT PRIMARY KEY,
		node_id TEXT NOT NULL UNIQUE REFERENCES nodes (id) ON DELETE CASCADE,
		public_key TEXT NOT NULL,
		credential_id TEXT NOT NULL,
		created_at INTEGER NOT NULL
	);`

const credentialColumns = `id, name, secret_hash, role, labels, uses, uses_left, expires_at, created_at, revoked_at`

func scanCredential(r scanner) (OnboardingCredential, error) {
	var c OnboardingCredential
	var labels string
	var exp, created, revoked int64
	if err := r.Scan(&c.ID, &c.Name, &c.SecretHash, &c.Role, &labels, &c.Uses, &c.UsesLeft, &exp, &created,
		&revoked); err != nil {
		return OnboardingCredential{}, err
	}
	var err error
	if c.Labels, err = decodeLabels(labels); err != nil {
		return OnboardingCredential{}, fmt.Errorf("store: onboarding credential %s: %w", c.ID, err)
	}
	c.ExpiresAt, c.CreatedAt, c.RevokedAt = fromUnix(exp), fromUnix(created), fromUnix(revoked)
	return c, nil
}

// CreateOnboardingCredential implements OnboardingStore.
func (s *DB) CreateOnboardingCredential(ctx context.Context, c OnboardingCredential) error {
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO onboarding_credentials (`+credentialColumns+`) VALUES (?,?,?,?,?,?,?,?,?,?)`,
		c.ID, c.Name, c.SecretHash, c.Role, encodeLabels(c.Labels), c.Uses, c.UsesLeft, unix(c.ExpiresAt), unix(c.CreatedAt),
		unix(c.RevokedAt))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: onboarding credential %q: %w", c.Name, ErrNameTaken)
	}
	if err != nil {
		return fmt.Errorf("store: create onboarding credential %q: %w", c.Name, err)
	}
	return nil
}

// ListOnboardingCredentials implements OnboardingStore.
func (s *DB) ListOnboardingCredentials(ctx context.Context) ([]OnboardingCredential, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+credentialColumns+` FROM onboarding_credentials ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list onboarding credentials: %w", err)
	}
	defer rows.Close()
	out := []OnboardingCredential{}
	for rows.Next() {
		c, err := scanCredential(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, c)
	}
	return out, rows.Err()
}

// GetOnboardingCredential implements OnboardingStore.
func (s *DB) GetOnboardingCredential(ctx context.Context, id string) (OnboardingCredential, error) {
	return getCredential(ctx, s.db, "id", id, "")
}

type queryRower interface {
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

func getCredential(ctx context.Context, q queryRower, where, arg, lock string) (OnboardingCredential, error) {
	c, err := scanCredential(q.QueryRowContext(ctx,
		`SELECT `+credentialColumns+` FROM onboarding_credentials WHERE `+where+` = ?`+lock, arg))
	if errors.Is(err, sql.ErrNoRows) {
		return OnboardingCredential{}, fmt.Errorf("store: onboarding credential %q: %w", arg, ErrNotFound)
	}
	if err != nil {
		return OnboardingCredential{}, fmt.Errorf("store: onboarding credential %q: %w", arg, err)
	}
	return c, nil
}

// RevokeOnboardingCredential implements OnboardingStore. Revoking twice keeps the
// first time.
func (s *DB) RevokeOnboardingCredential(ctx context.Context, name string, at time.Time) (OnboardingCredential, error) {
	res, err := s.db.ExecContext(ctx,
		`UPDATE onboarding_credentials SET revoked_at = CASE WHEN revoked_at = 0 THEN ? ELSE revoked_at END `+
			`WHERE name = ?`, unix(at), name)
	if err != nil {
		return OnboardingCredential{}, fmt.Errorf("store: revoke onboarding credential %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return OnboardingCredential{}, fmt.Errorf("store: onboarding credential %q: %w", name, ErrNotFound)
	}
	return getCredential(ctx, s.db, "name", name, "")
}

// AddOSProfile implements OnboardingStore.
func (s *DB) AddOSProfile(ctx context.Context, p OSProfile) error {
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO os_profiles (name, distro, version, family, cloud_init, created_at) VALUES (?,?,?,?,?,?)`,
		p.Name, p.Distro, p.Version, p.Family, p.CloudInit, unix(p.CreatedAt))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: OS profile %q (%s %s): %w", p.Name, p.Distro, p.Version, ErrNameTaken)
	}
	if err != nil {
		return fmt.Errorf("store: add OS profile %q: %w", p.Name, err)
	}
	return nil
}

// ListOSProfiles implements OnboardingStore.
func (s *DB) ListOSProfiles(ctx context.Context) ([]OSProfile, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT name, distro, version, family, cloud_init, created_at FROM os_profiles ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list OS profiles: %w", err)
	}
	defer rows.Close()
	out := []OSProfile{}
	for rows.Next() {
		var p OSProfile
		var created int64
		if err := rows.Scan(&p.Name, &p.Distro, &p.Version, &p.Family, &p.CloudInit, &created); err != nil {
			return nil, fmt.Errorf("store: list OS profiles: %w", err)
		}
		p.CreatedAt = fromUnix(created)
		out = append(out, p)
	}
	return out, rows.Err()
}

// DeleteOSProfile implements OnboardingStore.
func (s *DB) DeleteOSProfile(ctx context.Context, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM os_profiles WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("store: delete OS profile %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: OS profile %q: %w", name, ErrNotFound)
	}
	return nil
}

// GetMachine implements OnboardingStore.
func (s *DB) GetMachine(ctx context.Context, uuid string) (Machine, error) {
	return getMachine(ctx, s.db, uuid)
}

func getMachine(ctx context.Context, q queryRower, uuid string) (Machine, error) {
	var m Machine
	var created int64
	err := q.QueryRowContext(ctx,
		`SELECT uuid, node_id, public_key, credential_id, created_at FROM machines WHERE uuid = ?`, uuid).
		Scan(&m.UUID, &m.NodeID, &m.PublicKey, &m.CredentialID, &created)
	if errors.Is(err, sql.ErrNoRows) {
		return Machine{}, fmt.Errorf("store: machine %q: %w", uuid, ErrNotFound)
	}
	if err != nil {
		return Machine{}, fmt.Errorf("store: machine %q: %w", uuid, err)
	}
	m.CreatedAt = fromUnix(created)
	return m, nil
}

// Onboard implements OnboardingStore.
func (s *DB) Onboard(
	ctx context.Context, credID string, check func(OnboardingCredential) error, m Machine, n Node,
) (Node, bool, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Node{}, false, fmt.Errorf("store: onboard: %w", err)
	}
	defer tx.Rollback()
	switch prev, err := getMachine(ctx, tx, m.UUID); {
	case err == nil:
		if prev.PublicKey != m.PublicKey {
			return Node{}, false, fmt.Errorf("%w: machine %s is node id %s since %s", ErrMachineKeyMismatch, m.UUID, prev.NodeID,
				prev.CreatedAt.UTC().Format(time.RFC3339))
		}
		node, err := scanNode(tx.QueryRowContext(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE id = ?`, prev.NodeID))
		if err != nil {
			return Node{}, false, fmt.Errorf("store: onboard: read node %s: %w", prev.NodeID, err)
		}
		return node, true, nil
	case !errors.Is(err, ErrNotFound):
		return Node{}, false, fmt.Errorf("store: onboard: %w", err)
	}
	// Locked until commit (PostgreSQL), as a join token's row.
	c, err := getCredential(ctx, tx, "id", credID, s.d.forUpdate)
	if errors.Is(err, ErrNotFound) {
		return Node{}, false, ErrCredentialUnknown
	}
	if err != nil {
		return Node{}, false, fmt.Errorf("store: onboard: %w", err)
	}
	if err := check(c); err != nil {
		return Node{}, false, err
	}
	now := time.Now()
	if err := c.Usable(now); err != nil {
		return Node{}, false, err
	}
	if _, err := tx.ExecContext(ctx, `UPDATE onboarding_credentials SET uses_left = uses_left - 1 WHERE id = ?`,
		credID); err != nil {
		return Node{}, false, fmt.Errorf("store: onboard: consume credential: %w", err)
	}
	labels := map[string]string{}
	maps.Copy(labels, n.Labels)
	maps.Copy(labels, c.Labels) // the credential's labels win
	n.Labels = labels
	if n.CreatedAt.IsZero() {
		n.CreatedAt = now
	}
	if err := insertNode(ctx, tx, n); err != nil {
		return Node{}, false, err
	}
	m.NodeID, m.CredentialID = n.ID, credID
	if m.CreatedAt.IsZero() {
		m.CreatedAt = now
	}
	if _, err := tx.ExecContext(ctx,
		`INSERT INTO machines (uuid, node_id, public_key, credential_id, created_at) VALUES (?,?,?,?,?)`,
		m.UUID, m.NodeID, m.PublicKey, m.CredentialID, unix(m.CreatedAt)); err != nil {
		return Node{}, false, fmt.Errorf("store: onboard: bind machine %s: %w", m.UUID, err)
	}
	if err := tx.Commit(); err != nil {
		return Node{}, false, fmt.Errorf("store: onboard: commit: %w", err)
	}
	return n, false, nil
}
