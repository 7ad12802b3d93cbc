// Package pki holds the certificate and token primitives that both the hub and
// the edge agent need: key and CSR generation, PEM files, the join string, the
// CA pin check and the identities encoded in Tether certificates.
//
// Signing lives in pki/ca, which only the hub links: the agent binary must not
// carry CA code (the import rules in docs/architecture.md).
package pki

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"go.step.sm/crypto/keyutil"
	"go.step.sm/crypto/pemutil"
	"go.step.sm/crypto/x509util"
)

// HubServerName is the DNS name every hub serving certificate carries and every
// client verifies. Trust comes from the private Tether CA (pinned at join),
// so a fixed name keeps verification independent of NAT and advertised
// addresses; only hubs are ever issued this name.
const HubServerName = "hub.tether.internal"

// ErrNotFound is returned when an expected key or certificate file is missing.
var ErrNotFound = errors.New("pki: file not found")

// GenerateKey makes a new ECDSA P-256 key, the default for every Tether identity.
func GenerateKey() (crypto.Signer, error) {
	s, err := keyutil.GenerateSigner("EC", "P-256", 0)
	if err != nil {
		return nil, fmt.Errorf("pki: generate key: %w", err)
	}
	return s, nil
}

// NewCSR returns a DER certificate request for commonName signed by key.
func NewCSR(key crypto.Signer, commonName string) ([]byte, error) {
	csr, err := x509util.CreateCertificateRequest(commonName, nil, key)
	if err != nil {
		return nil, fmt.Errorf("pki: create CSR for %q: %w", commonName, err)
	}
	return csr.Raw, nil
}

// EncodeKey returns key as a PKCS#8 PEM block.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	block, err := pemutil.Serialize(key, pemutil.WithPKCS8(true))
	if err != nil {
		return nil, fmt.Errorf("pki: encode key: %w", err)
	}
	return pem.EncodeToMemory(block), nil
}

// ParseKey parses a PEM private key.
func ParseKey(data []byte) (crypto.Signer, error) {
	k, err := pemutil.ParseKey(data)
	if err != nil {
		return nil, fmt.Errorf("pki: parse key: %w", err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("pki: parse key: %T is not a signing key", k)
	}
	return s, nil
}

// EncodeCerts returns certificates as concatenated PEM blocks.
func EncodeCerts(certs ...*x509.Certificate) []byte {
	var out []byte
	for _, c := range certs {
		out = append(out, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})...)
	}
	return out
}

// ParseCerts parses one or more PEM certificates; it fails on an empty bundle.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	certs, err := pemutil.ParseCertificateBundle(data)
	if err != nil {
		return nil, fmt.Errorf("pki: parse certificates: %w", err)
	}
	if len(certs) == 0 {
		return nil, errors.New("pki: parse certificates: no certificate in PEM data")
	}
	return certs, nil
}

// Fingerprint returns the lowercase hex SHA-256 of the certificate's DER bytes,
// the same value `step certificate fingerprint` prints.
func Fingerprint(cert *x509.Certificate) string {
	return x509util.Fingerprint(cert)
}

// WriteFileAtomic writes data to path so that a crash leaves either the old or
// the new content, never a torn file: temp file in the same directory, fsync,
// rename, fsync of the directory.
func WriteFileAtomic(path string, data []byte, perm os.FileMode) error {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	tmp := f.Name()
	defer os.Remove(tmp) // no-op after a successful rename
	if err := f.Chmod(perm); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	if d, err := os.Open(dir); err == nil {
		_ = d.Sync()
		d.Close()
	}
	return nil
}

// ReadFile reads a key or certificate file, mapping a missing file to ErrNotFound.
func ReadFile(path string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, path)
	}
	return b, err
}
