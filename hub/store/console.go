package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// ConsoleCode is a one-time sign-in code of the web console (`tether ui`),
// stored by the SHA-256 of the code (hex) only.
type ConsoleCode struct {
	Hash      string
	Operator  string // "" with Admin: the hub machine's local admin identity
	KeyTag    string // the operator key the code was asked for with (access.AdminKeyTag)
	Admin     bool
	CreatedAt time.Time
	ExpiresAt time.Time
}

// ConsoleSession is a signed-in browser, stored by the SHA-256 of its
// cookie (hex) only. CSRF is the token every state-changing request of
// the session must carry.
type ConsoleSession struct {
	Hash      string
	Operator  string
	KeyTag    string
	Admin     bool
	CSRF      string
	CreatedAt time.Time
	ExpiresAt time.Time
}

// ConsoleStore keeps the web console's sign-in codes and sessions.
type ConsoleStore interface {
	CreateConsoleCode(ctx context.Context, c ConsoleCode) error
	// TakeConsoleCode consumes the code with this hash: it is deleted
	// whether or not it is still valid, so it works at most once.
	// ErrNotFound if there is none; ErrExpired if it had expired.
	TakeConsoleCode(ctx context.Context, hash string, now time.Time) (ConsoleCode, error)
	CreateConsoleSession(ctx context.Context, s ConsoleSession) error
	// GetConsoleSession returns the session with this hash (ErrNotFound,
	// also for one that expired).
	GetConsoleSession(ctx context.Context, hash string, now time.Time) (ConsoleSession, error)
	DeleteConsoleSession(ctx context.Context, hash string) error
	// PruneConsole deletes expired codes and sessions.
	PruneConsole(ctx context.Context, now time.Time) error
}

// ErrExpired is returned for a console code or session past its time.
var ErrExpired = errors.New("expired")

// CreateConsoleCode implements ConsoleStore.
func (s *DB) CreateConsoleCode(ctx context.Context, c ConsoleCode) error {
	if _, err := s.db.ExecContext(ctx,
		`INSERT INTO console_codes (hash, operator, key_tag, admin, created_at, expires_at) VALUES (?,?,?,?,?,?)`,
		c.Hash, c.Operator, c.KeyTag, c.Admin, unix(c.CreatedAt), unix(c.ExpiresAt)); err != nil {
		return fmt.Errorf("store: create console sign-in code: %w", err)
	}
	return nil
}

// TakeConsoleCode implements ConsoleStore.
func (s *DB) TakeConsoleCode(ctx context.Context, hash string, now time.Time) (ConsoleCode, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return ConsoleCode{}, fmt.Errorf("store: take console sign-in code: %w", err)
	}
	defer tx.Rollback()
	c := ConsoleCode{Hash: hash}
	var created, expires int64
	err = tx.QueryRowContext(ctx,
		`SELECT operator, key_tag, admin, created_at, expires_at FROM console_codes WHERE hash = ?`, hash).
		Scan(&c.Operator, &c.KeyTag, &c.Admin, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return ConsoleCode{}, ErrNotFound
	}
	if err != nil {
		return ConsoleCode{}, fmt.Errorf("store: take console sign-in code: %w", err)
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM console_codes WHERE hash = ?`, hash)
	if err != nil {
		return ConsoleCode{}, fmt.Errorf("store: take console sign-in code: %w", err)
	}
	if n, _ := res.RowsAffected(); n != 1 {
		return ConsoleCode{}, ErrNotFound // taken meanwhile
	}
	if err := tx.Commit(); err != nil {
		return ConsoleCode{}, fmt.Errorf("store: take console sign-in code: %w", err)
	}
	c.CreatedAt, c.ExpiresAt = fromUnix(created), fromUnix(expires)
	if !now.Before(c.ExpiresAt) {
		return ConsoleCode{}, ErrExpired
	}
	return c, nil
}

// CreateConsoleSession implements ConsoleStore.
func (s *DB) CreateConsoleSession(ctx context.Context, cs ConsoleSession) error {
	if _, err := s.db.ExecContext(ctx,
		`INSERT INTO console_sessions (hash, operator, key_tag, admin, csrf, created_at, expires_at) VALUES (?,?,?,?,?,?,?)`,
		cs.Hash, cs.Operator, cs.KeyTag, cs.Admin, cs.CSRF, unix(cs.CreatedAt), unix(cs.ExpiresAt)); err != nil {
		return fmt.Errorf("store: create console session: %w", err)
	}
	return nil
}

// GetConsoleSession implements ConsoleStore.
func (s *DB) GetConsoleSession(ctx context.Context, hash string, now time.Time) (ConsoleSession, error) {
	cs := ConsoleSession{Hash: hash}
	var created, expires int64
	err := s.db.QueryRowContext(ctx,
		`SELECT operator, key_tag, admin, csrf, created_at, expires_at FROM console_sessions WHERE hash = ? AND `+
			`expires_at > ?`,
		hash, unix(now)).Scan(&cs.Operator, &cs.KeyTag, &cs.Admin, &cs.CSRF, &created, &expires)
	if errors.Is(err, sql.ErrNoRows) {
		return ConsoleSession{}, ErrNotFound
	}
	if err != nil {
		return ConsoleSession{}, fmt.Errorf("store: read console session: %w", err)
	}
	cs.CreatedAt, cs.ExpiresAt = fromUnix(created), fromUnix(expires)
	return cs, nil
}

// DeleteConsoleSession implements ConsoleStore.
func (s *DB) DeleteConsoleSession(ctx context.Context, hash string) error {
	if _, err := s.db.ExecContext(ctx, `DELETE FROM console_sessions WHERE hash = ?`, hash); err != nil {
		return fmt.Errorf("store: delete console session: %w", err)
	}
	return nil
}

// PruneConsole implements ConsoleStore.
func (s *DB) PruneConsole(ctx context.Context, now time.Time) error {
	for _, table := range []string{"console_codes", "console_sessions"} {
		if _, err := s.db.ExecContext(ctx, `DELETE FROM `+table+` WHERE expires_at <= ?`, unix(now)); err != nil {
			return fmt.Errorf("store: prune %s: %w", table, err)
		}
	}
	return nil
}
