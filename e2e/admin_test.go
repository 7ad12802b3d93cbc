package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/pki"
)

// TestAdminIdentityRevocable drives the real binaries: the local admin
// identity is short-lived; an operator with the admin role gets an admin
// certificate from `tether login` that admin commands with --hub use; a
// copy of DATA_DIR/admin and the operator's certificate stop working after
// `tether ca revoke-admin` while --data-dir keeps working; `tether operator
// rm` ends the operator's API access.
func TestAdminIdentityRevocable(t *testing.T) {
	h := startHub(t)
	tether := filepath.Join(binDir, "tether")
	home := t.TempDir() // the admin's laptop: ~/.tether lands here
	env := append(os.Environ(), "HOME="+home, "SSH_AUTH_SOCK=")
	run := func(args ...string) (string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, tether, args...)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		if ctx.Err() != nil {
			t.Fatalf("tether %v: timed out", args)
		}
		if ee, ok := err.(*exec.ExitError); ok {
			return out.String(), ee.ExitCode()
		} else if err != nil {
			t.Fatalf("tether %v: %v", args, err)
		}
		return out.String(), 0
	}
	mustRun := func(args ...string) string {
		t.Helper()
		out, code := run(args...)
		if code != 0 {
			t.Fatalf("tether %v: exit %d: %s", args, code, out)
		}
		return out
	}
	refused := func(want string, args ...string) {
		t.Helper()
		out, code := run(args...)
		if code == 0 || !strings.Contains(out, want) {
			t.Fatalf("tether %v: exit %d: %s; want a refusal containing %q", args, code, out, want)
		}
	}

	localDir := filepath.Join(h.dataDir, "admin")
	b, err := os.ReadFile(filepath.Join(localDir, "admin.crt"))
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pki.ParseCerts(b)
	if err != nil {
		t.Fatal(err)
	}
	if life := certs[0].NotAfter.Sub(certs[0].NotBefore); life > 9*time.Hour {
		t.Fatalf("local admin certificate lives %s; want hours", life)
	}

	copied := t.TempDir()
	for _, f := range []string{"admin.crt", "admin.key", "ca.crt"} {
		b, err := os.ReadFile(filepath.Join(localDir, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(copied, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	mustRun("operator", "list", "--hub", h.apiAddr(), "--identity", copied)

	mustRun("operator", "add", "alice", "--key", opPub, "--role", "admin", "--data-dir", h.dataDir)
	js, err := pki.ParseJoinString(h.token())
	if err != nil {
		t.Fatal(err)
	}
	login := []string{"login", "--hub", h.apiAddr(), "--ca-pin", "sha256:" + js.CAPin, "--user", "alice", "--key", opKey}
	if out := mustRun(login...); !strings.Contains(out, "admin certificate valid until") {
		t.Fatalf("tether login as an admin: %s", out)
	}
	// No --identity: the one tether login left in ~/.tether/admin.
	if out := mustRun("operator", "list", "--hub", h.apiAddr()); !strings.Contains(out, "alice") {
		t.Fatalf("operator list with alice's admin certificate: %s", out)
	}

	mustRun("ca", "revoke-admin", "--data-dir", h.dataDir)
	refused("revoke-admin", "operator", "list", "--hub", h.apiAddr(), "--identity", copied)
	refused("revoke-admin", "operator", "list", "--hub", h.apiAddr())
	mustRun("operator", "list", "--data-dir", h.dataDir)
	if out := mustRun("audit", "--data-dir", h.dataDir); !strings.Contains(out, "admin_revoke") {
		t.Fatalf("no admin_revoke in the audit log:\n%s", out)
	}

	// A new login works again, until the operator is removed.
	mustRun(login...)
	mustRun("operator", "list", "--hub", h.apiAddr())
	mustRun("operator", "rm", "alice", "--data-dir", h.dataDir)
	refused(`operator "alice" is no longer registered`, "operator", "list", "--hub", h.apiAddr())
}
