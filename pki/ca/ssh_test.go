package ca

import (
	"bytes"
	"crypto/ed25519"
	"crypto/rand"
	"maps"
	"net"
	"slices"
	"testing"
	"time"

	"go.step.sm/crypto/sshutil"
	"golang.org/x/crypto/ssh"
)

func testKey(t testing.TB) ssh.PublicKey {
	pub, _, _ := ed25519.GenerateKey(rand.Reader)
	k, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func TestSSHCASignsAndVerifies(t *testing.T) {
	dir := t.TempDir()
	host, err := LoadOrCreateSSH(dir, SSHHostCAFile)
	if err != nil {
		t.Fatal(err)
	}
	user, _ := LoadOrCreateSSH(dir, SSHUserCAFile)
	if string(host.PublicKey().Marshal()) == string(user.PublicKey().Marshal()) {
		t.Fatal("host and user CA share a key")
	}
	again, _ := LoadOrCreateSSH(dir, SSHHostCAFile)
	if string(again.PublicKey().Marshal()) != string(host.PublicKey().Marshal()) {
		t.Fatal("host CA key not persisted")
	}
	hostCert, err := host.SignHost(testKey(t), "node n1", []string{"n1", "n1.tether"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	checker := &ssh.CertChecker{IsHostAuthority: func(auth ssh.PublicKey, _ string) bool {
		return string(auth.Marshal()) == string(host.PublicKey().Marshal())
	}}
	addr := &net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 22}
	if err := checker.CheckHostKey("n1.tether:22", addr, hostCert); err != nil {
		t.Fatalf("host cert for n1.tether: %v", err)
	}
	if err := checker.CheckHostKey("n2:22", addr, hostCert); err == nil {
		t.Fatal("host cert accepted for another host name")
	}
	userCert, err := user.SignUser(testKey(t), "alice", []string{"root"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if userCert.CertType != ssh.UserCert || hostCert.CertType != ssh.HostCert {
		t.Fatal("wrong certificate types")
	}
	if err := checker.CheckHostKey("n1:22", addr, userCert); err == nil {
		t.Fatal("user cert accepted as host cert")
	}
	if _, err := host.SignHost(hostCert, "x", []string{"n1"}, time.Hour); err == nil {
		t.Fatal("certified a certificate")
	}
	if _, err := host.SignHost(testKey(t), "x", nil, time.Hour); err == nil {
		t.Fatal("signed a certificate without principals")
	}
}

func TestSSHCARotation(t *testing.T) {
	dir := t.TempDir()
	old, _ := LoadOrCreateSSH(dir, SSHUserCAFile)
	if err := RotateSSH(dir, SSHUserCAFile); err != nil {
		t.Fatal(err)
	}
	rotated, err := LoadOrCreateSSH(dir, SSHUserCAFile)
	if err != nil {
		t.Fatal(err)
	}
	trusted := rotated.TrustedKeys()
	if len(trusted) != 2 || string(trusted[1].Marshal()) != string(old.PublicKey().Marshal()) ||
		string(trusted[0].Marshal()) == string(old.PublicKey().Marshal()) {
		t.Fatalf("during overlap want [new, old], got %d keys", len(trusted))
	}
	if err := FinishSSHRotation(dir, SSHUserCAFile); err != nil {
		t.Fatal(err)
	}
	done, _ := LoadOrCreateSSH(dir, SSHUserCAFile)
	if len(done.TrustedKeys()) != 1 || string(done.PublicKey().Marshal()) != string(rotated.PublicKey().Marshal()) {
		t.Fatal("after finishing, only the new key should be trusted")
	}
}

// TestSSHCertMatchesTemplate: the certificates the CA builds directly carry
// what smallstep's template for them renders (type, key id, principals,
// extensions, critical options, key), for both kinds; only nonce, serial,
// validity and signature are per signature.
func TestSSHCertMatchesTemplate(t *testing.T) {
	const template = `{
	"type": {{ toJson .Type }},
	"keyId": {{ toJson .KeyID }},
	"principals": {{ toJson .Principals }},
	"extensions": {{ toJson .Extensions }}
}`
	ca, err := LoadOrCreateSSH(t.TempDir(), SSHHostCAFile)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		ct         sshutil.CertType
		keyID      string
		principals []string
	}{
		{sshutil.HostCert, "node n1 0123", []string{"n1", "n1.tether", "n1.eu.fra", "n1.eu.fra.tether"}},
		{sshutil.UserCert, "operator alice", []string{"root", "alice"}},
	} {
		key := testKey(t)
		want, err := sshutil.NewCertificate(sshutil.CertificateRequest{Key: key},
			sshutil.WithTemplate(template, sshutil.CreateTemplateData(tc.ct, tc.keyID, tc.principals)))
		if err != nil {
			t.Fatal(err)
		}
		w := want.GetCertificate()
		got, err := ca.sign(tc.ct, key, tc.keyID, tc.principals, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		if got.CertType != w.CertType || got.KeyId != w.KeyId || !slices.Equal(got.ValidPrincipals, w.ValidPrincipals) ||
			!maps.Equal(got.Extensions, w.Extensions) || !maps.Equal(got.CriticalOptions, w.CriticalOptions) ||
			!bytes.Equal(got.Key.Marshal(), w.Key.Marshal()) {
			t.Errorf(
				"%v certificate differs from the template's:\n got type %d id %q principals %q ext %v crit %v\n"+
					"want type %d id %q principals %q ext %v crit %v",
				tc.ct, got.CertType, got.KeyId, got.ValidPrincipals, got.Extensions, got.CriticalOptions, w.CertType,
				w.KeyId, w.ValidPrincipals, w.Extensions, w.CriticalOptions,
			)
		}
		if tc.ct == sshutil.UserCert && len(got.Extensions) == 0 {
			t.Error("user certificate without the default permit-* extensions")
		}
	}
}

// BenchmarkSignHost is what a reconnecting node's host certificate costs
// the hub.
func BenchmarkSignHost(b *testing.B) {
	ca, err := LoadOrCreateSSH(b.TempDir(), SSHHostCAFile)
	if err != nil {
		b.Fatal(err)
	}
	key := testKey(b)
	for b.Loop() {
		if _, err := ca.SignHost(key, "node n1 0123", []string{"n1", "n1.tether"}, time.Hour); err != nil {
			b.Fatal(err)
		}
	}
}
