package store

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
)

// DB is the Store over database/sql, for both backends. Every Store method
// is written once, in SQLite's SQL with `?` placeholders; the PostgreSQL
// connection rebinds them to `$n` (pgdriver.go), and the few statements the
// two dialects spell differently ask the dialect (d).
type DB struct {
	db *sql.DB
	d  dialect

	// stmts are the hottest statements (hot), prepared once: preparing
	// took two thirds of a node look-up by ID, made for every node of a
	// fan-out (bench P6). Keyed by the query text.
	stmtMu sync.Mutex
	stmts  map[string]*sql.Stmt

	seen seenCommits // UpdateNodeSeen's group commit (seen.go)
}

// prepared returns query's statement, preparing it on first use.
func (s *DB) prepared(ctx context.Context, query string) (*sql.Stmt, error) {
	s.stmtMu.Lock()
	defer s.stmtMu.Unlock()
	if st, ok := s.stmts[query]; ok {
		return st, nil
	}
	st, err := s.db.PrepareContext(ctx, query)
	if err != nil {
		return nil, err
	}
	if s.stmts == nil {
		s.stmts = map[string]*sql.Stmt{}
	}
	s.stmts[query] = st
	return st, nil
}

// hot runs fixed statements through the prepared cache. It is for the
// statements a hub runs per session or per node: every agent's hello (node
// look-up, facts, last seen, its site, its upgrades, the services it may
// consume), where parsing and planning the SQL cost more than running it
// (a 2,000-agent reconnect storm spent 27 % of the hub's CPU in the store,
// most of it in SQLite's parser). Only queries whose text is fixed (or one
// of a few variants) may go through it: the cache keeps every text it sees.
func (s *DB) hot() hotDB { return hotDB{s} }

type hotDB struct{ s *DB }

func (h hotDB) QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error) {
	st, err := h.s.prepared(ctx, q)
	if err != nil {
		return nil, err
	}
	return st.QueryContext(ctx, args...)
}

// QueryRowContext falls back to an unprepared query if preparing fails: a
// *sql.Row carries its error only from database/sql, and that query fails
// the same way.
func (h hotDB) QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row {
	st, err := h.s.prepared(ctx, q)
	if err != nil {
		return h.s.db.QueryRowContext(ctx, q, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

func (h hotDB) ExecContext(ctx context.Context, q string, args ...any) (sql.Result, error) {
	st, err := h.s.prepared(ctx, q)
	if err != nil {
		return nil, err
	}
	return st.ExecContext(ctx, args...)
}

// dialect is what differs between the backends' SQL.
type dialect struct {
	// name is "sqlite" or "postgres".
	name string
	// forUpdate is appended to a SELECT in a transaction that reads a row
	// it then changes: PostgreSQL (read committed) locks the row so a
	// concurrent transaction on another replica waits; SQLite has one
	// writer at a time (BEGIN IMMEDIATE) and needs nothing.
	forUpdate string
	// forShare is appended to the SELECT that checks a fence: PostgreSQL
	// keeps the lease row from changing (a takeover waits) until the
	// fenced write commits.
	forShare string
	// lockChanges, run first in the transaction that appends to the
	// change feed, makes appends commit in sequence order on PostgreSQL
	// (identity values are handed out before commit, so without it a
	// reader could pass a sequence number that commits later). SQLite has
	// one writer at a time.
	lockChanges string
}

var (
	sqliteDialect   = dialect{name: "sqlite"}
	postgresDialect = dialect{name: "postgres", forUpdate: " FOR UPDATE", forShare: " FOR SHARE",
		lockChanges: fmt.Sprintf("SELECT pg_advisory_xact_lock(%d)", pgChangesLock)}
)

// Backend names the database behind s ("sqlite" or "postgres").
func (s *DB) Backend() string { return s.d.name }

// Close closes the database.
func (s *DB) Close() error {
	s.stmtMu.Lock()
	for _, st := range s.stmts {
		st.Close()
	}
	s.stmts = nil
	s.stmtMu.Unlock()
	return s.db.Close()
}

// Open opens the store named by spec, as `tether hub --store` takes it:
// "" or "sqlite" for tether.db in dataDir, "sqlite:PATH" or a bare PATH for
// another SQLite file, or a PostgreSQL URL ("postgres://" or
// "postgresql://"; see PostgresConfig).
func Open(ctx context.Context, spec, dataDir string) (*DB, error) {
	kind, loc, err := parseSpec(spec, dataDir)
	if err != nil {
		return nil, err
	}
	if kind == "postgres" {
		return OpenPostgres(ctx, loc)
	}
	return OpenSQLite(ctx, loc)
}

// CheckSpec validates a --store value without opening anything.
func CheckSpec(spec string) error {
	kind, loc, err := parseSpec(spec, ".")
	if err == nil && kind == "postgres" {
		_, err = PostgresConfig(loc)
	}
	return err
}

// Describe is spec fit for a log line: the SQLite file, or the URL
// without its password.
func Describe(spec, dataDir string) string {
	kind, loc, err := parseSpec(spec, dataDir)
	if err != nil || kind == "postgres" {
		return redactSpec(spec)
	}
	return "sqlite:" + loc
}

func parseSpec(spec, dataDir string) (kind, loc string, err error) {
	switch {
	case spec == "" || spec == "sqlite":
		return "sqlite", filepath.Join(dataDir, "tether.db"), nil
	case strings.HasPrefix(spec, "sqlite:"):
		path := strings.TrimPrefix(spec, "sqlite:")
		if path == "" {
			return "", "", fmt.Errorf("store: --store sqlite: needs a path (sqlite:/var/lib/tether/tether.db)")
		}
		return "sqlite", path, nil
	case strings.HasPrefix(spec, "postgres://"), strings.HasPrefix(spec, "postgresql://"):
		return "postgres", spec, nil
	case !strings.Contains(spec, "://"):
		// A bare path is a SQLite file, as sqlite:PATH.
		return "sqlite", spec, nil
	}
	return "", "", fmt.Errorf(
		"store: --store %q: want a SQLite file (PATH or sqlite:PATH) or postgres://USER@HOST/DB?sslmode=verify-full",
		redactSpec(spec))
}

// rebind turns the `?` placeholders of q into PostgreSQL's `$1, $2, …`,
// leaving alone what is inside string literals, quoted identifiers and
// comments.
func rebind(q string) string {
	if !strings.Contains(q, "?") {
		return q
	}
	var b strings.Builder
	b.Grow(len(q) + 16)
	n := 0
	for i := 0; i < len(q); i++ {
		c := q[i]
		switch {
		case c == '\'' || c == '"':
			j := i + 1
			for j < len(q) && q[j] != c {
				j++
			}
			// A doubled quote is an escaped one: the loop meets it as the
			// end of one literal and the start of the next, which is right.
			b.WriteString(q[i:min(j+1, len(q))])
			i = j
		case c == '-' && i+1 < len(q) && q[i+1] == '-':
			j := strings.IndexByte(q[i:], '\n')
			if j < 0 {
				j = len(q) - i
			}
			b.WriteString(q[i : i+j])
			i += j - 1
		case c == '/' && i+1 < len(q) && q[i+1] == '*':
			j := strings.Index(q[i+2:], "*/")
			end := len(q)
			if j >= 0 {
				end = i + 2 + j + 2
			}
			b.WriteString(q[i:end])
			i = end - 1
		case c == '?':
			n++
			fmt.Fprintf(&b, "$%d", n)
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
