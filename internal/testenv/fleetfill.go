package testenv

import (
	"database/sql"
	"fmt"
	"testing"
	"time"

	_ "modernc.org/sqlite" // the hub's store driver
)

// FillNodes writes n offline nodes straight into a stopped hub's SQLite
// store in one transaction (a join per node would take minutes at 100k),
// for the console's scale tests and benchmarks: sites s0..s99, env dev or
// prod, three agent versions, two OSes.
func FillNodes(t testing.TB, dbPath string, n int) {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+dbPath)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	tx, err := db.Begin()
	if err != nil {
		t.Fatal(err)
	}
	stmt, err := tx.Prepare(`INSERT INTO nodes (id, name, labels, hostname, os, arch, machine_id, agent_version, ` +
		`transport, online, last_seen, created_at, cert_serial, cert_expires, facts)
		VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UnixMilli()
	for i := range n {
		env := "dev"
		if i%4 == 0 {
			env = "prod"
		}
		labels := fmt.Sprintf(`{"env":%q,"site":"s%d"}`, env, i%100)
		osName := "Debian GNU/Linux 12 (bookworm)"
		if i%3 == 0 {
			osName = "Ubuntu 24.04 LTS"
		}
		if _, err := stmt.Exec(fmt.Sprintf("id%08d", i), fmt.Sprintf("node-%06d", i), labels,
			fmt.Sprintf("host-%06d", i), osName, "amd64", "",
			fmt.Sprintf("v1.%d.0", i%3), "quic", 0, now-int64(i)*1000, now, "", 0, "{}"); err != nil {
			t.Fatal(err)
		}
	}
	if err := tx.Commit(); err != nil {
		t.Fatal(err)
	}
}
