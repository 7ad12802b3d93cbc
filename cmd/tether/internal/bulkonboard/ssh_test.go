package bulkonboard

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/rsa"
	"errors"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"
)

func newSigner(t *testing.T, rsaKey bool) ssh.Signer {
	t.Helper()
	var key any
	if rsaKey {
		k, err := rsa.GenerateKey(rand.Reader, 2048)
		if err != nil {
			t.Fatal(err)
		}
		key = k
	} else {
		_, k, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		key = k
	}
	s, err := ssh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

// serveSSH runs an SSH server on loopback with hostKeys that accepts only
// user, and returns its address. It only completes handshakes.
func serveSSH(t *testing.T, user ssh.PublicKey, hostKeys ...ssh.Signer) string {
	t.Helper()
	cfg := &ssh.ServerConfig{PublicKeyCallback: func(_ ssh.ConnMetadata, k ssh.PublicKey) (*ssh.Permissions, error) {
		if string(k.Marshal()) == string(user.Marshal()) {
			return nil, nil
		}
		return nil, errors.New("unknown key")
	}}
	for _, k := range hostKeys {
		cfg.AddHostKey(k)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				sc, chans, reqs, err := ssh.NewServerConn(c, cfg)
				if err != nil {
					return
				}
				go ssh.DiscardRequests(reqs)
				for ch := range chans {
					ch.Reject(ssh.Prohibited, "no sessions here")
				}
				sc.Close()
			}()
		}
	}()
	return ln.Addr().String()
}

func hostOf(t *testing.T, addr string) Host {
	t.Helper()
	hs, err := ParseInventory(strings.NewReader(addr))
	if err != nil {
		t.Fatal(err)
	}
	return hs[0]
}

// TestDialTrust: a host is reached only when known_hosts holds its key;
// an unknown host and a changed key fail with their sentinel and what to
// do, and known_hosts decides which host key type is asked for.
func TestDialTrust(t *testing.T) {
	client := newSigner(t, false)
	hostEd, hostRSA, other := newSigner(t, false), newSigner(t, true), newSigner(t, false)
	// The server offers RSA first; known_hosts has only its ed25519 key.
	addr := serveSSH(t, client.PublicKey(), hostRSA, hostEd)
	known := filepath.Join(t.TempDir(), "known_hosts")
	write := func(keys ...ssh.PublicKey) {
		var b strings.Builder
		for _, k := range keys {
			b.WriteString(knownhosts.Line([]string{knownhosts.Normalize(addr)}, k) + "\n")
		}
		if err := os.WriteFile(known, []byte(b.String()), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	dial := func(signer ssh.Signer) error {
		d, err := newDialer(
			SSHConfig{KnownHosts: []string{known}, Signers: []ssh.Signer{signer}, ConnectTimeout: 10 * time.Second},
		)
		if err != nil {
			t.Fatal(err)
		}
		c, err := d.dial(context.Background(), hostOf(t, addr), "root")
		if err == nil {
			c.Close()
		}
		return err
	}

	write(hostEd.PublicKey())
	if err := dial(client); err != nil {
		t.Fatalf("known ed25519 key, server preferring RSA: %v", err)
	}
	write(other.PublicKey())
	if err := dial(client); !errors.Is(err, ErrHostKeyChanged) || !strings.Contains(err.Error(), "ssh-keygen -R") {
		t.Fatalf("changed key: %v", err)
	}
	write() // empty known_hosts
	err := dial(client)
	if !errors.Is(err, ErrUnknownHost) || !strings.Contains(err.Error(), ssh.FingerprintSHA256(hostRSA.PublicKey())) &&
		!strings.Contains(err.Error(), ssh.FingerprintSHA256(hostEd.PublicKey())) {
		t.Fatalf("unknown host: %v", err)
	}
	write(hostEd.PublicKey())
	if err := dial(newSigner(t, false)); !errors.Is(err, ErrAuth) {
		t.Fatalf("refused key: %v", err)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	closed := ln.Addr().String()
	ln.Close()
	d, _ := newDialer(SSHConfig{KnownHosts: []string{known}, Signers: []ssh.Signer{client}})
	if _, err := d.dial(context.Background(), hostOf(t, closed), "root"); !errors.Is(err, ErrUnreachable) {
		t.Fatalf("closed port: %v", err)
	}
	noFile := SSHConfig{KnownHosts: []string{filepath.Join(t.TempDir(), "none")}, Signers: []ssh.Signer{client}}
	if _, err := newDialer(noFile); err == nil ||
		!strings.Contains(err.Error(), "no known_hosts file") {
		t.Fatalf("no known_hosts: %v", err)
	}
	if _, err := newDialer(SSHConfig{KnownHosts: []string{known}}); err == nil ||
		!strings.Contains(err.Error(), "no SSH key") {
		t.Fatalf("no key: %v", err)
	}
}
