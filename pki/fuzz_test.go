package pki

import (
	"bytes"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"net/url"
	"testing"
	"time"
)

// FuzzParseCerts: PEM of any content (the CA and certificate files the hub
// and agent read) parses to certificates that encode back to the same
// ones, or to an error.
func FuzzParseCerts(f *testing.F) {
	key, _ := GenerateKey()
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(7),
		Subject:      pkix.Name{CommonName: "seed"},
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, _ := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	cert, _ := x509.ParseCertificate(der)
	f.Add(EncodeCerts(cert))
	f.Add(EncodeCerts(cert, cert))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("-----BEGIN EC PRIVATE KEY-----\n-----END EC PRIVATE KEY-----\n"))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		certs, err := ParseCerts(data)
		if err != nil {
			return
		}
		if len(certs) == 0 {
			t.Fatal("no certificates and no error")
		}
		again, err := ParseCerts(EncodeCerts(certs...))
		if err != nil || len(again) != len(certs) {
			t.Fatalf("re-encoded certificates: %d, %v", len(again), err)
		}
		for i := range certs {
			if !bytes.Equal(again[i].Raw, certs[i].Raw) {
				t.Fatal("certificate changed in a round trip")
			}
		}
	})
}

// FuzzParseKey: key files of any content parse to a usable signer or an
// error.
func FuzzParseKey(f *testing.F) {
	key, _ := GenerateKey()
	pemKey, _ := EncodeKey(key)
	f.Add(pemKey)
	f.Add([]byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		k, err := ParseKey(data)
		if err != nil {
			return
		}
		if k == nil || k.Public() == nil {
			t.Fatal("nil key and no error")
		}
		if _, err := EncodeKey(k); err != nil {
			t.Fatalf("parsed key does not encode: %v", err)
		}
	})
}

// FuzzIdentityOf: a certificate with any subject and URI SANs yields an
// identity whose kind and id are well formed, or an error.
func FuzzIdentityOf(f *testing.F) {
	key, _ := GenerateKey()
	f.Add("n1", "tether://node/0123456789abcdef", "")
	f.Add("admin", "tether://admin/local-admin", "tether://node/x")
	f.Add("x", "tether://node/", "")
	f.Add("x", "spiffe://node/abc", "")
	f.Add("x", "tether://../../etc", "")
	f.Fuzz(func(t *testing.T, cn, uri1, uri2 string) {
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(1),
			Subject:      pkix.Name{CommonName: cn},
			NotAfter:     time.Now().Add(time.Hour),
		}
		for _, s := range []string{uri1, uri2} {
			if u, err := url.Parse(s); err == nil && s != "" {
				tmpl.URIs = append(tmpl.URIs, u)
			}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
		if err != nil {
			return
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			return
		}
		id, err := IdentityOf(cert)
		if err != nil {
			return
		}
		if id.Kind == "" || id.ID == "" {
			t.Fatalf("empty identity from %v: %+v", tmpl.URIs, id)
		}
	})
}
