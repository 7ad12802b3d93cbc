package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"time"
)

// Operator is a person (or tool) allowed to jump through the bastion.
type Operator struct {
	Name        string    `json:"name"`
	PublicKey   string    `json:"public_key"` // authorized_keys format, one key
	Fingerprint string    `json:"fingerprint"`
	Roles       []string  `json:"roles"`
	CreatedAt   time.Time `json:"created_at"`
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
