package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver (pure Go, no cgo)
)

// SQLite is the default Store: one database file, WAL journal with
// synchronous=FULL so a committed write survives kill -9 and power loss.
type SQLite struct {
	db *sql.DB
}

var _ Store = (*SQLite)(nil)

const schemaVersion = 5

var migrations = []string{
	// v1
	`CREATE TABLE nodes (
		id TEXT PRIMARY KEY,
		name TEXT NOT NULL UNIQUE,
		labels TEXT NOT NULL DEFAULT '{}',
		hostname TEXT NOT NULL DEFAULT '',
		os TEXT NOT NULL DEFAULT '',
		arch TEXT NOT NULL DEFAULT '',
		machine_id TEXT NOT NULL DEFAULT '',
		agent_version TEXT NOT NULL DEFAULT '',
		transport TEXT NOT NULL DEFAULT '',
		online INTEGER NOT NULL DEFAULT 0,
		last_seen INTEGER NOT NULL DEFAULT 0,
		created_at INTEGER NOT NULL,
		cert_serial TEXT NOT NULL DEFAULT '',
		cert_expires INTEGER NOT NULL DEFAULT 0
	);
	CREATE TABLE tokens (
		id TEXT PRIMARY KEY,
		secret_hash BLOB NOT NULL,
		labels TEXT NOT NULL DEFAULT '{}',
		uses_left INTEGER NOT NULL,
		expires_at INTEGER NOT NULL,
		created_at INTEGER NOT NULL
	);
	CREATE TABLE operators (
		name TEXT PRIMARY KEY,
		public_key TEXT NOT NULL,
		fingerprint TEXT NOT NULL UNIQUE,
		created_at INTEGER NOT NULL
	);`,
	// v2: roles, operators' roles, node revocation, audit log.
	`CREATE TABLE roles (
		name TEXT PRIMARY KEY,
		nodes TEXT NOT NULL,
		logins TEXT NOT NULL
	);
	INSERT INTO roles (name, nodes, logins) VALUES ('all', '*', '["*"]');
	ALTER TABLE operators ADD COLUMN roles TEXT NOT NULL DEFAULT '["all"]';
	ALTER TABLE nodes ADD COLUMN revoked_at INTEGER NOT NULL DEFAULT 0;
	CREATE TABLE audit (
		id INTEGER PRIMARY KEY AUTOINCREMENT,
		at INTEGER NOT NULL,
		kind TEXT NOT NULL,
		operator TEXT NOT NULL DEFAULT '',
		node TEXT NOT NULL DEFAULT '',
		key_fingerprint TEXT NOT NULL DEFAULT '',
		remote TEXT NOT NULL DEFAULT '',
		result TEXT NOT NULL DEFAULT '',
		detail TEXT NOT NULL DEFAULT '',
		ended_at INTEGER NOT NULL DEFAULT 0,
		bytes_to_node INTEGER NOT NULL DEFAULT 0,
		bytes_from_node INTEGER NOT NULL DEFAULT 0
	);
	CREATE INDEX audit_at ON audit (at);
	-- The audit log is append-only: the database refuses edits and deletes.
	CREATE TRIGGER audit_no_update BEFORE UPDATE ON audit BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;
	CREATE TRIGGER audit_no_delete BEFORE DELETE ON audit BEGIN SELECT RAISE(ABORT, 'audit log is append-only'); END;`,
	// v3: keys of removed operators, published to managed sshd as RevokedKeys.
	`CREATE TABLE revoked_keys (
		fingerprint TEXT PRIMARY KEY,
		public_key TEXT NOT NULL,
		revoked_at INTEGER NOT NULL
	);`,
	// v4: jobs and per-node results, cluster memberships, API tokens.
	migrationV4,
	// v5: settings, the built-in role "admin" (admin.go).
	migrationAdmin,
}

