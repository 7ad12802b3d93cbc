package store

import (
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"testing"
)

// dataDirAt makes a database as a hub of schema version v left it: the
// first v migrations, then queries (the rows to upgrade). It returns the
// database's path, for OpenSQLite to migrate.
func dataDirAt(t *testing.T, v int, queries ...string) string {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tether.db")
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for i, m := range migrations[:v] {
		if _, err := db.ExecContext(ctx, m); err != nil {
			t.Fatalf("v%d: %v", i+1, err)
		}
	}
	if _, err := db.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v)); err != nil {
		t.Fatal(err)
	}
	for _, q := range queries {
		if _, err := db.ExecContext(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	return path
}
