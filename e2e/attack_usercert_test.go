package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// TestAttackExpiredAndRevokedUserCerts: an operator's SSH user certificate
// from `tether login` is refused once expired, and a still-valid one is
// refused once the operator is removed — at the agent's embedded SSH
// server and at a managed OpenSSH sshd. The inner SSH connection is end to
// end encrypted, so the hub cannot see that refusal: the node records it
// (the agent's log, sshd's log), and the hub's audit log has the jump, the
// login and the removal.
func TestAttackExpiredAndRevokedUserCerts(t *testing.T) {
	t.Parallel()
	const ttl = 4 * time.Second
	h := startHubArgs(t, 0, "--user-cert-ttl", ttl.String())
	h.cli("operator", "add", "alice", "--key", opPub)
	dir := t.TempDir()
	carolKey := filepath.Join(dir, "carol")
	runCmd(t, 10*time.Second, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", carolKey)
	h.cli("role", "create", "certs", "--nodes", "*", "--logins", loginUser)
	h.cli("operator", "add", "carol", "--key", carolKey+".pub", "--role", "certs")
	join := h.token("--uses", "2")
	emb, _ := startAgent(t, join, "cert-emb", "--ssh", "embedded")
	managed := startSSHD(t, "AuthorizedKeysFile none")
	startAgent(t, join, "cert-sshd", managed.managedArgs()...)
	h.waitOnline("cert-emb", "")
	h.waitOnline("cert-sshd", "")
	revokedFile := filepath.Join(managed.dir, "tether", "revoked_keys")
	waitFor(t, "managed sshd configured", 20*time.Second,
		func() bool { _, err := os.Stat(revokedFile); return err == nil })

	// Alice jumps; carol's certificate (only) authenticates to the nodes:
	// her plain key is an operator key the hub pushes to embedded servers,
	// which would let her in by itself. OpenSSH offers a certificate
	// without its plain key only from an agent.
	sock := filepath.Join(dir, "agent.sock")
	start(t, "ssh-agent", "ssh-agent", "-D", "-a", sock)
	waitFor(t, "ssh-agent", 10*time.Second, func() bool { _, err := os.Stat(sock); return err == nil })
	alice := newSSHClient(t, h)
	cfg, _ := os.ReadFile(alice.cfg)
	os.WriteFile(alice.cfg, append([]byte(fmt.Sprintf("Host cert-*.tether\n  IdentityAgent %s\n"+
		"  IdentitiesOnly no\n  PubkeyAcceptedAlgorithms ssh-ed25519-cert-v01@openssh.com\n", sock)), cfg...), 0o600)
	login := func() time.Time {
		t.Helper()
		_, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "login",
			"--data-dir", h.dataDir, "--user", "carol", "--key", carolKey, "--out-dir", dir)
		if code != 0 {
			t.Fatalf("tether login: exit %d, %q", code, errOut)
		}
		// ssh-add loads carol's key with the certificate next to it.
		cmd := execCommand(10*time.Second, "sh", "-c", "ssh-add -D && ssh-add "+carolKey)
		cmd.Env = append(os.Environ(), "SSH_AUTH_SOCK="+sock)
		if out, err := cmd.CombinedOutput(); err != nil || !strings.Contains(string(out), "Certificate added") {
			t.Fatalf("ssh-add: %v %s", err, out)
		}
		return time.Now()
	}
	nodes := []string{"cert-emb", "cert-sshd"}
	expect := func(what string, ok bool) {
		t.Helper()
		for _, n := range nodes {
			out, errOut, code := alice.run(30*time.Second, n, "echo in")
			switch {
			case ok && (code != 0 || strings.TrimSpace(out) != "in"):
				t.Fatalf("%s: %s refused: exit %d %q", what, n, code, errOut)
			case !ok && (code != 255 || !strings.Contains(errOut, "Permission denied")):
				t.Fatalf("%s: %s not refused: exit %d %q %q", what, n, code, out, errOut)
			}
		}
	}
	issued := login()
	expect("fresh certificate", true)
	time.Sleep(time.Until(issued.Add(ttl + time.Second)))
	expect("expired certificate", false)

	login()
	h.cli("operator", "rm", "carol")
	carolPub, _ := os.ReadFile(carolKey + ".pub")
	waitFor(t, "carol's key in the managed sshd's revoked keys", 20*time.Second, func() bool {
		b, _ := os.ReadFile(revokedFile)
		return strings.Contains(string(b), strings.Fields(string(carolPub))[1])
	})
	// The embedded server gets the same list over the control stream.
	waitFor(t, "the revocation at the embedded server", 20*time.Second, func() bool {
		_, _, code := alice.run(30*time.Second, "cert-emb", "true")
		return code == 255
	})
	expect("valid certificate of a removed operator", false)

	// The nodes recorded each refusal.
	sshdLog := procLog(t, managed)
	for _, want := range []string{"Certificate invalid: expired", "revoked"} {
		if !strings.Contains(sshdLog, want) {
			t.Errorf("sshd log lacks %q", want)
		}
	}
	embLog := emb.Log()
	if !strings.Contains(embLog, "user certificate rejected") || !strings.Contains(embLog, "expired") {
		t.Error("the embedded server did not log the expired certificate")
	}
	if n := strings.Count(embLog, `msg="authentication attempt failed"`); n < 2 {
		t.Errorf("the embedded server logged %d refused attempts, want the expired and the revoked one", n)
	}
	// The hub's side: the logins, the removal, the jumps that carried
	// the refused attempts.
	// A jump's row is written once the node has said how the login inside
	// it went, a moment after the client is gone: poll.
	var logins, removed, jumps int
	polled := time.Now()
	_ = testenv.Poll(context.Background(), 20*time.Second, "the audit rows", func() bool {
		logins, removed, jumps = 0, 0, 0
		for _, e := range h.audit("--since", "1h") {
			switch {
			case e.Kind == "login" && e.Operator == "carol" && e.Result == "ok" &&
				strings.HasPrefix(e.Detail, "user certificate"):
				logins++
			case e.Kind == "operator_remove" && e.Operator == "carol":
				removed++
			case e.Kind == "jump" && e.Operator == "alice" && e.Result == "ok":
				jumps++
			}
		}
		return logins == 2 && removed == 1 && jumps >= 6
	})
	t.Logf("audit rows complete %v after the last attempt", time.Since(polled).Round(time.Millisecond))
	if logins != 2 || removed != 1 || jumps < 6 {
		t.Errorf("hub audit: %d logins, %d removals, %d jumps", logins, removed, jumps)
	}
}

// procLog reads the log of a started sshd through its stderr (the test's
// log file).
func procLog(t *testing.T, s *sshd) string {
	t.Helper()
	pid, err := os.ReadFile(s.PidFile)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(pid)))
	path, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/2", n))
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
