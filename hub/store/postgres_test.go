package store

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv/pgtest"
)

// column is one column as both schemas describe it, in a common type
// vocabulary.
type column struct {
	Type    string // integer, text, blob
	NotNull bool
}

func sqliteSchema(t *testing.T, s *DB) map[string]map[string]column {
	t.Helper()
	out := map[string]map[string]column{}
	rows, err := s.db.Query(`SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'`)
	if err != nil {
		t.Fatal(err)
	}
	var tables []string
	for rows.Next() {
		var n string
		rows.Scan(&n)
		tables = append(tables, n)
	}
	rows.Close()
	for _, tb := range tables {
		out[tb] = map[string]column{}
		rows, err := s.db.Query(`SELECT name, type, "notnull" OR pk > 0 FROM pragma_table_info(?)`, tb)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
			var name, typ string
			var notNull bool
			rows.Scan(&name, &typ, &notNull)
			out[tb][name] = column{Type: sqliteAffinity(typ), NotNull: notNull}
		}
		rows.Close()
	}
	return out
}

// sqliteAffinity is SQLite's type affinity of a declared column type
// (INTEGER, BIGINT → integer; TEXT → text; BLOB → blob).
func sqliteAffinity(declared string) string {
	d := strings.ToUpper(declared)
	switch {
	case strings.Contains(d, "INT"):
		return "integer"
	case strings.Contains(d, "CHAR"), strings.Contains(d, "CLOB"), strings.Contains(d, "TEXT"):
		return "text"
	case strings.Contains(d, "BLOB"), d == "":
		return "blob"
	}
	return "other:" + strings.ToLower(declared)
}

func postgresSchema(t *testing.T, s *DB) map[string]map[string]column {
	t.Helper()
	out := map[string]map[string]column{}
	rows, err := s.db.Query(`SELECT table_name, column_name, data_type, is_nullable FROM information_schema.columns
		WHERE table_schema = current_schema() AND table_name <> 'tether_schema'`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	types := map[string]string{"bigint": "integer", "integer": "integer", "text": "text", "bytea": "blob"}
	for rows.Next() {
		var tb, name, typ, nullable string
		if err := rows.Scan(&tb, &name, &typ, &nullable); err != nil {
			t.Fatal(err)
		}
		if out[tb] == nil {
			out[tb] = map[string]column{}
		}
		mapped, ok := types[typ]
		if !ok {
			mapped = "unmapped:" + typ
		}
		out[tb][name] = column{Type: mapped, NotNull: nullable == "NO"}
	}
	return out
}

// TestMigrationsInStep: the PostgreSQL migrations are as many as SQLite's,
// and a database migrated on either backend has the same tables with the
// same columns, types (INTEGER↔BIGINT, TEXT, BLOB↔BYTEA) and NOT NULLs.
func TestMigrationsInStep(t *testing.T) {
	if len(pgMigrations) != len(migrations) {
		t.Fatalf("%d PostgreSQL migrations for %d SQLite ones: add the PostgreSQL version of each new migration to "+
			"pgMigrations", len(pgMigrations), len(migrations))
	}
	ctx := context.Background()
	lite, err := OpenSQLite(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer lite.Close()
	pg, err := OpenPostgres(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer pg.Close()
	want, got := sqliteSchema(t, lite), postgresSchema(t, pg)
	var diffs []string
	for tb, cols := range want {
		if got[tb] == nil {
			diffs = append(diffs, fmt.Sprintf("table %s missing on PostgreSQL", tb))
			continue
		}
		for c, wc := range cols {
			gc, ok := got[tb][c]
			switch {
			case !ok:
				diffs = append(diffs, fmt.Sprintf("%s.%s missing on PostgreSQL", tb, c))
			case gc != wc:
				diffs = append(diffs, fmt.Sprintf("%s.%s: SQLite %+v, PostgreSQL %+v", tb, c, wc, gc))
			}
		}
	}
	for tb, cols := range got {
		for c := range cols {
			if _, ok := want[tb][c]; !ok {
				diffs = append(diffs, fmt.Sprintf("%s.%s only on PostgreSQL", tb, c))
			}
		}
	}
	sort.Strings(diffs)
	if len(diffs) > 0 {
		t.Fatalf("schemas differ:\n%s", strings.Join(diffs, "\n"))
	}
	if len(want) < 10 {
		t.Fatalf("only %d tables read from SQLite: the comparison read nothing", len(want))
	}
}

// Three hubs starting at once on an empty database: one migrates, the
// others wait on the advisory lock and find the schema current; the seed
// rows (built-in roles) are there once.
func TestPostgresConcurrentMigrations(t *testing.T) {
	ctx := context.Background()
	dsn := pgtest.DSN(t)
	var wg sync.WaitGroup
	errs := make([]error, 3)
	stores := make([]*DB, 3)
	for i := range 3 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			stores[i], errs[i] = OpenPostgres(ctx, dsn)
		}()
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			t.Fatalf("replica %d: %v", i, err)
		}
		defer stores[i].Close()
	}
	var v int
	if err := stores[0].db.QueryRow(`SELECT version FROM tether_schema`).Scan(&v); err != nil || v != schemaVersion {
		t.Fatalf("schema version %d, %v; want %d", v, err, schemaVersion)
	}
	var n int
	if err := stores[0].db.QueryRow(`SELECT count(*) FROM tether_schema`).Scan(&n); err != nil || n != 1 {
		t.Fatalf("tether_schema rows = %d, %v", n, err)
	}
	roles, err := stores[2].ListRoles(ctx)
	if err != nil || len(roles) != 2 {
		t.Fatalf("built-in roles after 3 concurrent migrations: %+v, %v", roles, err)
	}
}

