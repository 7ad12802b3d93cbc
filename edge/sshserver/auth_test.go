package sshserver

import (
	"bytes"
	"crypto/rand"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
)

func TestUnauthorizedKeyRefused(t *testing.T) {
	e := newTestEnv(t)
	other := testenv.NewKeyFile(t, filepath.Join(e.dir, "id_other"))
	// -i would add to the configured IdentityFile; use a config with only
	// the other key to be sure it is the one refused.
	r := e.ssh("-F", writeConfigWithKey(t, e, other.Path), testHost, "true")
	if r.code != 255 || !strings.Contains(r.stderr, "Permission denied") {
		t.Fatalf("unauthorized key: exit %d, stderr %q", r.code, r.stderr)
	}
}

// writeConfigWithKey writes a copy of the test ssh_config using keyPath as
// the only identity. A later -F wins over the one clientCmd passes.
func writeConfigWithKey(t *testing.T, e *testEnv, keyPath string) string {
	t.Helper()
	data, err := os.ReadFile(e.config)
	if err != nil {
		t.Fatal(err)
	}
	conf := strings.Replace(string(data), "IdentityFile "+e.key.Path, "IdentityFile "+keyPath, 1)
	path := filepath.Join(e.dir, "ssh_config_"+filepath.Base(keyPath))
	if err := os.WriteFile(path, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestSetAuthorizedKeysReplaces(t *testing.T) {
	e := newTestEnv(t)
	second := testenv.NewKeyFile(t, filepath.Join(e.dir, "id_second"))
	secondConf := writeConfigWithKey(t, e, second.Path)

	mustSucceed(t, "first key before replacement", e.ssh(testHost, "true"))
	if r := e.ssh("-F", secondConf, testHost, "true"); r.code != 255 {
		t.Fatalf("second key before replacement: exit %d", r.code)
	}

	e.srv.SetAuthorizedKeys([]gossh.PublicKey{second.Pub()})
	if r := e.ssh(testHost, "true"); r.code != 255 || !strings.Contains(r.stderr, "Permission denied") {
		t.Fatalf("first key after replacement: exit %d, stderr %q", r.code, r.stderr)
	}
	mustSucceed(t, "second key after replacement", e.ssh("-F", secondConf, testHost, "true"))

	e.srv.SetAuthorizedKeys(nil)
	if r := e.ssh("-F", secondConf, testHost, "true"); r.code != 255 {
		t.Fatalf("after emptying the set: exit %d", r.code)
	}
}

// newCA is a fresh ed25519 key (internal/testenv).
func newCA(t *testing.T) gossh.Signer { return testenv.NewKey(t).Signer }

func signCert(t *testing.T, ca gossh.Signer, c *gossh.Certificate) *gossh.Certificate {
	t.Helper()
	if err := c.SignCert(rand.Reader, ca); err != nil {
		t.Fatal(err)
	}
	return c
}

func TestUserCertificates(t *testing.T) {
	e := newTestEnv(t)
	ca := newCA(t)
	user := testenv.NewKeyFile(t, filepath.Join(e.dir, "id_certuser")) // not in the authorized keys
	conf := writeConfigWithKey(t, e, user.Path)
	certPath := user.Path + "-cert.pub"
	now := time.Now()
	useCert := func(c *gossh.Certificate) {
		t.Helper()
		if err := os.WriteFile(certPath, gossh.MarshalAuthorizedKey(c), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	cert := func(principals []string, after, before time.Time) *gossh.Certificate {
		return signCert(t, ca, &gossh.Certificate{
			Key:             user.Pub(),
			CertType:        gossh.UserCert,
			KeyId:           "alice@example",
			ValidPrincipals: principals,
			ValidAfter:      uint64(after.Unix()),
			ValidBefore:     uint64(before.Unix()),
			Permissions:     gossh.Permissions{Extensions: map[string]string{"permit-pty": ""}},
		})
	}
	run := func() result {
		t.Helper()
		return e.ssh("-F", conf, "-o", "CertificateFile="+certPath, testHost, "echo cert-ok")
	}

	useCert(cert([]string{"operator"}, now.Add(-time.Minute), now.Add(time.Hour)))
	if r := run(); r.code != 255 {
		t.Fatalf("certificate accepted with no trusted CAs: exit %d", r.code)
	}

	e.srv.SetTrustedUserCAs([]gossh.PublicKey{ca.PublicKey()})
	r := run()
	mustSucceed(t, "valid certificate", r)
	if r.stdout != "cert-ok\n" {
		t.Fatalf("stdout %q", r.stdout)
	}

	for name, c := range map[string]*gossh.Certificate{
		"expired":         cert([]string{"operator"}, now.Add(-2*time.Hour), now.Add(-time.Hour)),
		"not yet valid":   cert([]string{"operator"}, now.Add(time.Hour), now.Add(2*time.Hour)),
		"wrong principal": cert([]string{"someone-else"}, now.Add(-time.Minute), now.Add(time.Hour)),
		"other CA": signCert(t, newCA(t), &gossh.Certificate{
			Key: user.Pub(), CertType: gossh.UserCert, ValidBefore: gossh.CertTimeInfinity,
		}),
	} {
		useCert(c)
		if r := run(); r.code != 255 {
			t.Errorf("%s certificate: exit %d", name, r.code)
		}
	}

	// No principals means any login name, as in x/crypto and OpenSSH.
	useCert(cert(nil, now.Add(-time.Minute), now.Add(time.Hour)))
	mustSucceed(t, "certificate without principals", run())
}

func TestHostCertificate(t *testing.T) {
	e := newTestEnv(t)
	ca := newCA(t)

	if err := e.srv.AddHostCertificate(signCert(t, ca, &gossh.Certificate{
		Key: e.srv.HostSigner().PublicKey(), CertType: gossh.UserCert, ValidBefore: gossh.CertTimeInfinity,
	})); err == nil {
		t.Fatal("user certificate accepted as host certificate")
	}
	if err := e.srv.AddHostCertificate(signCert(t, ca, &gossh.Certificate{
		Key: ca.PublicKey(), CertType: gossh.HostCert, ValidBefore: gossh.CertTimeInfinity,
	})); err == nil {
		t.Fatal("certificate for another key accepted")
	}

	hostCert := signCert(t, ca, &gossh.Certificate{
		Key:             e.srv.HostSigner().PublicKey(),
		CertType:        gossh.HostCert,
		KeyId:           "node",
		ValidPrincipals: []string{"127.0.0.1", testHost},
		ValidAfter:      uint64(time.Now().Add(-time.Minute).Unix()),
		ValidBefore:     uint64(time.Now().Add(time.Hour).Unix()),
	})
	if err := e.srv.AddHostCertificate(hostCert); err != nil {
		t.Fatal(err)
	}
	// Only the CA is trusted: no trust on first use, no pinned host key.
	e.writeKnownHosts("@cert-authority * " + strings.TrimSpace(string(gossh.MarshalAuthorizedKey(ca.PublicKey()))))
	mustSucceed(t, "ssh with host certificate", e.ssh(testHost, "true"))

	// A pinned plain key still works: the plain key is still presented.
	e.writeKnownHosts(fmt.Sprintf("[127.0.0.1]:%d %s", e.port, gossh.MarshalAuthorizedKey(e.srv.HostSigner().PublicKey())))
	mustSucceed(t, "ssh with pinned host key", e.ssh(testHost, "true"))

	// An untrusted CA fails StrictHostKeyChecking.
	e.writeKnownHosts("@cert-authority * " + strings.TrimSpace(string(gossh.MarshalAuthorizedKey(newCA(t).PublicKey()))))
	if r := e.ssh(testHost, "true"); r.code != 255 {
		t.Fatalf("untrusted host CA: exit %d", r.code)
	}
}

// A known key asking for a login its roles do not grant is told why (a
// banner OpenSSH prints), and the refusal is reported for the hub's audit.
func TestLoginRefusedBanner(t *testing.T) {
	e, events := newEventEnv(t)
	e.srv.SetAuthorizedKeyLogins([]AuthorizedKey{{Key: e.key.Pub(), Logins: []string{"ubuntu", "deploy"}, Name: "alice"}})
	r := e.ssh("-o", "LogLevel=INFO", testHost, "true") // logs in as "operator"
	if r.code != 255 || !strings.Contains(r.stderr, `may not log in as "operator"`) ||
		!strings.Contains(r.stderr, "ubuntu,deploy") {
		t.Fatalf("exit %d, stderr %q", r.code, r.stderr)
	}
	// The way out it names is the role create of today: a selector with -l.
	if want := "tether role create ROLE -l SELECTOR --logins"; !strings.Contains(r.stderr, want) {
		t.Fatalf("stderr %q does not say %q", r.stderr, want)
	}
	ev, ok := events.find(EventLoginRefused)
	if !ok || ev.Login != "operator" || ev.Operator != "alice" ||
		ev.KeyFingerprint != gossh.FingerprintSHA256(e.key.Pub()) {
		t.Fatalf("event %+v, %v", ev, ok)
	}
	// An unknown key learns nothing.
	other := testenv.NewKeyFile(t, filepath.Join(e.dir, "id_other"))
	r = e.ssh("-F", writeConfigWithKey(t, e, other.Path), "-o", "LogLevel=INFO", testHost, "true")
	if r.code != 255 || strings.Contains(r.stderr, "tether:") {
		t.Fatalf("unknown key: exit %d, stderr %q", r.code, r.stderr)
	}
	// A certificate from the trusted CA without a principal for the login.
	ca := newCA(t)
	e.srv.SetTrustedUserCAs([]gossh.PublicKey{ca.PublicKey()})
	e.srv.SetCertPrincipals(map[string][]string{"ubuntu": {"tether:ops:ubuntu"}}, nil)
	user := testenv.NewKeyFile(t, filepath.Join(e.dir, "id_certuser"))
	cert := signCert(t, ca, &gossh.Certificate{Key: user.Pub(), CertType: gossh.UserCert, KeyId: "tether:operator:bob",
		ValidPrincipals: []string{"tether:ops:ubuntu"}, ValidBefore: gossh.CertTimeInfinity})
	if err := os.WriteFile(user.Path+"-cert.pub", gossh.MarshalAuthorizedKey(cert), 0o644); err != nil {
		t.Fatal(err)
	}
	r = e.ssh("-F", writeConfigWithKey(t, e, user.Path), "-o", "LogLevel=INFO", testHost, "true")
	if r.code != 255 || !strings.Contains(r.stderr, `does not allow login "operator"`) {
		t.Fatalf("certificate: exit %d, stderr %q", r.code, r.stderr)
	}
}

// gliderlabs sets NoClientAuth when it has no auth handler of its own;
// the "none" method must still be refused.
func TestNoneAuthRefused(t *testing.T) {
	e := newTestEnv(t)
	_, err := gossh.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", e.port), &gossh.ClientConfig{
		User:            "operator",
		HostKeyCallback: gossh.InsecureIgnoreHostKey(),
		Timeout:         10 * time.Second,
	})
	if err == nil || !strings.Contains(err.Error(), "unable to authenticate") {
		t.Fatalf("login without credentials: %v", err)
	}
}

// Access taken away on the hub ends live sessions: the key removed, a
// login narrowed, the key revoked. The client's stderr says why, and the
// connection is reported once however many trust changes follow while it
// winds down (the hub pushes keys and trust one after the other).
func TestTrustChangeEndsSessions(t *testing.T) {
	for _, tc := range []struct {
		name   string
		change func(e *testEnv)
		why    string
	}{
		{"key removed", func(e *testEnv) { e.srv.SetAuthorizedKeyLogins(nil) }, "is no longer accepted here"},
		{"login narrowed", func(e *testEnv) {
			e.srv.SetAuthorizedKeyLogins([]AuthorizedKey{{Key: e.key.Pub(), Logins: []string{"ubuntu"}}})
		}, `may no longer log in as "operator" here`},
		{"key revoked", func(e *testEnv) { e.srv.SetRevokedKeys([]gossh.PublicKey{e.key.Pub()}) }, "the hub revoked key"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, events := newEventEnv(t)
			// An unrelated change keeps the session.
			other := testenv.NewKey(t)
			e.srv.SetAuthorizedKeyLogins([]AuthorizedKey{{Key: e.key.Pub(), Name: "alice"}, {Key: other.Pub(), Name: "bob"}})
			cmd, pid := e.startSleeper()
			tc.change(e)
			tc.change(e)
			if err := waitExit(t, cmd); err == nil {
				t.Fatal("ssh exited 0 after its access was revoked")
			}
			testenv.WaitProcessGone(t, pid, 10*time.Second)
			stderr := cmd.Stderr.(*bytes.Buffer).String()
			if !strings.Contains(stderr, "tether: your access to this node was withdrawn (") ||
				!strings.Contains(stderr, tc.why) || !strings.Contains(stderr, "); session ended") {
				t.Errorf("ssh's stderr does not say why the session ended (%q): %q", tc.why, stderr)
			}
			ev, ok := events.find(EventAccessRevoked)
			if !ok || ev.Operator != "alice" || ev.Login != "operator" || !strings.Contains(ev.Detail, tc.why) {
				t.Errorf("access-revoked event %+v, %v", ev, ok)
			}
			if n := events.count(EventAccessRevoked); n != 1 {
				t.Errorf("%d access-revoked events for one connection, want 1", n)
			}
		})
	}
}

func (l *eventLog) count(kind EventKind) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for _, e := range l.events {
		if e.Kind == kind {
			n++
		}
	}
	return n
}

