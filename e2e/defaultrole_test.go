package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestDefaultRoleReachesEveryNode: an operator added without --role gets the
// built-in role "all" (every node, login "*"). With a `tether login`
// certificate they reach the current user on a node whose stock sshd the
// agent manages (where "*" used to match no principals file, so sshd
// refused them) as on a node with the embedded server; once the role no
// longer allows every login, the managed sshd refuses the certificate.
func TestDefaultRoleReachesEveryNode(t *testing.T) {
	t.Parallel()
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub)
	managed := startSSHD(t, "AuthorizedKeysFile none")
	// A root sshd runs the principals command as nobody, which must reach
	// the file as it does /etc/ssh/tether; t.TempDir's parent is 0700.
	if err := os.Chmod(filepath.Dir(managed.dir), 0o755); err != nil {
		t.Fatal(err)
	}
	startAgent(t, h.token(), "managed1", managed.managedArgs()...)
	startAgent(t, h.token(), "embedded1", "--ssh", "embedded")
	h.waitOnline("managed1", "")
	h.waitOnline("embedded1", "")
	anyLoginFile := filepath.Join(managed.dir, "tether", "any_login_principals")
	waitFor(t, "managed sshd given the any-login principals", 20*time.Second, func() bool {
		b, _ := os.ReadFile(anyLoginFile)
		return strings.Contains(string(b), "tether:all:*")
	})

	dir := t.TempDir()
	_, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "login", "--data-dir", h.dataDir,
		"--user", "alice", "--key", opKey, "--out-dir", dir)
	if code != 0 || !strings.Contains(errOut, "tether:all:*") {
		t.Fatalf("tether login: exit %d, %q", code, errOut)
	}
	alice := newSSHClient(t, h)
	cfg, _ := os.ReadFile(alice.cfg)
	os.WriteFile(alice.cfg, append([]byte(fmt.Sprintf("Host *.tether\n  CertificateFile %s\n",
		filepath.Join(dir, "alice-cert.pub"))), cfg...), 0o600)
	for _, node := range []string{"managed1", "embedded1"} {
		if out, errOut, code := alice.run(30*time.Second, node, "echo reached "+node); code != 0 ||
			strings.TrimSpace(out) != "reached "+node {
			t.Fatalf("default role to %s: exit %d, %q %q", node, code, out, errOut)
		}
	}

	// Role "all" narrowed to another login: the any-login principal is
	// withdrawn from the managed sshd, and alice's certificate refused.
	h.cli("role", "create", "all", "--nodes", "*", "--logins", "somebody-else")
	waitFor(t, "any-login principals withdrawn", 20*time.Second, func() bool {
		b, err := os.ReadFile(anyLoginFile)
		return err == nil && !strings.Contains(string(b), "tether:all:*")
	})
	if _, errOut, code := alice.run(30*time.Second, "managed1", "true"); code != 255 ||
		!strings.Contains(errOut, "Permission denied") {
		t.Fatalf("after the role no longer allows any login: exit %d, %q", code, errOut)
	}
}