// The database itself refuses to edit or erase the audit log, whoever
// connects: UPDATE, DELETE and TRUNCATE all fail, and the rows stay.
func TestPostgresAuditAppendOnly(t *testing.T) {
	ctx := context.Background()
	s, err := OpenPostgres(ctx, pgtest.DSN(t))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.AppendAudit(ctx, AuditEvent{At: time.Now(), Kind: "jump", Result: "ok"}); err != nil {
		t.Fatal(err)
	}
	for _, q := range []string{`UPDATE audit SET result = 'denied'`, `DELETE FROM audit`, `TRUNCATE audit`} {
		if _, err := s.db.Exec(q); err == nil || !strings.Contains(err.Error(), "append-only") {
			t.Errorf("%s: %v, want the append-only refusal", q, err)
		}
	}
	if ev, err := s.ListAudit(ctx, AuditFilter{}); err != nil || len(ev) != 1 || ev[0].Result != "ok" {
		t.Fatalf("audit after refused edits: %+v, %v", ev, err)
	}
}

// A PostgreSQL restart under a live store: while the server is down every
// operation fails with an error naming the server (ErrUnavailable), and
// once it is back the pool reconnects by itself, with the data intact.
func TestPostgresRestart(t *testing.T) {
	ctx := context.Background()
	srv := pgtest.Own(t)
	dsn, err := srv.CreateDB("restart")
	if err != nil {
		t.Fatal(err)
	}
	s, err := OpenPostgres(ctx, dsn)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.CreateToken(ctx, Token{
		ID:         "a",
		SecretHash: []byte("h"),
		UsesLeft:   10,
		ExpiresAt:  time.Now().Add(time.Hour),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Join(ctx, "a", accept, Node{ID: "1", Name: "n1"}); err != nil {
		t.Fatal(err)
	}

	// Fill the pool: every idle connection is one the restart will end.
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() { defer wg.Done(); s.ListNodes(ctx) }()
	}
	wg.Wait()

	srv.StopServer()
	where := fmt.Sprintf("PostgreSQL at 127.0.0.1:%d unreachable", srv.Port)
	for i := range 3 { // each op may meet a pooled connection or dial anew
		_, err := s.ListNodes(ctx)
		if !errors.Is(err, ErrUnavailable) || !strings.Contains(err.Error(), where) {
			t.Fatalf("ListNodes %d with the server down: %v; want ErrUnavailable naming %q", i, err, where)
		}
		t.Logf("server down: %v", err)
	}
	if _, err := s.Join(ctx, "a", accept, Node{ID: "2", Name: "n2"}); !errors.Is(err, ErrUnavailable) {
		t.Fatalf("Join with the server down: %v", err)
	}

	if err := srv.StartServer(); err != nil {
		t.Fatal(err)
	}
	// Every call after the restart succeeds: a pooled connection the
	// restart ended is dropped and the call retried on a new one.
	for i := range 8 {
		nodes, err := s.ListNodes(ctx)
		if err != nil || len(nodes) != 1 || nodes[0].Name != "n1" {
			t.Fatalf("call %d after the restart: %+v, %v", i, nodes, err)
		}
	}
	if _, err := s.Join(ctx, "a", accept, Node{ID: "2", Name: "n2"}); err != nil {
		t.Fatalf("join after the restart: %v", err)
	}

	// A quick restart, with connections used a moment before: the pool
	// does not ping them before reuse, and each holds the server's
	// goodbye. No call may fail for it.
	for round := range 3 {
		for range 8 {
			wg.Add(1)
			go func() { defer wg.Done(); s.ListNodes(ctx) }()
		}
		wg.Wait()
		srv.StopServer()
		if err := srv.StartServer(); err != nil {
			t.Fatal(err)
		}
		for i := range 8 {
			if _, err := s.ListNodes(ctx); err != nil {
				t.Fatalf("quick restart %d, call %d: %v", round, i, err)
			}
		}
	}
}

// Many joins racing for a token's last uses (as agents joining through
// several replicas): exactly UsesLeft of them succeed, on both backends.
func TestConcurrentJoinsSpendTokenOnce(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		loc := b.newLoc(t)
		// Two stores on one database: two replicas (for SQLite, two hubs
		// would not share a file, but two pools still race).
		s1, err := b.open(ctx, loc)
		if err != nil {
			t.Fatal(err)
		}
		defer s1.Close()
		s2, err := b.open(ctx, loc)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		const uses, joiners = 3, 16
		if err := s1.CreateToken(ctx, Token{
			ID:         "a",
			SecretHash: []byte("h"),
			UsesLeft:   uses,
			ExpiresAt:  time.Now().Add(time.Hour),
		}); err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		errs := make([]error, joiners)
		for i := range joiners {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s := s1
				if i%2 == 1 {
					s = s2
				}
				_, errs[i] = s.Join(ctx, "a", accept, Node{ID: fmt.Sprint("id", i), Name: fmt.Sprint("n", i)})
			}()
		}
		wg.Wait()
		ok := 0
		for i, err := range errs {
			switch {
			case err == nil:
				ok++
			case !errors.Is(err, ErrTokenUsedUp):
				t.Errorf("join %d: %v", i, err)
			}
		}
		nodes, err := s1.ListNodes(ctx)
		if ok != uses || err != nil || len(nodes) != uses {
			t.Fatalf("%d joins succeeded, %d nodes (%v); want %d", ok, len(nodes), err, uses)
		}
		if tok, err := s2.GetToken(ctx, "a"); err != nil || tok.UsesLeft != 0 {
			t.Fatalf("uses left %d, %v", tok.UsesLeft, err)
		}
	})
}

