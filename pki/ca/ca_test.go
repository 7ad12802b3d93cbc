package ca

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-dev/tether/pki"
)

func TestLoadOrCreatePersists(t *testing.T) {
	dir := t.TempDir()
	a, err := LoadOrCreate(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	b, err := LoadOrCreate(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	if a.Pin() != b.Pin() {
		t.Fatal("reloaded CA has a different pin")
	}
	st, err := os.Stat(filepath.Join(dir, KeyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("key mode = %v, %v; want 0600", st.Mode().Perm(), err)
	}
	if !a.Certificate().IsCA {
		t.Fatal("root is not a CA")
	}
}

func TestLoadOrCreateRefusesHalfCA(t *testing.T) {
	dir := t.TempDir()
	if _, err := LoadOrCreate(dir, "test"); err != nil {
		t.Fatal(err)
	}
	os.Remove(filepath.Join(dir, CertFile))
	if _, err := LoadOrCreate(dir, "test"); err == nil {
		t.Fatal("CA with missing cert was silently replaced")
	}
	os.WriteFile(filepath.Join(dir, CertFile), []byte("garbage"), 0o644)
	if _, err := LoadOrCreate(dir, "test"); err == nil {
		t.Fatal("garbage cert accepted")
	}
}

func TestSignCSRIgnoresRequestedIdentity(t *testing.T) {
	c, err := LoadOrCreate(t.TempDir(), "test")
	if err != nil {
		t.Fatal(err)
	}
	key, _ := pki.GenerateKey()
	// A CSR that asks for the hub's name must not get it.
	csr, err := pki.NewCSR(key, pki.HubServerName)
	if err != nil {
		t.Fatal(err)
	}
	want := pki.Identity{Kind: pki.KindNode, ID: "abc123"}
	cert, err := c.SignCSR(csr, want, "n1", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	got, err := c.Verify(cert)
	if err != nil || got != want {
		t.Fatalf("Verify = %v, %v; want %v", got, err, want)
	}
	if len(cert.DNSNames) != 0 {
		t.Fatalf("node cert has DNS names %v", cert.DNSNames)
	}
	if _, err := cert.Verify(x509.VerifyOptions{
		Roots: c.Pool(), DNSName: pki.HubServerName, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}); err == nil {
		t.Fatal("node certificate verifies as a hub server certificate")
	}
	if _, err := c.SignCSR([]byte("junk"), want, "n1", time.Hour); err == nil {
		t.Fatal("junk CSR signed")
	}
}

func TestForeignCertRefused(t *testing.T) {
	c1, _ := LoadOrCreate(t.TempDir(), "one")
	c2, _ := LoadOrCreate(t.TempDir(), "two")
	cert, _, err := c2.IssueKeyPair(pki.Identity{Kind: pki.KindAdmin, ID: "admin"}, "admin", time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Verify(cert.Leaf); err == nil {
		t.Fatal("certificate from a foreign CA verified")
	}
}

// TestPinnedHandshake runs a real TLS handshake on loopback: the right pin
// connects and reports the CA; a wrong pin is refused.
func TestPinnedHandshake(t *testing.T) {
	c, _ := LoadOrCreate(t.TempDir(), "test")
	other, _ := LoadOrCreate(t.TempDir(), "other")
	srvCert, err := c.IssueHubServer("hub", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := tls.Listen(
		"tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{srvCert}, MinVersion: tls.VersionTLS13},
	)
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { _ = conn.(*tls.Conn).Handshake(); io.Copy(io.Discard, conn); conn.Close() }()
		}
	}()
	for _, tc := range []struct {
		name string
		pin  string
		ok   bool
	}{{"right pin", c.Pin(), true}, {"other CA's pin", other.Pin(), false}} {
		t.Run(tc.name, func(t *testing.T) {
			var got *x509.Certificate
			cfg, err := pki.PinnedTLSConfig(tc.pin, func(ca *x509.Certificate) { got = ca })
			if err != nil {
				t.Fatal(err)
			}
			conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", ln.Addr().String(), cfg)
			if tc.ok {
				if err != nil {
					t.Fatalf("handshake: %v", err)
				}
				conn.Close()
				if got == nil || pki.Fingerprint(got) != c.Pin() {
					t.Fatal("pinned CA not reported")
				}
				return
			}
			if err == nil {
				conn.Close()
				t.Fatal("handshake with wrong pin succeeded")
			}
			if !errors.Is(err, pki.ErrPinMismatch) {
				t.Logf("error: %v", err)
			}
		})
	}
}