// OpenSQLite opens (creating if needed) the database at path and migrates it.
func OpenSQLite(ctx context.Context, path string) (*SQLite, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	q := url.Values{}
	for _, p := range []string{"journal_mode(WAL)", "synchronous(FULL)", "busy_timeout(10000)", "foreign_keys(1)"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	// SQLite decodes %XX in URI file names; escape what a path may hold
	// that a URI would read as syntax.
	uriPath := strings.NewReplacer("%", "%25", "#", "%23", "?", "%3f").Replace(path)
	db, err := sql.Open("sqlite", "file:"+uriPath+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	// One writer at a time is what SQLite does anyway; a single connection
	// keeps transactions simple and avoids SQLITE_BUSY between our own conns.
	db.SetMaxOpenConns(1)
	s := &SQLite{db: db}
	if err := s.migrate(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: %s: %w", path, err)
	}
	if err := os.Chmod(path, 0o600); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	return s, nil
}

func (s *SQLite) migrate(ctx context.Context) error {
	var v int
	if err := s.db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > schemaVersion {
		return fmt.Errorf("database schema v%d is newer than this hub understands (v%d); upgrade the hub", v, schemaVersion)
	}
	for ; v < schemaVersion; v++ {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate to v%d: %w", v+1, err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v+1)); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
	}
	return nil
}

// Close closes the database.
func (s *SQLite) Close() error { return s.db.Close() }

func unix(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromUnix(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

func encodeLabels(l map[string]string) string {
	if l == nil {
		l = map[string]string{}
	}
	b, _ := json.Marshal(l)
	return string(b)
}

func decodeLabels(s string) (map[string]string, error) {
	l := map[string]string{}
	if err := json.Unmarshal([]byte(s), &l); err != nil {
		return nil, fmt.Errorf("decode labels: %w", err)
	}
	return l, nil
}

func isUniqueViolation(err error) bool {
	return err != nil && strings.Contains(err.Error(), "UNIQUE constraint failed")
}

// CreateToken implements Store.
func (s *SQLite) CreateToken(ctx context.Context, t Token) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO tokens (id, secret_hash, labels, uses_left, expires_at, created_at) VALUES (?,?,?,?,?,?)`,
		t.ID, t.SecretHash, encodeLabels(t.Labels), t.UsesLeft, unix(t.ExpiresAt), unix(t.CreatedAt))
	if err != nil {
		return fmt.Errorf("store: create token %s: %w", t.ID, err)
	}
	return nil
}

// ListTokens implements Store.
func (s *SQLite) ListTokens(ctx context.Context) ([]Token, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, secret_hash, labels, uses_left, expires_at, created_at FROM tokens ORDER BY created_at`)
	if err != nil {
		return nil, fmt.Errorf("store: list tokens: %w", err)
	}
	defer rows.Close()
	var out []Token
	for rows.Next() {
		t, err := scanToken(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

type scanner interface{ Scan(...any) error }

func scanToken(r scanner) (Token, error) {
	var t Token
	var labels string
	var exp, created int64
	if err := r.Scan(&t.ID, &t.SecretHash, &labels, &t.UsesLeft, &exp, &created); err != nil {
		return Token{}, err
	}
	var err error
	if t.Labels, err = decodeLabels(labels); err != nil {
		return Token{}, fmt.Errorf("store: token %s: %w", t.ID, err)
	}
	t.ExpiresAt, t.CreatedAt = fromUnix(exp), fromUnix(created)
	return t, nil
}

// DeleteToken implements Store.
func (s *SQLite) DeleteToken(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM tokens WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("store: delete token %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: token %s: %w", id, ErrNotFound)
	}
	return nil
}

// Join implements Store.
func (s *SQLite) Join(ctx context.Context, tokenID string, check func(Token) error, n Node) (Node, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Node{}, fmt.Errorf("store: join: %w", err)
	}
	defer tx.Rollback()
	t, err := scanToken(tx.QueryRowContext(ctx, `SELECT id, secret_hash, labels, uses_left, expires_at, created_at FROM tokens WHERE id = ?`, tokenID))
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
	if err := tx.Commit(); err != nil {
		return Node{}, fmt.Errorf("store: join: commit: %w", err)
	}
	return n, nil
}

func insertNode(ctx context.Context, tx *sql.Tx, n Node) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO nodes (id, name, labels, hostname, os, arch, machine_id, agent_version, transport, online, last_seen, created_at, cert_serial, cert_expires)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		n.ID, n.Name, encodeLabels(n.Labels), n.Hostname, n.OS, n.Arch, n.MachineID, n.AgentVersion, n.Transport, n.Online,
		unix(n.LastSeen), unix(n.CreatedAt), n.CertSerial, unix(n.CertExpires))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: node %q: %w", n.Name, ErrNameTaken)
	}
	if err != nil {
		return fmt.Errorf("store: insert node %q: %w", n.Name, err)
	}
	return nil
}

const nodeColumns = `id, name, labels, hostname, os, arch, machine_id, agent_version, transport, online, last_seen, created_at, cert_serial, cert_expires, revoked_at`