// TestScopedUserCAs: a hub above the node's site hub has its user CA
// trusted only for the principals its roles grant on this node. Its
// certificate naming a principal the node's own hub grants (but the
// ancestor did not) is refused: trusting the ancestor's CA like the node's
// own would let it through.
func TestScopedUserCAs(t *testing.T) {
	e := newTestEnv(t)
	siteCA, rootCA := newCA(t), newCA(t)
	user := testenv.NewKeyFile(t, filepath.Join(e.dir, "id_scoped"))
	conf := writeConfigWithKey(t, e, user.Path)
	login := func(ca gossh.Signer, principal string) result {
		t.Helper()
		c := signCert(t, ca, &gossh.Certificate{Key: user.Pub(), CertType: gossh.UserCert, KeyId: "tether:operator:alice",
			ValidPrincipals: []string{principal}, ValidBefore: gossh.CertTimeInfinity})
		if err := os.WriteFile(user.Path+"-cert.pub", gossh.MarshalAuthorizedKey(c), 0o600); err != nil {
			t.Fatal(err)
		}
		return e.ssh("-F", conf, "-o", "LogLevel=INFO", testHost, "true")
	}
	e.srv.SetTrustedUserCAs([]gossh.PublicKey{siteCA.PublicKey()})
	e.srv.SetCertPrincipals(map[string][]string{"operator": {"tether:admin:operator"}}, nil)
	e.srv.SetScopedUserCAs([]ScopedCA{{Keys: []gossh.PublicKey{rootCA.PublicKey()},
		PerLogin: map[string][]string{"operator": {"tether:pos:operator"}}}})

	mustSucceed(t, "site CA, site principal", login(siteCA, "tether:admin:operator"))
	mustSucceed(t, "root CA, principal the root grants here", login(rootCA, "tether:pos:operator"))
	if r := login(rootCA, "tether:admin:operator"); r.code != 255 ||
		!strings.Contains(r.stderr, "hub above this node's site") {
		t.Fatalf("root CA with a principal the root did not grant here: exit %d, stderr %q", r.code, r.stderr)
	}
	if r := login(siteCA, "tether:pos:operator"); r.code != 255 {
		t.Fatalf("site CA with the root's principal: exit %d", r.code)
	}
	e.srv.SetScopedUserCAs(nil)
	if r := login(rootCA, "tether:pos:operator"); r.code != 255 {
		t.Fatalf("root CA after its trust was withdrawn: exit %d", r.code)
	}
}
