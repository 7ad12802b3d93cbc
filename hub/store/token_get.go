package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
)

// GetToken implements Store.
func (s *SQLite) GetToken(ctx context.Context, id string) (Token, error) {
	t, err := scanToken(s.db.QueryRowContext(ctx, `SELECT id, secret_hash, labels, uses_left, expires_at, created_at FROM tokens WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Token{}, fmt.Errorf("store: token %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Token{}, fmt.Errorf("store: token %s: %w", id, err)
	}
	return t, nil
}
