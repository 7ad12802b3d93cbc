package hub

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/operator"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
)

// startHubAt runs a hub on dir (which may hold an earlier hub's state) until
// the returned stop is called (also at cleanup).
func startHubAt(t *testing.T, dir string) (*Server, *apiclient.Client, func()) {
	t.Helper()
	s, err := New(context.Background(), Config{DataDir: dir, Listen: "127.0.0.1:0", SSHListen: "127.0.0.1:0"})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	var c *apiclient.Client
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if c, err = apiclient.NewLocalClient(dir); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal(err)
		}
	}
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		c.Close()
		cancel()
		if err := <-done; err != nil {
			t.Errorf("hub Run: %v", err)
		}
	}
	t.Cleanup(stop)
	return s, c, stop
}

func readLeaf(t *testing.T, dir string) *x509.Certificate {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(dir, apitype.AdminCertFile))
	if err != nil {
		t.Fatal(err)
	}
	certs, err := pki.ParseCerts(b)
	if err != nil {
		t.Fatal(err)
	}
	return certs[0]
}

// copyDir copies the files of an admin identity directory, as an admin
// copying DATA_DIR/admin to a laptop would.
func copyDir(t *testing.T, from string) string {
	t.Helper()
	to := t.TempDir()
	for _, f := range []string{apitype.AdminCertFile, apitype.AdminKeyFile, apitype.AdminCAFile} {
		b, err := os.ReadFile(filepath.Join(from, f))
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(to, f), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return to
}

func hubAddr(t *testing.T, s *Server) string {
	t.Helper()
	info, err := apiclient.LocalHub(s.cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	return info.API
}

// wantRefused asserts that an admin call fails with a 403 whose message
// contains want.
func wantRefused(t *testing.T, c *apiclient.Client, want string) {
	t.Helper()
	_, err := c.ListOperators(context.Background())
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("admin call: err %v; want a refusal containing %q", err, want)
	}
}

// TestLocalAdminIdentityShortLivedAndReminted: the hub's local admin
// identity lives hours, not a year, and the hub re-mints it when it is
// missing or past half its life.
func TestLocalAdminIdentityShortLivedAndReminted(t *testing.T) {
	s, c := testHub(t)
	dir := filepath.Join(s.cfg.DataDir, apitype.AdminDir)
	leaf := readLeaf(t, dir)
	if life := leaf.NotAfter.Sub(leaf.NotBefore); life > 9*time.Hour {
		t.Fatalf("local admin certificate lives %s; want hours (8h)", life)
	}
	if _, err := c.ListOperators(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Missing: back after the hub's next check.
	if err := os.Remove(filepath.Join(dir, apitype.AdminCertFile)); err != nil {
		t.Fatal(err)
	}
	if err := s.operators.RefreshLocalAdmin(context.Background()); err != nil {
		t.Fatal(err)
	}
	c2, err := apiclient.NewLocalClient(s.cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	if _, err := c2.ListOperators(context.Background()); err != nil {
		t.Fatal(err)
	}

	// Near expiry: replaced by one with the full lifetime.
	near, keyPEM, err := s.ca.IssueKeyPair(pki.Identity{Kind: pki.KindAdmin, ID: operator.LocalAdminID},
		"local-admin", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	writeIdentity(t, dir, pki.EncodeCerts(near.Leaf, s.ca.Intermediate()), keyPEM, pki.EncodeCerts(s.ca.Certificate()))
	if err := s.operators.RefreshLocalAdmin(context.Background()); err != nil {
		t.Fatal(err)
	}
	if fresh := readLeaf(t, dir); !fresh.NotAfter.After(near.Leaf.NotAfter.Add(operator.LocalAdminTTL / 2)) {
		t.Fatalf("near-expiry local identity not re-minted: valid until %s", fresh.NotAfter)
	}

	// Fresh: left alone (a reader never races a needless rewrite).
	before := readLeaf(t, dir)
	if err := s.operators.RefreshLocalAdmin(context.Background()); err != nil {
		t.Fatal(err)
	}
	if after := readLeaf(t, dir); !after.Equal(before) {
		t.Fatal("a fresh local identity was re-minted")
	}
}

func writeIdentity(t *testing.T, dir string, chainPEM, keyPEM, caPEM []byte) {
	t.Helper()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{
		apitype.AdminCertFile: chainPEM, apitype.AdminKeyFile: keyPEM, apitype.AdminCAFile: caPEM,
	} {
		if err := pki.WriteFileAtomic(filepath.Join(dir, name), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// TestRevokeAdminRefusesCopiedCert: a copy of DATA_DIR/admin works until
// `tether ca revoke-admin`, then is refused with a message that says why,
// also after a restart; the local identity is re-minted and keeps working;
// the revocation is audited.
func TestRevokeAdminRefusesCopiedCert(t *testing.T) {
	dataDir := t.TempDir()
	s, c, stop := startHubAt(t, dataDir)
	copied := copyDir(t, filepath.Join(dataDir, apitype.AdminDir))
	cc, err := apiclient.NewClient(hubAddr(t, s), copied)
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	if _, err := cc.ListOperators(context.Background()); err != nil {
		t.Fatalf("copied identity before revoke-admin: %v", err)
	}

	if _, err := c.RevokeAdmin(context.Background()); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, cc, "revoke-admin")
	local, err := apiclient.NewLocalClient(dataDir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := local.ListOperators(context.Background()); err != nil {
		t.Fatalf("re-minted local identity: %v", err)
	}
	events, err := local.ListAudit(context.Background(), apiclient.AuditQuery{})
	if err != nil {
		t.Fatal(err)
	}
	audited := false
	for _, e := range events {
		audited = audited || (e.Kind == "admin_revoke" && e.Result == "ok")
	}
	if !audited {
		t.Fatalf("no admin_revoke audit event in %+v", events)
	}
	local.Close()
	stop()

	// Durable: a restarted hub still refuses the copy.
	s, _, _ = startHubAt(t, dataDir)
	cc2, err := apiclient.NewClient(hubAddr(t, s), copied)
	if err != nil {
		t.Fatal(err)
	}
	defer cc2.Close()
	wantRefused(t, cc2, "revoke-admin")
}

// adminLogin runs tether login's exchange for operator with key, asking for
// an admin certificate, and returns the identity directory it wrote ("" if
// the hub gave no admin certificate).
func adminLogin(t *testing.T, s *Server, operator string, key ed25519.PrivateKey) string {
	t.Helper()
	resp, keyPEM := loginWithCSR(t, s, operator, key)
	if resp.AdminCert == "" {
		return ""
	}
	dir := filepath.Join(t.TempDir(), operator)
	writeIdentity(t, dir, []byte(resp.AdminCert), keyPEM, pki.EncodeCerts(s.ca.Certificate()))
	return dir
}

func addOperator(t *testing.T, c *apiclient.Client, name string, roleNames ...string) ed25519.PrivateKey {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := gossh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddOperator(context.Background(), apitype.OperatorAddRequest{
		Name: name, PublicKey: string(gossh.MarshalAuthorizedKey(sshPub)), Roles: roleNames,
	}); err != nil {
		t.Fatal(err)
	}
	return priv
}

// TestAdminOperatorLoginAndRemoval: an operator holding the admin role gets
// a short-lived admin certificate from tether login and uses the API with
// it; others get none; `tether operator rm`, a re-registered key and the
// loss of the admin role each end that certificate's access at the next
// request.
func TestAdminOperatorLoginAndRemoval(t *testing.T) {
	s, c := testHub(t)
	ctx := context.Background()
	aliceKey := addOperator(t, c, "alice", "admin")
	carolKey := addOperator(t, c, "carol", "admin")
	bobKey := addOperator(t, c, "bob", "all")

	if dir := adminLogin(t, s, "bob", bobKey); dir != "" {
		t.Fatal("an operator without the admin role got an admin certificate")
	}
	aliceDir := adminLogin(t, s, "alice", aliceKey)
	carolDir := adminLogin(t, s, "carol", carolKey)
	if aliceDir == "" || carolDir == "" {
		t.Fatal("an operator with the admin role got no admin certificate")
	}
	if life := readLeaf(t, aliceDir).NotAfter.Sub(readLeaf(t, aliceDir).NotBefore); life >
		operator.MaxAdminCertTTL+operator.ClockSkewAllowance {
		t.Fatalf("operator admin certificate lives %s", life)
	}
	alice, err := apiclient.NewClient(hubAddr(t, s), aliceDir)
	if err != nil {
		t.Fatal(err)
	}
	defer alice.Close()
	carol, err := apiclient.NewClient(hubAddr(t, s), carolDir)
	if err != nil {
		t.Fatal(err)
	}
	defer carol.Close()
	if _, err := alice.ListOperators(ctx); err != nil {
		t.Fatalf("alice's admin certificate: %v", err)
	}

	if err := c.RemoveOperator(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, alice, `operator "alice" is no longer registered`)
	if _, err := carol.ListOperators(ctx); err != nil {
		t.Fatalf("carol after alice's removal: %v", err)
	}

	// alice again, with another key: the old certificate stays dead.
	addOperator(t, c, "alice", "admin")
	wantRefused(t, alice, "key changed")

	if err := c.DeleteRole(ctx, "admin"); err != nil {
		t.Fatal(err)
	}
	wantRefused(t, carol, `no longer holds the "admin" role`)

	events, err := c.ListAudit(ctx, apiclient.AuditQuery{})
	if err != nil {
		t.Fatal(err)
	}
	audited := 0
	for _, e := range events {
		if e.Kind == "api" && e.Result == "refused" && (strings.Contains(e.Detail, "no longer registered") ||
			strings.Contains(e.Detail, "key changed") || strings.Contains(e.Detail, "no longer holds")) {
			audited++
		}
	}
	if audited != 3 {
		t.Fatalf("%d of 3 refused admin certificates audited: %+v", audited, events)
	}
}

// TestAdminCertExpiredOrLegacy: an expired admin certificate is refused by
// the client with a message saying what to do (not a TLS alert), and a
// 365-day admin certificate as hubs made before the upgrade is refused by
// the hub, saying what replaced it.
func TestAdminCertExpiredOrLegacy(t *testing.T) {
	s, _ := testHub(t)
	caPEM := pki.EncodeCerts(s.ca.Certificate())

	expired, keyPEM, err := s.ca.IssueKeyPair(pki.Identity{Kind: pki.KindAdmin, ID: operator.LocalAdminID},
		"local-admin", -time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "expired")
	writeIdentity(t, dir, pki.EncodeCerts(expired.Leaf, s.ca.Intermediate()), keyPEM, caPEM)
	c, err := apiclient.NewClient(hubAddr(t, s), dir)
	if err == nil {
		_, err = c.ListOperators(context.Background())
		c.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "expired at") || !strings.Contains(err.Error(), "tether login") {
		t.Fatalf("expired admin certificate: err %v; want one naming the expiry and `tether login`", err)
	}

	legacy, keyPEM, err := s.ca.IssueKeyPair(pki.Identity{Kind: pki.KindAdmin, ID: "local-admin"}, "local-admin",
		365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	dir = filepath.Join(t.TempDir(), "legacy")
	writeIdentity(t, dir, pki.EncodeCerts(legacy.Leaf, s.ca.Intermediate()), keyPEM, caPEM)
	c, err = apiclient.NewClient(hubAddr(t, s), dir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	wantRefused(t, c, "short-lived")
}

// TestUpgradeReplacesLegacyLocalIdentity: a data dir from before the
// upgrade holds a 365-day local admin identity (and copies of it may exist):
// the upgraded hub writes a short-lived one over a new key, and refuses the
// old certificate, saying what replaced it.
func TestUpgradeReplacesLegacyLocalIdentity(t *testing.T) {
	dataDir := t.TempDir()
	authority, err := ca.LoadOrCreate(filepath.Join(dataDir, "ca"), "Tether")
	if err != nil {
		t.Fatal(err)
	}
	legacy, legacyKey, err := authority.IssueKeyPair(pki.Identity{Kind: pki.KindAdmin, ID: "local-admin"},
		"local-admin", 365*24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	localDir := filepath.Join(dataDir, apitype.AdminDir)
	writeIdentity(t, localDir, pki.EncodeCerts(legacy.Leaf, authority.Intermediate()), legacyKey,
		pki.EncodeCerts(authority.Certificate()))
	copied := copyDir(t, localDir)

	s, local, _ := startHubAt(t, dataDir)
	if _, err := local.ListOperators(context.Background()); err != nil {
		t.Fatalf("upgraded local identity: %v", err)
	}
	if key, _ := os.ReadFile(filepath.Join(localDir, apitype.AdminKeyFile)); string(key) == string(legacyKey) {
		t.Fatal("the upgraded local identity kept the pre-upgrade key")
	}
	if leaf := readLeaf(t, localDir); leaf.NotAfter.Sub(leaf.NotBefore) > 9*time.Hour {
		t.Fatalf("upgraded local identity lives %s", leaf.NotAfter.Sub(leaf.NotBefore))
	}
	old, err := apiclient.NewClient(hubAddr(t, s), copied)
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	wantRefused(t, old, "long-lived admin certificate from before")
}
