package testenv

import "github.com/tether-dev/tether/internal/testenv/pgtest"

// Postgres returns the URL of a fresh database on the test process's
// shared throwaway PostgreSQL server (package pgtest: Debian's postgresql
// in a temp dir, run as an unprivileged user), skipping t only where
// PostgreSQL is not installed. A package using it stops the server in its
// TestMain with os.Exit(pgtest.Main(m)); it also dies with the process.
func Postgres(t T) string {
	t.Helper()
	nt, ok := t.(pgtest.T)
	if !ok {
		t.Fatalf("testenv.Postgres needs a *testing.T or *testing.B")
	}
	return pgtest.DSN(nt)
}
