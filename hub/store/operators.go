package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// ErrLastKey is returned when removing an operator's only key: an operator
// without a key could never log in, so remove the operator instead.
var ErrLastKey = errors.New("operator's only key")

// Operator is a person (or tool) allowed to jump through the bastion.
type Operator struct {
	Name string `json:"name"`
	// PublicKey and Fingerprint are the operator's first key (Keys[0]),
	// kept for readers that know one key per operator. AddOperator uses
	// them when Keys is empty.
	PublicKey   string        `json:"public_key"` // authorized_keys format, one key
	Fingerprint string        `json:"fingerprint"`
	Keys        []OperatorKey `json:"keys"` // oldest first; at least one
	Roles       []string      `json:"roles"`
	CreatedAt   time.Time     `json:"created_at"`
}

// OperatorKey is one of an operator's SSH public keys.
type OperatorKey struct {
	PublicKey   string    `json:"public_key"` // authorized_keys format
	Fingerprint string    `json:"fingerprint"`
	AddedAt     time.Time `json:"added_at"`
}

// OperatorStore persists operators, their SSH keys and roles, and the keys
// revoked from them.
type OperatorStore interface {
	AddOperator(ctx context.Context, o Operator) error
	ListOperators(ctx context.Context) ([]Operator, error)
	// RemoveOperator deletes the operator and adds its keys to the revoked keys.
	RemoveOperator(ctx context.Context, name string) error
	// AddOperatorKey registers one more key for operator name (ErrNotFound
	// if there is none; ErrNameTaken if any operator holds the key).
	AddOperatorKey(ctx context.Context, name string, k OperatorKey) error
	// RemoveOperatorKey deletes one of the operator's keys and adds it to
	// the revoked keys; the operator's only key is refused (ErrLastKey).
	RemoveOperatorKey(ctx context.Context, name, fingerprint string) error
	// SetOperatorRoles replaces the operator's roles.
	SetOperatorRoles(ctx context.Context, name string, roles []string) error
	// ListRevokedKeys returns revoked operator keys (authorized_keys format).
	ListRevokedKeys(ctx context.Context) ([]string, error)
}

// AddOperator implements OperatorStore.
func (s *DB) AddOperator(ctx context.Context, o Operator) error {
	keys := o.Keys
	if len(keys) == 0 {
		keys = []OperatorKey{{PublicKey: o.PublicKey, Fingerprint: o.Fingerprint, AddedAt: o.CreatedAt}}
	}
	roles, _ := json.Marshal(o.Roles)
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: add operator %q: %w", o.Name, err)
	}
	defer tx.Rollback()
	_, err = tx.ExecContext(ctx, `INSERT INTO operators (name, created_at, roles) VALUES (?,?,?)`, o.Name,
		unix(o.CreatedAt), string(roles))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: operator %q: %w", o.Name, ErrNameTaken)
	}
	if err != nil {
		return fmt.Errorf("store: add operator %q: %w", o.Name, err)
	}
	for _, k := range keys {
		if k.AddedAt.IsZero() {
			k.AddedAt = o.CreatedAt
		}
		if err := addKeyTx(ctx, tx, o.Name, k); err != nil {
			return err
		}
	}
	return tx.Commit()
}

// AddOperatorKey implements OperatorStore.
func (s *DB) AddOperatorKey(ctx context.Context, name string, k OperatorKey) error {
	return s.inOperatorTx(ctx, name, "add key to", func(tx *sql.Tx) error { return addKeyTx(ctx, tx, name, k) })
}

// inOperatorTx runs fn in one transaction if operator name exists
// (ErrNotFound otherwise); what names the change in errors.
func (s *DB) inOperatorTx(ctx context.Context, name, what string, fn func(*sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("store: %s operator %q: %w", what, name, err)
	}
	defer tx.Rollback()
	if err := operatorExistsTx(ctx, tx, name, s.d.forUpdate); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}

