package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// APIToken is a bearer token for automation; only the secret's hash is kept.
type APIToken struct {
	ID          string    `json:"id"`
	SecretHash  []byte    `json:"-"`
	Role        string    `json:"role"`
	Description string    `json:"description,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	ExpiresAt   time.Time `json:"expires_at,omitzero"`
}

// APITokenStore persists API tokens.
type APITokenStore interface {
	CreateAPIToken(ctx context.Context, t APIToken) error
	GetAPIToken(ctx context.Context, id string) (APIToken, error)
	ListAPITokens(ctx context.Context) ([]APIToken, error)
	DeleteAPIToken(ctx context.Context, id string) error
}

// CreateAPIToken implements APITokenStore.
func (s *DB) CreateAPIToken(ctx context.Context, t APIToken) error {
	if _, err := s.db.ExecContext(ctx,
		`INSERT INTO api_tokens (id, secret_hash, role, description, created_at, expires_at) VALUES (?,?,?,?,?,?)`,
		t.ID, t.SecretHash, t.Role, t.Description, unix(t.CreatedAt), unix(t.ExpiresAt)); err != nil {
		return fmt.Errorf("store: create API token %s: %w", t.ID, err)
	}
	return nil
}

const apiTokenColumns = `id, secret_hash, role, description, created_at, expires_at`

func scanAPIToken(r scanner) (APIToken, error) {
	var t APIToken
	var created, expires int64
	if err := r.Scan(&t.ID, &t.SecretHash, &t.Role, &t.Description, &created, &expires); err != nil {
		return APIToken{}, err
	}
	t.CreatedAt, t.ExpiresAt = fromUnix(created), fromUnix(expires)
	return t, nil
}

// GetAPIToken implements APITokenStore.
func (s *DB) GetAPIToken(ctx context.Context, id string) (APIToken, error) {
	t, err := scanAPIToken(s.db.QueryRowContext(ctx, `SELECT `+apiTokenColumns+` FROM api_tokens WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return APIToken{}, fmt.Errorf("store: API token %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return APIToken{}, fmt.Errorf("store: API token %s: %w", id, err)
	}
	return t, nil
}

// ListAPITokens implements APITokenStore.
func (s *DB) ListAPITokens(ctx context.Context) ([]APIToken, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+apiTokenColumns+` FROM api_tokens ORDER BY created_at`)
	if err != nil {
		return nil, fmt.Errorf("store: list API tokens: %w", err)
	}
	defer rows.Close()
	out := []APIToken{}
	for rows.Next() {
		t, err := scanAPIToken(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// DeleteAPIToken implements APITokenStore.
func (s *DB) DeleteAPIToken(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM api_tokens WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("store: delete API token %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: API token %s: %w", id, ErrNotFound)
	}
	return nil
}
