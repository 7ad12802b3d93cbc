package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Token is a join token record; the secret itself is never stored.
type Token struct {
	ID         string            `json:"id"`
	SecretHash []byte            `json:"-"`
	Labels     map[string]string `json:"labels"`
	UsesLeft   int               `json:"uses_left"`
	ExpiresAt  time.Time         `json:"expires_at"`
	CreatedAt  time.Time         `json:"created_at"`
	// Kind is what the token registers: TokenNode ("" too) or TokenSite.
	Kind string `json:"kind"`
}

// TokenStore persists join tokens (hashed); Join consumes them.
type TokenStore interface {
	// CreateToken stores a new join token.
	CreateToken(ctx context.Context, t Token) error
	ListTokens(ctx context.Context) ([]Token, error)
	// GetToken returns join token id (ErrNotFound if there is none), for
	// the join endpoint to authenticate a request before it signs anything.
	GetToken(ctx context.Context, id string) (Token, error)
	DeleteToken(ctx context.Context, id string) error
}

// IsSite reports whether the token registers site hubs.
func (t Token) IsSite() bool { return t.Kind == TokenSite }

// CreateToken implements TokenStore.
func (s *DB) CreateToken(ctx context.Context, t Token) error {
	_, err := s.db.ExecContext(ctx,
		`INSERT INTO tokens (id, secret_hash, labels, uses_left, expires_at, created_at, kind) VALUES (?,?,?,?,?,?,?)`,
		t.ID, t.SecretHash, encodeLabels(t.Labels), t.UsesLeft, unix(t.ExpiresAt), unix(t.CreatedAt), tokenKind(t.Kind))
	if err != nil {
		return fmt.Errorf("store: create token %s: %w", t.ID, err)
	}
	return nil
}

// ListTokens implements TokenStore.
func (s *DB) ListTokens(ctx context.Context) ([]Token, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+tokenColumns+` FROM tokens ORDER BY created_at`)
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

const tokenColumns = `id, secret_hash, labels, uses_left, expires_at, created_at, kind`

func tokenKind(k string) string {
	if k == "" {
		return TokenNode
	}
	return k
}

func scanToken(r scanner) (Token, error) {
	var t Token
	var labels string
	var exp, created int64
	if err := r.Scan(&t.ID, &t.SecretHash, &labels, &t.UsesLeft, &exp, &created, &t.Kind); err != nil {
		return Token{}, err
	}
	var err error
	if t.Labels, err = decodeLabels(labels); err != nil {
		return Token{}, fmt.Errorf("store: token %s: %w", t.ID, err)
	}
	t.ExpiresAt, t.CreatedAt = fromUnix(exp), fromUnix(created)
	return t, nil
}

// DeleteToken implements TokenStore.
func (s *DB) DeleteToken(ctx context.Context, id string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM tokens WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("store: delete token %s: %w", id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: token %s: %w", id, ErrNotFound)
	}
	return nil
}

// GetToken implements TokenStore.
func (s *DB) GetToken(ctx context.Context, id string) (Token, error) {
	t, err := scanToken(s.db.QueryRowContext(ctx, `SELECT `+tokenColumns+` FROM tokens WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return Token{}, fmt.Errorf("store: token %s: %w", id, ErrNotFound)
	}
	if err != nil {
		return Token{}, fmt.Errorf("store: token %s: %w", id, err)
	}
	return t, nil
}