// addKeyTx registers k for operator name. Registering a key again is an
// explicit decision to trust it again, so it leaves the revoked keys.
func addKeyTx(ctx context.Context, tx *sql.Tx, name string, k OperatorKey) error {
	_, err := tx.ExecContext(ctx,
		`INSERT INTO operator_keys (fingerprint, operator, public_key, added_at) VALUES (?,?,?,?)`,
		k.Fingerprint, name, k.PublicKey, unix(k.AddedAt))
	if isUniqueViolation(err) {
		return fmt.Errorf("store: key %s: %w", k.Fingerprint, ErrNameTaken)
	}
	if err != nil {
		return fmt.Errorf("store: add key %s to operator %q: %w", k.Fingerprint, name, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM revoked_keys WHERE fingerprint = ?`, k.Fingerprint); err != nil {
		return fmt.Errorf("store: add key %s to operator %q: %w", k.Fingerprint, name, err)
	}
	return nil
}

func operatorExistsTx(ctx context.Context, tx *sql.Tx, name, lock string) error {
	var n string
	// FOR UPDATE (PostgreSQL): changes to one operator's keys take turns,
	// so two replicas cannot each remove one of the last two keys.
	err := tx.QueryRowContext(ctx, `SELECT name FROM operators WHERE name = ?`+lock, name).Scan(&n)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: operator %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("store: look up operator %q: %w", name, err)
	}
	return nil
}

// RemoveOperatorKey implements OperatorStore: the key moves to the revoked keys in
// the same transaction. An operator's only key is refused (ErrLastKey).
func (s *DB) RemoveOperatorKey(ctx context.Context, name, fingerprint string) error {
	return s.inOperatorTx(ctx, name, "remove key of",
		func(tx *sql.Tx) error { return removeKeyTx(ctx, tx, name, fingerprint) })
}

func removeKeyTx(ctx context.Context, tx *sql.Tx, name, fingerprint string) error {
	var key string
	err := tx.QueryRowContext(ctx, `SELECT public_key FROM operator_keys WHERE operator = ? AND fingerprint = ?`, name,
		fingerprint).Scan(&key)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("store: operator %q has no key %s: %w", name, fingerprint, ErrNotFound)
	}
	if err != nil {
		return fmt.Errorf("store: remove key of operator %q: %w", name, err)
	}
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM operator_keys WHERE operator = ?`, name).Scan(&n); err != nil {
		return fmt.Errorf("store: remove key of operator %q: %w", name, err)
	}
	if n <= 1 {
		return fmt.Errorf("store: key %s of operator %q: %w", fingerprint, name, ErrLastKey)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM operator_keys WHERE fingerprint = ?`, fingerprint); err != nil {
		return fmt.Errorf("store: remove key of operator %q: %w", name, err)
	}
	if err := revokeKeyTx(ctx, tx, fingerprint, key); err != nil {
		return fmt.Errorf("store: revoke key %s of operator %q: %w", fingerprint, name, err)
	}
	return nil
}

func revokeKeyTx(ctx context.Context, tx *sql.Tx, fingerprint, key string) error {
	_, err := tx.ExecContext(ctx, `INSERT INTO revoked_keys (fingerprint, public_key, revoked_at) VALUES (?,?,?)
		ON CONFLICT (fingerprint) DO UPDATE SET public_key = excluded.public_key, revoked_at = excluded.revoked_at`,
		fingerprint, key, unix(time.Now()))
	return err
}

// SetOperatorRoles implements OperatorStore: the operator's roles are replaced.
func (s *DB) SetOperatorRoles(ctx context.Context, name string, roles []string) error {
	b, _ := json.Marshal(roles)
	res, err := s.db.ExecContext(ctx, `UPDATE operators SET roles = ? WHERE name = ?`, string(b), name)
	if err != nil {
		return fmt.Errorf("store: set roles of operator %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: operator %q: %w", name, ErrNotFound)
	}
	return nil
}

// ListOperators implements OperatorStore.
func (s *DB) ListOperators(ctx context.Context) ([]Operator, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT o.name, o.created_at, o.roles, k.public_key, k.fingerprint, k.added_at
		FROM operators o JOIN operator_keys k ON k.operator = o.name ORDER BY o.name, k.added_at, k.fingerprint`)
	if err != nil {
		return nil, fmt.Errorf("store: list operators: %w", err)
	}
	defer rows.Close()
	out := []Operator{}
	for rows.Next() {
		var (
			name, roles    string
			created, added int64
			k              OperatorKey
		)
		if err := rows.Scan(&name, &created, &roles, &k.PublicKey, &k.Fingerprint, &added); err != nil {
			return nil, fmt.Errorf("store: list operators: %w", err)
		}
		k.AddedAt = fromUnix(added)
		if len(out) > 0 && out[len(out)-1].Name == name {
			o := &out[len(out)-1]
			o.Keys = append(o.Keys, k)
			continue
		}
		o := Operator{
			Name:        name,
			CreatedAt:   fromUnix(created),
			PublicKey:   k.PublicKey,
			Fingerprint: k.Fingerprint,
			Keys:        []OperatorKey{k},
		}
		if err := json.Unmarshal([]byte(roles), &o.Roles); err != nil {
			return nil, fmt.Errorf("store: operator %q roles: %w", name, err)
		}
		out = append(out, o)
	}
	return out, rows.Err()
}

// RemoveOperator implements OperatorStore: the operator's keys move to the revoked
// keys in the same transaction.
func (s *DB) RemoveOperator(ctx context.Context, name string) error {
	return s.inOperatorTx(ctx, name, "remove", func(tx *sql.Tx) error { return removeOperatorTx(ctx, tx, name) })
}

func removeOperatorTx(ctx context.Context, tx *sql.Tx, name string) error {
	rows, err := tx.QueryContext(ctx, `SELECT fingerprint, public_key FROM operator_keys WHERE operator = ?`, name)
	if err != nil {
		return fmt.Errorf("store: remove operator %q: %w", name, err)
	}
	var keys [][2]string
	for rows.Next() {
		var fp, key string
		if err := rows.Scan(&fp, &key); err != nil {
			rows.Close()
			return fmt.Errorf("store: remove operator %q: %w", name, err)
		}
		keys = append(keys, [2]string{fp, key})
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return fmt.Errorf("store: remove operator %q: %w", name, err)
	}
	// The keys go with the operator (ON DELETE CASCADE).
	if _, err := tx.ExecContext(ctx, `DELETE FROM operators WHERE name = ?`, name); err != nil {
		return fmt.Errorf("store: remove operator %q: %w", name, err)
	}
	for _, k := range keys {
		if err := revokeKeyTx(ctx, tx, k[0], k[1]); err != nil {
			return fmt.Errorf("store: revoke key of operator %q: %w", name, err)
		}
	}
	return nil
}

// ListRevokedKeys implements OperatorStore.
func (s *DB) ListRevokedKeys(ctx context.Context) ([]string, error) {
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
