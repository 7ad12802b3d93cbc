package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// ErrUnavailable is what every store error caused by an unreachable
// database server matches (errors.Is): the operation may succeed once the
// server is back, which the connection pool notices by itself.
var ErrUnavailable = errors.New("store unavailable")

// UnreachableError is a store operation that failed because the PostgreSQL
// server could not be reached or dropped the connection.
type UnreachableError struct {
	Where string // host:port or unix socket directory, never the password
	Err   error
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("PostgreSQL at %s unreachable: %v", e.Where, e.Err)
}

func (e *UnreachableError) Unwrap() error { return e.Err }

// Is makes every UnreachableError match ErrUnavailable.
func (e *UnreachableError) Is(target error) bool { return target == ErrUnavailable }

// PostgreSQL error codes the store branches on.
const (
	pgUniqueViolation     = "23505"
	pgForeignKeyViolation = "23503"
	pgDiskFull            = "53100"
)

func pgCode(err error) string {
	var pe *pgconn.PgError
	if errors.As(err, &pe) {
		return pe.Code
	}
	return ""
}

// sslModes are the sslmode values a --store URL may name. "allow" and
// "prefer" are refused: a man in the middle turns them into no TLS at all.
var sslModes = map[string]bool{"disable": true, "require": true, "verify-ca": true, "verify-full": true}

// PostgresConfig parses and validates a PostgreSQL URL for the store. The
// URL must name its sslmode: verify-full for a server across a network,
// disable only for a server on a unix socket or loopback address. Errors
// never hold the password.
func PostgresConfig(dsn string) (*pgx.ConnConfig, error) {
	u, err := url.Parse(dsn)
	if err != nil {
		var ue *url.Error
		if errors.As(err, &ue) {
			err = ue.Err // its message repeats the URL, password included
		}
		return nil, fmt.Errorf("store: --store %s: not a valid URL: %v", redactSpec(dsn), err)
	}
	if u.Scheme != "postgres" && u.Scheme != "postgresql" {
		return nil, fmt.Errorf("store: --store %s is not a postgres:// URL (postgres://USER@HOST/DB?sslmode=verify-full)",
			redactSpec(dsn))
	}
	mode := u.Query().Get("sslmode")
	switch {
	case mode == "":
		return nil, fmt.Errorf(
			"store: --store %s names no sslmode: add sslmode=verify-full (or sslmode=disable for a server on a unix socket "+
				"or loopback)", redactSpec(dsn))
	case !sslModes[mode]:
		return nil, fmt.Errorf(
			"store: --store %s: sslmode=%s is not accepted: use verify-full, verify-ca, require, or disable (local server only)",
			redactSpec(dsn), mode)
	}
	if strings.TrimPrefix(u.Path, "/") == "" && u.Query().Get("dbname") == "" {
		return nil, fmt.Errorf("store: --store %s names no database (postgres://USER@HOST/DB?sslmode=…)", redactSpec(dsn))
	}
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		var pe *pgconn.ParseConfigError
		if errors.As(err, &pe) {
			// pgx's message names the fault; its connection string is
			// already redacted, but ours is the one to show.
			return nil, fmt.Errorf("store: --store %s: %s", redactSpec(dsn), pgParseReason(pe))
		}
		return nil, fmt.Errorf("store: --store %s: cannot parse", redactSpec(dsn))
	}
	return cfg, nil
}

func pgParseReason(pe *pgconn.ParseConfigError) string {
	msg := pe.Error()
	if i := strings.Index(msg, ": "); i >= 0 && strings.HasPrefix(msg, "cannot parse") {
		msg = msg[i+2:]
	}
	if strings.Contains(msg, "://") {
		return "invalid URL"
	}
	return msg
}

// redactSpec is a --store value fit for an error message or a log line:
// a URL's password is replaced by xxxxx.
func redactSpec(spec string) string {
	u, err := url.Parse(spec)
	if err != nil {
		if i := strings.LastIndex(spec, "@"); i >= 0 {
			if j := strings.Index(spec, "://"); j >= 0 && j < i {
				return spec[:j+3] + "xxxxx" + spec[i:]
			}
			return "xxxxx" + spec[i:]
		}
		return spec
	}
	return u.Redacted()
}

// pgWhere names the server of cfg for messages: host:port or the socket
// directory.
func pgWhere(cfg *pgx.ConnConfig) string {
	if strings.HasPrefix(cfg.Host, "/") {
		return fmt.Sprintf("%s (unix socket, port %d)", cfg.Host, cfg.Port)
	}
	return fmt.Sprintf("%s:%d", cfg.Host, cfg.Port)
}

// OpenPostgres connects to the PostgreSQL database of dsn (see
// PostgresConfig) and migrates it. Several hubs may open one database at
// once: migrations run under a transaction-scoped advisory lock.
func OpenPostgres(ctx context.Context, dsn string) (*DB, error) {
	cfg, err := PostgresConfig(dsn)
	if err != nil {
		return nil, err
	}
	where := pgWhere(cfg)
	db := sql.OpenDB(newPGConnector(cfg, where))
	// A pool: PostgreSQL serves many writers, unlike SQLite. Connections a
	// server restart broke are dropped on their next use and redialed.
	db.SetMaxOpenConns(16)
	db.SetMaxIdleConns(4)
	db.SetConnMaxIdleTime(5 * time.Minute)
	db.SetConnMaxLifetime(30 * time.Minute)
	s := &DB{db: db, d: postgresDialect}
	if err := s.migratePostgres(ctx); err != nil {
		db.Close()
		if errors.Is(err, ErrUnavailable) {
			return nil, fmt.Errorf("store: %w", err) // it names the server
		}
		return nil, fmt.Errorf("store: PostgreSQL database %s at %s: %w", cfg.Database, where, err)
	}
	return s, nil
}

// pgMigrationLock is the advisory lock key (pg_advisory_xact_lock) hubs
// hold while they migrate one database: "tether" in ASCII.
const pgMigrationLock = 0x746574686572

// pgChangesLock serializes appends to the change feed (dialect.lockChanges).
const pgChangesLock = pgMigrationLock + 1

func (s *DB) migratePostgres(ctx context.Context) error {
	if len(pgMigrations) != len(migrations) {
		return fmt.Errorf("hub built with %d PostgreSQL migrations for %d SQLite ones", len(pgMigrations), len(migrations))
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	// Every replica may start at once: the first to take the lock migrates,
	// the others wait for its commit and then find nothing to do.
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(?)`, int64(pgMigrationLock)); err != nil {
		return fmt.Errorf("take the migration lock: %w", err)
	}
	if _, err := tx.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS tether_schema (version INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("create tether_schema: %w", err)
	}
	var v int
	err = tx.QueryRowContext(ctx, `SELECT version FROM tether_schema`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		_, err = tx.ExecContext(ctx, `INSERT INTO tether_schema (version) VALUES (0)`)
	}
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > schemaVersion {
		return fmt.Errorf("database schema v%d is newer than this hub understands (v%d); upgrade the hub", v, schemaVersion)
	}
	if v == schemaVersion {
		return nil
	}
	// PostgreSQL's DDL is transactional: all pending versions commit
	// together or not at all.
	for ; v < schemaVersion; v++ {
		if _, err := tx.ExecContext(ctx, pgMigrations[v]); err != nil {
			return fmt.Errorf("migrate to v%d: %w", v+1, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `UPDATE tether_schema SET version = ?`, v); err != nil {
		return err
	}
	return tx.Commit()
}
