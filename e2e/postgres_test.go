package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv/pgtest"
)

// TestHubSurvivesPostgresRestart: a hub on PostgreSQL (`--store
// postgres://…`) whose database server stops and starts again. Meanwhile
// the hub keeps running, the agent's tunnel stays up, and what needs the
// store fails with an error naming the server; afterwards the hub works
// again by itself (the pool reconnects): listing, a new join, a jump.
func TestHubSurvivesPostgresRestart(t *testing.T) {
	srv := pgtest.Own(t)
	dsn, err := srv.CreateDB("hub")
	if err != nil {
		t.Fatal(err)
	}
	// The test server trusts any password: the hub is given one to hide.
	dsn = strings.Replace(dsn, "tether@", "tether:s3cret@", 1)
	h := startHubIn(t, "", 0, "--store", dsn)
	h.cli("operator", "add", "alice", "--key", opPub)
	startAgent(t, h.token(), "n1", "--ssh", "embedded")
	h.waitOnline("n1", "")
	ssh := newSSHClient(t, h)
	if out, errOut, code := ssh.run(30*time.Second, "n1", "echo", "before"); code != 0 ||
		strings.TrimSpace(out) != "before" {
		t.Fatalf("jump before the restart: %q %q exit %d", out, errOut, code)
	}
	connects := h.connects("n1")

	srv.StopServer()
	tether := filepath.Join(binDir, "tether")
	_, errOut, code := runCmd(t, 30*time.Second, tether, "nodes", "--data-dir", h.dataDir)
	if code == 0 {
		t.Fatal("tether nodes succeeded with the database down")
	}
	where := fmt.Sprintf("PostgreSQL at 127.0.0.1:%d unreachable", srv.Port)
	waitFor(t, "the hub to log "+where, 10*time.Second, func() bool { return strings.Contains(h.p.Log(), where) })
	if !strings.Contains(errOut, "failed on the hub") {
		t.Errorf("tether nodes with the database down said %q", errOut)
	}
	if strings.Contains(h.p.Log(), "panic") || h.p.Exited() {
		t.Fatalf("hub died with the database down:\n%s", h.p.Log())
	}

	if err := srv.StartServer(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "tether nodes to work again", 30*time.Second, func() bool {
		_, _, code := runCmd(t, 30*time.Second, tether, "nodes", "--data-dir", h.dataDir)
		return code == 0
	})
	if n := h.nodes()["n1"]; !n.Online {
		t.Fatalf("n1 after the restart: %+v", n)
	}
	if got := h.connects("n1"); got != connects {
		t.Errorf("the agent reconnected %d times during the database restart; its tunnel should have stayed up", got-connects)
	}
	startAgent(t, h.token(), "n2", "--ssh", "embedded")
	h.waitOnline("n2", "")
	for _, node := range []string{"n1", "n2"} {
		if out, errOut, code := ssh.run(30*time.Second, node, "echo", "after"); code != 0 ||
			strings.TrimSpace(out) != "after" {
			t.Fatalf("jump to %s after the restart: %q %q exit %d", node, out, errOut, code)
		}
	}
	if strings.Contains(h.p.Log(), "s3cret") {
		t.Fatal("the hub logged a password")
	}
}
