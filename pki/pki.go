// Package pki holds the certificate and token primitives that both the hub and
// the edge agent need: key and CSR generation, PEM files, the join string, the
// CA pin check and the identities encoded in Tether certificates.
//
// Signing lives in pki/ca, which only the hub links: the agent binary must not
// carry CA code (the import rules in docs/design/layout.md).
package pki

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
)

// This package is linked into the agent, so it uses the standard library
// only: smallstep's helpers (which pull in text/template, sprig and JOSE)
// stay in pki/ca, which only the hub links.

// HubServerName is the DNS name every hub serving certificate carries and every
// client verifies. Trust comes from the private Tether CA (pinned at join),
// so a fixed name keeps verification independent of NAT and advertised
// addresses; only hubs are ever issued this name.
const HubServerName = "hub.tether.internal"

// ErrNotFound is returned when an expected key or certificate file is missing.
var ErrNotFound = errors.New("pki: file not found")

// GenerateKey makes a new ECDSA P-256 key, the default for every Tether identity.
func GenerateKey() (crypto.Signer, error) {
	s, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("pki: generate key: %w", err)
	}
	return s, nil
}

// NewCSR returns a DER certificate request for commonName signed by key.
func NewCSR(key crypto.Signer, commonName string) ([]byte, error) {
	csr, err := x509.CreateCertificateRequest(
		rand.Reader, &x509.CertificateRequest{Subject: pkix.Name{CommonName: commonName}}, key,
	)
	if err != nil {
		return nil, fmt.Errorf("pki: create CSR for %q: %w", commonName, err)
	}
	return csr, nil
}

// EncodeKey returns key as a PKCS#8 PEM block.
func EncodeKey(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("pki: encode key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// ParseKey parses a PEM private key: PKCS#8 ("PRIVATE KEY", what EncodeKey
// writes), SEC 1 ("EC PRIVATE KEY") or PKCS#1 ("RSA PRIVATE KEY").
func ParseKey(data []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(data)
	if block == nil {
		return nil, errors.New("pki: parse key: no PEM block found")
	}
	var k any
	var err error
	switch block.Type {
	case "PRIVATE KEY":
		k, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	case "EC PRIVATE KEY":
		k, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		k, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default:
		return nil, fmt.Errorf(
			"pki: parse key: PEM block %q is not a private key (want PRIVATE KEY, EC PRIVATE KEY or RSA PRIVATE KEY)",
			block.Type,
		)
	}
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

// ParseCerts parses one or more PEM certificates (blocks of other types are
// skipped), or one DER certificate; it fails on an empty bundle.
func ParseCerts(data []byte) ([]*x509.Certificate, error) {
	if !bytes.Contains(data, []byte("-----BEGIN ")) {
		c, err := x509.ParseCertificate(data)
		if err != nil {
			return nil, fmt.Errorf("pki: parse certificates: neither PEM nor DER: %w", err)
		}
		return []*x509.Certificate{c}, nil
	}
	var certs []*x509.Certificate
	for len(data) > 0 {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" || len(block.Headers) != 0 {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, fmt.Errorf("pki: parse certificates: %w", err)
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("pki: parse certificates: no certificate in PEM data")
	}
	return certs, nil
}

// Fingerprint returns the lowercase hex SHA-256 of the certificate's DER bytes,
// the same value `step certificate fingerprint` prints.
func Fingerprint(cert *x509.Certificate) string {
	sum := sha256.Sum256(cert.Raw)
	return hex.EncodeToString(sum[:])
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