func TestPostgresConfig(t *testing.T) {
	cases := []struct {
		dsn     string
		wantErr string // "" means valid
	}{
		{"postgres://tether@db.example.com/tether?sslmode=verify-full", ""},
		{"postgresql://tether:s3cret@10.0.0.5:5433/tether?sslmode=verify-ca", ""},
		{"postgres://tether@127.0.0.1/tether?sslmode=disable", ""},
		{"postgres://tether@/tether?host=/run/postgresql&sslmode=disable", ""},
		{"postgres://tether:s3cret@db/tether", "names no sslmode"},
		{"postgres://tether:s3cret@db/tether?sslmode=prefer", "sslmode=prefer is not accepted"},
		{"postgres://tether:s3cret@db/tether?sslmode=allow", "sslmode=allow is not accepted"},
		{"postgres://tether:s3cret@db/tether?sslmode=bogus", "sslmode=bogus is not accepted"},
		{"postgres://tether:s3cret@db?sslmode=require", "names no database"},
		{"mysql://tether:s3cret@db/tether", "not a postgres:// URL"},
		{"postgres://tether:s3cret@db:notaport/tether?sslmode=require", "not a valid URL"},
	}
	for _, tc := range cases {
		t.Run(tc.dsn, func(t *testing.T) {
			_, err := PostgresConfig(tc.dsn)
			if tc.wantErr == "" {
				if err != nil {
					t.Fatalf("valid URL refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "s3cret") {
				t.Fatalf("error shows the password: %v", err)
			}
		})
	}
	for _, spec := range []string{
		"", "sqlite", "sqlite:/x/tether.db", "/shared/tether.db", "postgres://u@h/d?sslmode=require",
	} {
		if err := CheckSpec(spec); err != nil {
			t.Errorf("CheckSpec(%q): %v", spec, err)
		}
	}
	for _, spec := range []string{"sqlite:", "mysql://x", "mysql://u:s3cret@h/d", "postgres://u:s3cret@h/d"} {
		if err := CheckSpec(spec); err == nil || strings.Contains(err.Error(), "s3cret") {
			t.Errorf("CheckSpec(%q) = %v, want an error without the password", spec, err)
		}
	}
	if d := Describe("postgres://u:s3cret@h/d?sslmode=require", "/d"); strings.Contains(d, "s3cret") {
		t.Errorf("Describe shows the password: %s", d)
	}
	if d := Describe("", "/var/lib/tether"); d != "sqlite:/var/lib/tether/tether.db" {
		t.Errorf("Describe(default) = %s", d)
	}
}

func TestRebind(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{`SELECT 1`, `SELECT 1`},
		{`SELECT a FROM t WHERE x = ? AND y IN (?,?)`, `SELECT a FROM t WHERE x = $1 AND y IN ($2,$3)`},
		{`UPDATE t SET e = 'why? it''s ?' WHERE id = ?`, `UPDATE t SET e = 'why? it''s ?' WHERE id = $1`},
		{
			`SELECT "odd?col" FROM t WHERE a = ? -- why?` + "\n" + `AND b = ?`,
			`SELECT "odd?col" FROM t WHERE a = $1 -- why?` + "\n" + `AND b = $2`,
		},
		{`SELECT /* ? */ ?`, `SELECT /* ? */ $1`},
		{`SELECT '?`, `SELECT '?`},
	} {
		if got := rebind(tc.in); got != tc.want {
			t.Errorf("rebind(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// FuzzRebind: rebinding never panics, and keeps every byte that is not a
// placeholder it replaced.
func FuzzRebind(f *testing.F) {
	f.Add(`SELECT ? FROM t WHERE a = '?' AND b = ?`) // quoted placeholder stays
	f.Add(`-- ?` + "\n" + `?/* ? */"?"`)             // comments and identifiers
	f.Add(`'unterminated ?`)                         // literal to the end
	f.Fuzz(func(t *testing.T, q string) {
		out := rebind(q)
		n := strings.Count(q, "?") - strings.Count(out, "?")
		if n < 0 {
			t.Fatalf("rebind added placeholders: %q -> %q", q, out)
		}
		if strings.Contains(q, "$") {
			return // the input's own $n would be counted below
		}
		back := out
		for i := n; i >= 1; i-- {
			back = strings.ReplaceAll(back, fmt.Sprintf("$%d", i), "?")
		}
		if strings.Count(back, "?") != strings.Count(q, "?") {
			t.Fatalf("%q -> %q: %d placeholders replaced, not numbered 1..%d", q, out, n, n)
		}
	})
}
