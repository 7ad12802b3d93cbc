package pgtest

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/jackc/pgx/v5"
)

func TestMain(m *testing.M) { os.Exit(Main(m)) }

// Each test gets its own database on the shared server; a server of its
// own stops and starts again on the same port and is gone after Stop.
func TestDatabasesAndRestart(t *testing.T) {
	ctx := context.Background()
	a, b := DSN(t), DSN(t)
	if a == b {
		t.Fatalf("two tests' databases share a URL: %s", a)
	}
	for _, dsn := range []string{a, b} {
		c, err := pgx.Connect(ctx, dsn)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := c.Exec(ctx, `CREATE TABLE t (x INT)`); err != nil {
			t.Fatalf("%s: %v", dsn, err)
		}
		c.Close(ctx)
	}

	s := Own(t)
	port := s.Port
	s.StopServer()
	if _, err := pgx.Connect(ctx, s.AdminDSN()); err == nil {
		t.Fatal("connected to a stopped server")
	}
	if err := s.StartServer(); err != nil {
		t.Fatal(err)
	}
	if s.Port != port {
		t.Fatalf("restart moved the server from port %d to %d", port, s.Port)
	}
	c, err := pgx.Connect(ctx, s.AdminDSN())
	if err != nil {
		t.Fatal(err)
	}
	c.Close(ctx)
	pidFile := filepath.Join(s.Dir, "data", "postmaster.pid")
	if _, err := os.Stat(pidFile); err != nil {
		t.Fatal(err)
	}
	pid := s.cmd.Process.Pid
	s.Stop()
	if syscall.Kill(pid, 0) == nil {
		t.Fatalf("server pid %d alive after Stop", pid)
	}
	if _, err := os.Stat(s.Dir); !os.IsNotExist(err) {
		t.Fatalf("cluster dir %s left after Stop: %v", s.Dir, err)
	}
}
