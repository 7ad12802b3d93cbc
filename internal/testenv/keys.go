package testenv

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/crypto/ssh"
)

// Key is an ed25519 key pair, as a signer and (if written) an OpenSSH
// private key file with its .pub beside it.
type Key struct {
	Signer ssh.Signer
	Priv   ed25519.PrivateKey
	Path   string // private key file (mode 0600); "" if not written
}

// Pub is the public key.
func (k *Key) Pub() ssh.PublicKey { return k.Signer.PublicKey() }

// GenerateKey makes a key pair in memory.
func GenerateKey() (*Key, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("testenv: generate ed25519 key: %w", err)
	}
	s, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, fmt.Errorf("testenv: ssh signer: %w", err)
	}
	return &Key{Signer: s, Priv: priv}, nil
}

// WriteKey makes a key pair and writes path (OpenSSH private key, 0600)
// and path.pub, creating the directory.
func WriteKey(path string) (*Key, error) {
	k, err := GenerateKey()
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(k.Priv, filepath.Base(path))
	if err != nil {
		return nil, fmt.Errorf("testenv: marshal key for %s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, fmt.Errorf("testenv: key directory: %w", err)
	}
	if err := os.WriteFile(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, fmt.Errorf("testenv: write key: %w", err)
	}
	if err := os.WriteFile(path+".pub", ssh.MarshalAuthorizedKey(k.Pub()), 0o644); err != nil {
		return nil, fmt.Errorf("testenv: write public key: %w", err)
	}
	k.Path = path
	return k, nil
}

// NewKey is GenerateKey for tests.
func NewKey(t T) *Key {
	t.Helper()
	k, err := GenerateKey()
	if err != nil {
		t.Fatalf("%v", err)
	}
	return k
}

// NewKeyFile is WriteKey for tests.
func NewKeyFile(t T, path string) *Key {
	t.Helper()
	k, err := WriteKey(path)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return k
}

// CertOpts shapes a certificate from SignCert.
type CertOpts struct {
	Principals []string
	// ValidAfter and ValidBefore default to an hour around now.
	ValidAfter, ValidBefore time.Time
	KeyID                   string // default "test"
}

// Expired is a validity window that ended an hour ago.
func Expired() (after, before time.Time) {
	now := time.Now()
	return now.Add(-2 * time.Hour), now.Add(-time.Hour)
}

// SignCert certifies pub with ca as a user (ssh.UserCert, with permit-pty)
// or host (ssh.HostCert) certificate.
func SignCert(t T, ca *Key, pub ssh.PublicKey, typ uint32, o CertOpts) *ssh.Certificate {
	t.Helper()
	now := time.Now()
	if o.ValidAfter.IsZero() {
		o.ValidAfter = now.Add(-time.Hour)
	}
	if o.ValidBefore.IsZero() {
		o.ValidBefore = now.Add(time.Hour)
	}
	if o.KeyID == "" {
		o.KeyID = "test"
	}
	c := &ssh.Certificate{
		Key:             pub,
		Serial:          uint64(now.UnixNano()),
		CertType:        typ,
		KeyId:           o.KeyID,
		ValidPrincipals: o.Principals,
		ValidAfter:      uint64(o.ValidAfter.Unix()),
		ValidBefore:     uint64(o.ValidBefore.Unix()),
	}
	if typ == ssh.UserCert {
		c.Permissions.Extensions = map[string]string{"permit-pty": ""}
	}
	if err := c.SignCert(rand.Reader, ca.Signer); err != nil {
		t.Fatalf("testenv: sign certificate: %v", err)
	}
	return c
}

// WriteFile writes path (creating its directory) or fails the test.
func WriteFile(t T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatalf("testenv: %v", err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatalf("testenv: %v", err)
	}
}
