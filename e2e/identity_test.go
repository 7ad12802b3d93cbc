package e2e

import (
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

type auditJSON struct {
	Kind          string `json:"kind"`
	Operator      string `json:"operator"`
	Node          string `json:"node"`
	Result        string `json:"result"`
	KeyFP         string `json:"key_fingerprint"`
	Remote        string `json:"remote"`
	Detail        string `json:"detail"`
	BytesToNode   int64  `json:"bytes_to_node"`
	BytesFromNode int64  `json:"bytes_from_node"`
}

func (h *hub) audit(args ...string) []auditJSON {
	h.t.Helper()
	var out []auditJSON
	if err := json.Unmarshal([]byte(h.cli(append([]string{"audit", "-o", "json"}, args...)...)), &out); err != nil {
		h.t.Fatal(err)
	}
	return out
}

// TestRolesRevokeAudit: an operator reaches only the nodes their roles select
// and only with the roles' logins; a revoked node's live session is closed at
// once and it cannot come back; every step is in the audit log.
func TestRolesRevokeAudit(t *testing.T) {
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub)
	bobKey := filepath.Join(t.TempDir(), "bob")
	runCmd(t, 10*time.Second, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", bobKey)
	h.cli("role", "create", "lab-ops", "--nodes", "site=lab,env!=prod", "--logins", loginUser)
	h.cli("operator", "add", "bob", "--key", bobKey+".pub", "--role", "lab-ops")
	agent, _ := startAgent(t, h.token("--label", "site=lab"), "lab1", "--ssh", "embedded")
	startAgent(t, h.token("--label", "site=lab", "--label", "env=prod"), "prod1", "--ssh", "embedded")
	h.waitOnline("lab1", "")
	h.waitOnline("prod1", "")
	bob := newSSHClientAs(t, h, "bob", bobKey)
	alice := newSSHClient(t, h)

	if out, errOut, code := bob.run(30*time.Second, "lab1", "echo bob-in"); code != 0 ||
		strings.TrimSpace(out) != "bob-in" {
		t.Fatalf("bob to lab1: %d %q %q", code, out, errOut)
	}
	_, errOut, code := bob.run(30*time.Second, "prod1", "true")
	if code == 0 || !strings.Contains(errOut, `roles (lab-ops) do not select node "prod1"`) {
		t.Fatalf("bob to prod1: exit %d, %q", code, errOut)
	}
	// The role allows only loginUser: another login is refused by the node.
	_, errOut, code = runCmd(t, 30*time.Second, "ssh", "-F", bob.cfg, "-J", "bob@"+h.sshAddr(),
		"nobody-else@lab1.tether", "true")
	if code != 255 || !strings.Contains(errOut, "Permission denied") {
		t.Fatalf("bob as another login: exit %d, %q", code, errOut)
	}

	// Revocation: alice holds a session open; revoke ends it at once.
	done := make(chan struct{})
	go func() {
		defer close(done)
		alice.run(60*time.Second, "lab1", "echo started; sleep 45")
	}()
	waitFor(t, "alice's session to start", 20*time.Second, func() bool {
		return strings.Contains(h.p.Log(), `msg="jump started" component=bastion operator=alice`)
	})
	revokedAt := time.Now()
	h.cli("nodes", "revoke", "lab1")
	select {
	case <-done:
		t.Logf("live session ended %s after revoke", time.Since(revokedAt).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("live session still running 10s after revoke")
	}
	waitFor(t, "revoked agent to stop", 20*time.Second, agent.Exited)
	if !strings.Contains(agent.Log(), "revoked") {
		t.Fatalf("agent log does not say it was revoked")
	}
	_, errOut, code = alice.run(30*time.Second, "lab1", "true")
	if code == 0 || !strings.Contains(errOut, `node "lab1" was revoked`) {
		t.Fatalf("jump to revoked node: exit %d, %q", code, errOut)
	}
	// The revocation is durable: after a hub restart it still holds.
	h.p.Stop(syscall.SIGKILL, stopWait)
	h.start()
	if n := h.nodes()["lab1"]; n.Online {
		t.Fatal("revoked node online after restart")
	}

	events := h.audit("--node", "lab1")
	var sawJoin, sawBobJump, sawRevoke bool
	for _, e := range events {
		switch {
		case e.Kind == "join" && e.Result == "ok":
			sawJoin = true
		case e.Kind == "jump" && e.Operator == "bob" && e.Result == "ok" && e.BytesToNode > 0 &&
			e.BytesFromNode > 0 && strings.HasPrefix(e.KeyFP, "SHA256:") && e.Remote != "":
			sawBobJump = true
		case e.Kind == "revoke":
			sawRevoke = true
		}
	}
	if !sawJoin || !sawBobJump || !sawRevoke {
		t.Fatalf("audit for lab1 misses events (join %v, bob's jump %v, revoke %v): %+v", sawJoin, sawBobJump,
			sawRevoke, events)
	}
	denied := h.audit("--operator", "bob", "--since", "1h")
	found := false
	for _, e := range denied {
		if e.Kind == "jump" && e.Node == "prod1" && e.Result == "denied" {
			found = true
		}
	}
	if !found {
		t.Fatalf("audit misses bob's denied jump to prod1: %+v", denied)
	}
}

// TestRenewalKeepsSessionAlive: with 20 s node certificates the agent renews
// over the control stream (no reconnect) while a 60 s SSH session runs; the
// renewed certificate is what the agent reconnects with; an agent that stays
// offline past expiry stops with a clear "re-join needed".
func TestRenewalKeepsSessionAlive(t *testing.T) {
	t.Parallel()
	h := startHubIn(t, "", 0, "--node-cert-ttl", "20s")
	h.cli("operator", "add", "alice", "--key", opPub)
	agent, stateDir := startAgent(t, h.token(), "short", "--ssh", "embedded")
	h.waitOnline("short", "")
	c := newSSHClient(t, h)
	start := time.Now()
	out, errOut, code := c.run(2*time.Minute, "short", "for i in $(seq 60); do echo $i; sleep 1; done")
	if code != 0 || len(strings.Fields(out)) != 60 {
		t.Fatalf("60 s session: exit %d after %s, %d lines, stderr %q", code, time.Since(start).Round(time.Second),
			len(strings.Fields(out)), errOut)
	}
	renewals := 0
	for _, e := range h.audit("--node", "short") {
		if e.Kind == "renew" && e.Result == "ok" {
			renewals++
		}
	}
	if renewals < 3 {
		t.Fatalf("%d renewals in 60 s with 20 s certificates, want at least 3", renewals)
	}
	if strings.Count(h.p.Log(), `msg="node connected"`) != 1 {
		t.Fatal("the agent reconnected during renewal; renewal must not drop the tunnel")
	}
	t.Logf("%d renewals during the 60 s session", renewals)

	// Reconnect with the renewed certificate (the joined one expired long ago).
	connects := h.connects("short")
	agent.Stop(syscall.SIGTERM, stopWait)
	again := start2(t, stateDir)
	h.waitConnected("short", connects)
	again.Stop(syscall.SIGTERM, stopWait)

	// Offline past expiry: the agent refuses to start and says what to do.
	waitFor(t, "certificate to expire", 30*time.Second, func() bool {
		return strings.Contains(runEdge(t, "status", "--state-dir", stateDir, "-o", "json"), `"cert_expires"`) &&
			certExpired(t, stateDir)
	})
	_, errOut, code = runCmd(t, 30*time.Second, filepath.Join(binDir, "tether-edge"), "run",
		"--state-dir", stateDir, "--ssh", "embedded")
	if code != 77 || !strings.Contains(errOut, "re-join needed") || !strings.Contains(errOut, "tether nodes rm short") {
		t.Fatalf("run with expired certificate: exit %d, %q", code, errOut)
	}
	if st := readStatus(t, stateDir); st.State != "rejoin-needed" {
		t.Fatalf("status: %+v", st)
	}
}

func start2(t *testing.T, stateDir string) *proc {
	return start(t, "agent-again", filepath.Join(binDir, "tether-edge"),
		testenv.AgentArgs("", stateDir, "", "--ssh", "embedded", "--log-level", "debug")...)
}

func runEdge(t *testing.T, args ...string) string {
	out, _, _ := runCmd(t, 10*time.Second, filepath.Join(binDir, "tether-edge"), args...)
	return out
}

func certExpired(t *testing.T, stateDir string) bool {
	b, err := os.ReadFile(filepath.Join(stateDir, "node.crt"))
	if err != nil {
		t.Fatal(err)
	}
	blk, _ := pem.Decode(b)
	c, err := x509.ParseCertificate(blk.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	return time.Now().After(c.NotAfter)
}

// TestLoginCertificates: tether login turns a proof of the registered key
// into a short-lived user certificate with the role's logins; a managed sshd
// that accepts no plain keys (AuthorizedKeysFile none) lets it in, refuses
// it once expired, and refuses a valid one once the operator is removed.
func TestLoginCertificates(t *testing.T) {
	t.Parallel()
	h := startHubIn(t, "", 0, "--user-cert-ttl", "6s")
	h.cli("operator", "add", "alice", "--key", opPub)
	dir := t.TempDir()
	carolKey := filepath.Join(dir, "carol")
	runCmd(t, 10*time.Second, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", carolKey)
	h.cli("role", "create", "certs", "--nodes", "*", "--logins", loginUser)
	// A second role for other nodes: its login must not work on m1.
	h.cli("role", "create", "elsewhere", "--nodes", "site=elsewhere", "--logins", "daemon")
	h.cli("operator", "add", "carol", "--key", carolKey+".pub", "--role", "certs", "--role", "elsewhere")
	certOnly := startSSHD(t, "AuthorizedKeysFile none")
	startAgent(t, h.token(), "m1", certOnly.managedArgs()...)
	h.waitOnline("m1", "")
	revokedFile := filepath.Join(certOnly.dir, "tether", "revoked_keys")
	waitFor(t, "managed sshd configured", 20*time.Second,
		func() bool { _, err := os.Stat(revokedFile); return err == nil })

	// Alice jumps; carol's certificate authenticates to the node.
	alice := newSSHClient(t, h)
	certPath := filepath.Join(dir, "carol-cert.pub")
	cfg, _ := os.ReadFile(alice.cfg)
	os.WriteFile(alice.cfg, append([]byte(fmt.Sprintf("Host m1.tether\n  IdentityFile %s\n  CertificateFile %s\n",
		carolKey, certPath)), cfg...), 0o600)
	login := func() {
		_, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "login",
			"--data-dir", h.dataDir, "--user", "carol", "--key", carolKey, "--out-dir", dir)
		if code != 0 || !strings.Contains(errOut, "principals tether:certs:"+loginUser) {
			t.Fatalf("tether login: exit %d, %q", code, errOut)
		}
	}
	login()
	if out, errOut, code := alice.run(30*time.Second, "m1", "echo cert-ok"); code != 0 ||
		strings.TrimSpace(out) != "cert-ok" {
		t.Fatalf("with a fresh certificate: exit %d, %q %q", code, out, errOut)
	}
	// The certificate also names tether:elsewhere:daemon, but role
	// "elsewhere" does not select m1, so m1's sshd refuses that login.
	if _, errOut, code := runCmd(
		t, 30*time.Second, "ssh", "-F", alice.cfg, "-J", "alice@"+h.sshAddr(), "daemon@m1.tether", "true",
	); code != 255 || !strings.Contains(errOut, "Permission denied") {
		t.Fatalf("login of another role's node: exit %d, %q", code, errOut)
	}
	time.Sleep(7 * time.Second)
	if _, errOut, code := alice.run(30*time.Second, "m1", "true"); code != 255 ||
		!strings.Contains(errOut, "Permission denied") {
		t.Fatalf("with an expired certificate: exit %d, %q", code, errOut)
	}
	login()
	h.cli("operator", "rm", "carol")
	carolPub, _ := os.ReadFile(carolKey + ".pub")
	waitFor(t, "carol's key in the managed sshd's revoked keys", 20*time.Second, func() bool {
		b, _ := os.ReadFile(revokedFile)
		return strings.Contains(string(b), strings.Fields(string(carolPub))[1])
	})
	if _, errOut, code := alice.run(30*time.Second, "m1", "true"); code != 255 ||
		!strings.Contains(errOut, "Permission denied") {
		t.Fatalf("removed operator's valid certificate: exit %d, %q", code, errOut)
	}
	// Login itself is refused for a removed operator, and audited.
	_, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "login", "--data-dir", h.dataDir,
		"--user", "carol", "--key", carolKey, "--out-dir", dir)
	if code == 0 || !strings.Contains(errOut, `no operator "carol" with this key`) {
		t.Fatalf("login after removal: exit %d, %q", code, errOut)
	}
	var ok, refused bool
	for _, e := range h.audit("--operator", "carol") {
		ok = ok || (e.Kind == "login" && e.Result == "ok")
		refused = refused || (e.Kind == "login" && e.Result == "refused")
	}
	if !ok || !refused {
		t.Fatal("logins not audited")
	}
}
