package ca

import (
	"crypto/ed25519"
	"crypto/rand"
	"net"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func testKey(t *testing.T) ssh.PublicKey {
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
