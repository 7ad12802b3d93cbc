package store

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/tether-dev/tether/internal/testenv/pgtest"
)

func TestMain(m *testing.M) { os.Exit(pgtest.Main(m)) }

// backend is one kind of store the suite runs against: newLoc makes a
// fresh, empty location (a file path, a database URL) and open opens the
// store there, as often as a test reopens it.
type backend struct {
	name   string
	newLoc func(t testing.TB) string
	open   func(ctx context.Context, loc string) (*DB, error)
}

var backends = []backend{
	{"sqlite", func(t testing.TB) string { return filepath.Join(t.TempDir(), "tether.db") }, OpenSQLite},
	{"postgres", func(t testing.TB) string { return pgtest.DSN(t) }, OpenPostgres},
}

// forEachBackend runs f as a subtest per backend; openTest opens a fresh
// store of that backend, closed at the test's end.
func forEachBackend(t *testing.T, f func(t *testing.T, b backend, openTest func(t *testing.T) *DB)) {
	for _, b := range backends {
		t.Run(b.name, func(t *testing.T) {
			f(t, b, func(t *testing.T) *DB {
				t.Helper()
				s, err := b.open(context.Background(), b.newLoc(t))
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { s.Close() })
				return s
			})
		})
	}
}