func scanNode(r scanner) (Node, error) {
	var n Node
	var labels string
	var lastSeen, created, certExp, revoked int64
	if err := r.Scan(&n.ID, &n.Name, &labels, &n.Hostname, &n.OS, &n.Arch, &n.MachineID, &n.AgentVersion, &n.Transport,
		&n.Online, &lastSeen, &created, &n.CertSerial, &certExp, &revoked); err != nil {
		return Node{}, err
	}
	var err error
	if n.Labels, err = decodeLabels(labels); err != nil {
		return Node{}, fmt.Errorf("store: node %s: %w", n.ID, err)
	}
	n.LastSeen, n.CreatedAt, n.CertExpires, n.RevokedAt = fromUnix(lastSeen), fromUnix(created), fromUnix(certExp), fromUnix(revoked)
	return n, nil
}

func (s *SQLite) getNode(ctx context.Context, where, arg string) (Node, error) {
	n, err := scanNode(s.db.QueryRowContext(ctx, `SELECT `+nodeColumns+` FROM nodes WHERE `+where+` = ?`, arg))
	if errors.Is(err, sql.ErrNoRows) {
		return Node{}, fmt.Errorf("store: node %q: %w", arg, ErrNotFound)
	}
	if err != nil {
		return Node{}, fmt.Errorf("store: node %q: %w", arg, err)
	}
	return n, nil
}

// GetNode implements Store.
func (s *SQLite) GetNode(ctx context.Context, id string) (Node, error) {
	return s.getNode(ctx, "id", id)
}

// GetNodeByName implements Store.
func (s *SQLite) GetNodeByName(ctx context.Context, name string) (Node, error) {
	return s.getNode(ctx, "name", name)
}

// ListNodes implements Store.
func (s *SQLite) ListNodes(ctx context.Context) ([]Node, error) {
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

// UpdateNodeSeen implements Store.
func (s *SQLite) UpdateNodeSeen(ctx context.Context, id string, st Seen) error {
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET online = ?, transport = CASE WHEN ? = '' THEN transport ELSE ? END,
		agent_version = CASE WHEN ? = '' THEN agent_version ELSE ? END, last_seen = ? WHERE id = ?`,
		st.Online, st.Transport, st.Transport, st.AgentVersion, st.AgentVersion, unix(st.At), id)
	if err != nil {
		return fmt.Errorf("store: update node %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: node %s: %w", id, ErrNotFound)
	}
	return nil
}

// MarkAllOffline implements Store.
func (s *SQLite) MarkAllOffline(ctx context.Context) error {
	if _, err := s.db.ExecContext(ctx, `UPDATE nodes SET online = 0 WHERE online != 0`); err != nil {
		return fmt.Errorf("store: mark nodes offline: %w", err)
	}
	return nil
}

// DeleteNode implements Store.
func (s *SQLite) DeleteNode(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM nodes WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("store: delete node %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: node %s: %w", id, ErrNotFound)
	}
	return nil
}

// AddOperator implements Store.
func (s *SQLite) AddOperator(ctx context.Context, o Operator) error {
	roles, _ := json.Marshal(o.Roles)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: add operator %q: %w", o.Name, err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `INSERT INTO operators (name, public_key, fingerprint, created_at, roles) VALUES (?,?,?,?,?)`,
		o.Name, o.PublicKey, o.Fingerprint, unix(o.CreatedAt), string(roles))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: operator %q or key %s: %w", o.Name, o.Fingerprint, ErrNameTaken)
	}
	if err != nil {
		return fmt.Errorf("store: add operator %q: %w", o.Name, err)
	}
	// Registering a key again is an explicit decision to trust it again;
	// only once the operator really exists.
	if _, err := tx.ExecContext(ctx, `DELETE FROM revoked_keys WHERE fingerprint = ?`, o.Fingerprint); err != nil {
		return fmt.Errorf("store: add operator %q: %w", o.Name, err)
	}
	return tx.Commit()
}

// ListOperators implements Store.
func (s *SQLite) ListOperators(ctx context.Context) ([]Operator, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, public_key, fingerprint, created_at, roles FROM operators ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list operators: %w", err)
	}
	defer rows.Close()
	out := []Operator{}
	for rows.Next() {
		var o Operator
		var created int64
		var roles string
		if err := rows.Scan(&o.Name, &o.PublicKey, &o.Fingerprint, &created, &roles); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(roles), &o.Roles); err != nil {
			return nil, fmt.Errorf("store: operator %q roles: %w", o.Name, err)
		}
		o.CreatedAt = fromUnix(created)
		out = append(out, o)
	}
	return out, rows.Err()
}

// RemoveOperator implements Store: the operator's key moves to the revoked
// keys in the same transaction.
func (s *SQLite) RemoveOperator(ctx context.Context, name string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: remove operator %q: %w", name, err)
	}
	defer tx.Rollback()
	var key, fp string
	err = tx.QueryRowContext(ctx, `SELECT public_key, fingerprint FROM operators WHERE name = ?`, name).Scan(&key, &fp)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: operator %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("store: remove operator %q: %w", name, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM operators WHERE name = ?`, name); err != nil {
		return fmt.Errorf("store: remove operator %q: %w", name, err)
	}
	if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO revoked_keys (fingerprint, public_key, revoked_at) VALUES (?,?,?)`,
		fp, key, unix(time.Now())); err != nil {
		return fmt.Errorf("store: revoke key of operator %q: %w", name, err)
	}
	return tx.Commit()
}

// ListRevokedKeys implements Store.
func (s *SQLite) ListRevokedKeys(ctx context.Context) ([]string, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT public_key FROM revoked_keys ORDER BY fingerprint`)
	if err != nil {
		return nil, fmt.Errorf("store: list revoked keys: %w", err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var k string
		if err := rows.Scan(&k); err != nil {
			return nil, err
		}
		out = append(out, k)
	}
	return out, rows.Err()
}

