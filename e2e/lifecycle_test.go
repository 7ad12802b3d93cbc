package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHubRestart: agents reconnect by themselves after a graceful restart
// and after kill -9, and jumps work again; the store survives both.
func TestHubRestart(t *testing.T) {
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub)
	join := h.token("--uses", "2")
	fast := []string{"--ssh", "embedded", "--keepalive", "1s", "--dead-peer-timeout", "4s"}
	startAgent(t, join, "rq", append(fast, "--transport", "quic")...)
	startAgent(t, join, "rt", append(fast, "--transport", "tcp")...)
	h.waitOnline("rq", "quic")
	h.waitOnline("rt", "tcp")
	c := newSSHClient(t, h)

	for _, sig := range []syscall.Signal{syscall.SIGTERM, syscall.SIGKILL} {
		t.Run(sig.String(), func(t *testing.T) {
			h.p.Stop(sig, stopWait)
			// Restart at once. After kill -9 a QUIC agent learns of the
			// restart from a stateless reset (if it sends data) or from its
			// dead-peer timeout, shortened here to keep the test fast.
			start := time.Now()
			h.start()
			h.waitOnline("rq", "quic")
			h.waitOnline("rt", "tcp")
			t.Logf("after %s: both agents back in %s", sig, time.Since(start).Round(10*time.Millisecond))
			for _, n := range []string{"rq", "rt"} {
				out, errOut, code := c.run(30*time.Second, n, "echo back")
				if code != 0 || strings.TrimSpace(out) != "back" {
					t.Fatalf("jump to %s after restart: %d %q %q", n, code, out, errOut)
				}
			}
		})
	}
	// The operator registered before both restarts is still there.
	if !strings.Contains(h.cli("operator", "list"), "alice") {
		t.Fatal("operator lost across restarts")
	}
}

type agentStatus struct {
	State     string `json:"state"`
	Transport string `json:"transport"`
	LastError string `json:"last_error"`
}

func readStatus(t *testing.T, stateDir string) agentStatus {
	t.Helper()
	out, _, _ := runCmd(t, 10*time.Second, filepath.Join(binDir, "tether-edge"), "status", "--state-dir", stateDir,
		"-o", "json")
	var st agentStatus
	_ = json.Unmarshal([]byte(out), &st)
	return st
}

// TestSameIdentityTwice: a second agent process with the same identity (a
// restarted agent whose old connection is not yet dead, or a copied state
// dir) replaces the first session; the hub keeps one session per node and
// jumps go to the newest.
func TestReconnectReplacesSession(t *testing.T) {
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub)
	a1, dir := startAgent(t, h.token(), "dup", "--ssh", "embedded", "--transport", "tcp")
	h.waitOnline("dup", "tcp")
	// Freeze the first agent (SIGSTOP): its TCP connection stays open, as a
	// half-dead link would, so the hub still holds that session.
	syscall.Kill(a1.PID(), syscall.SIGSTOP)
	defer syscall.Kill(a1.PID(), syscall.SIGCONT)
	a2 := start(t, "agent-dup-2", filepath.Join(binDir, "tether-edge"), "run", "--state-dir", dir,
		"--ssh", "embedded", "--shell", "/bin/sh", "--transport", "quic", "--log-level", "debug")
	h.waitOnline("dup", "quic")
	if !strings.Contains(h.p.Log(), "replaced its previous session") {
		t.Fatal("hub did not log the replacement")
	}
	c := newSSHClient(t, h)
	if out, errOut, code := c.run(30*time.Second, "dup", "echo newest"); code != 0 || strings.TrimSpace(out) != "newest" {
		t.Fatalf("jump after replacement: %d %q %q", code, out, errOut)
	}
	_ = a2
}

// TestRemovedNodeRefused: `tether nodes rm` closes the tunnel at once and
// the agent stops with a clear message instead of retrying forever.
func TestRemovedNodeRefused(t *testing.T) {
	h := startHub(t)
	a, dir := startAgent(t, h.token(), "gone", "--ssh", "embedded")
	h.waitOnline("gone", "")
	h.cli("nodes", "rm", "gone")
	waitFor(t, "agent to exit", 20*time.Second, a.Exited)
	if st := readStatus(t, dir); st.State != "refused" || !strings.Contains(st.LastError, "removed") {
		t.Fatalf("status after removal: %+v", st)
	}
	if !strings.Contains(a.Log(), "removed") {
		t.Fatalf("agent log does not say it was removed:\n%s", a.Log())
	}
}

// TestRunJoinsOnlyOnce: the same `run --join J` command line works on every
// boot: the second start finds the identity and does not spend the token again
// (a single-use token would refuse a second join).
func TestRunJoinsOnlyOnce(t *testing.T) {
	h := startHub(t)
	join := h.token("--uses", "1")
	stateDir := filepath.Join(t.TempDir(), "boot")
	args := []string{"run", "--join", join, "--state-dir", stateDir, "--name", "boot", "--ssh", "embedded",
		"--backoff-max", "2s"}
	first := start(t, "agent-boot-1", filepath.Join(binDir, "tether-edge"), args...)
	h.waitOnline("boot", "")
	id := h.nodes()["boot"].ID
	first.Stop(syscall.SIGTERM, stopWait)
	if st := readStatus(t, stateDir); st.State != "stopped" {
		t.Fatalf("status after SIGTERM: %+v", st)
	}
	waitFor(t, "node offline", 10*time.Second, func() bool { return !h.nodes()["boot"].Online })
	second := start(t, "agent-boot-2", filepath.Join(binDir, "tether-edge"), args...)
	h.waitOnline("boot", "")
	if got := h.nodes()["boot"].ID; got != id {
		t.Fatalf("node id changed from %s to %s: the agent joined again", id, got)
	}
	if strings.Contains(second.Log(), "joined hub") {
		t.Fatal("second boot joined again")
	}
}