// RevokeNode implements Store.
func (s *SQLite) RevokeNode(ctx context.Context, id string, at time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET revoked_at = ?, online = 0 WHERE id = ? AND revoked_at = 0`, unix(at), id)
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

// PutRole implements Store.
func (s *SQLite) PutRole(ctx context.Context, r Role) error {
	logins, _ := json.Marshal(r.Logins)
	if _, err := s.db.ExecContext(ctx, `INSERT INTO roles (name, nodes, logins) VALUES (?,?,?)
		ON CONFLICT (name) DO UPDATE SET nodes = excluded.nodes, logins = excluded.logins`, r.Name, r.Nodes, string(logins)); err != nil {
		return fmt.Errorf("store: put role %q: %w", r.Name, err)
	}
	return nil
}

// ListRoles implements Store.
func (s *SQLite) ListRoles(ctx context.Context) ([]Role, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT name, nodes, logins FROM roles ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list roles: %w", err)
	}
	defer rows.Close()
	out := []Role{}
	for rows.Next() {
		var r Role
		var logins string
		if err := rows.Scan(&r.Name, &r.Nodes, &logins); err != nil {
			return nil, err
		}
		if err := json.Unmarshal([]byte(logins), &r.Logins); err != nil {
			return nil, fmt.Errorf("store: role %q logins: %w", r.Name, err)
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// DeleteRole implements Store.
func (s *SQLite) DeleteRole(ctx context.Context, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM roles WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("store: delete role %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: role %q: %w", name, ErrNotFound)
	}
	return nil
}

// AppendAudit implements Store.
func (s *SQLite) AppendAudit(ctx context.Context, e AuditEvent) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO audit (at, kind, operator, node, key_fingerprint, remote, result, detail, ended_at, bytes_to_node, bytes_from_node)
		VALUES (?,?,?,?,?,?,?,?,?,?,?)`, unix(e.At), e.Kind, e.Operator, e.Node, e.KeyFingerprint, e.Remote, e.Result, e.Detail,
		unix(e.EndedAt), e.BytesToNode, e.BytesFromNode); err != nil {
		return fmt.Errorf("store: append audit event %s: %w", e.Kind, err)
	}
	return nil
}

// ListAudit implements Store.
func (s *SQLite) ListAudit(ctx context.Context, f AuditFilter) ([]AuditEvent, error) {
	q := `SELECT id, at, kind, operator, node, key_fingerprint, remote, result, detail, ended_at, bytes_to_node, bytes_from_node FROM audit WHERE 1=1`
	var args []any
	if f.Node != "" {
		q += ` AND node = ?`
		args = append(args, f.Node)
	}
	if f.Operator != "" {
		q += ` AND operator = ?`
		args = append(args, f.Operator)
	}
	if !f.Since.IsZero() {
		q += ` AND at >= ?`
		args = append(args, unix(f.Since))
	}
	limit := f.Limit
	if limit <= 0 || limit > 10000 {
		limit = 1000
	}
	// The newest `limit` events, returned oldest first.
	q = `SELECT * FROM (` + q + ` ORDER BY id DESC LIMIT ?) ORDER BY id`
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

// UpdateNodeCert implements Store.
func (s *SQLite) UpdateNodeCert(ctx context.Context, id, serial string, expires time.Time) error {
	res, err := s.db.ExecContext(ctx, `UPDATE nodes SET cert_serial = ?, cert_expires = ? WHERE id = ?`, serial, unix(expires), id)
	if err != nil {
		return fmt.Errorf("store: update node %s certificate: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: node %s: %w", id, ErrNotFound)
	}
	return nil
}
