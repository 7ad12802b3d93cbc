package nodeconn

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"math/big"
	"testing"
	"time"
)

// testCA is a certificate and its key, for building chains.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

var testSerial int64

// issueTestCert signs tmpl with parent (nil: self-signed).
func issueTestCert(t testing.TB, tmpl *x509.Certificate, parent *testCA) *testCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	testSerial++
	tmpl.SerialNumber = big.NewInt(testSerial)
	signer, signKey := tmpl, key
	if parent != nil {
		signer, signKey = parent.cert, parent.key
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, signer, &key.PublicKey, signKey)
	if err != nil {
		t.Fatal(err)
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatal(err)
	}
	return &testCA{cert: c, key: key}
}

func caTemplate(name string, from, until time.Time) *x509.Certificate {
	return &x509.Certificate{Subject: pkix.Name{CommonName: name}, NotBefore: from, NotAfter: until,
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
}

func leafTemplate(name string, from, until time.Time, eku ...x509.ExtKeyUsage) *x509.Certificate {
	return &x509.Certificate{Subject: pkix.Name{CommonName: name}, NotBefore: from, NotAfter: until,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: eku}
}

// TestIssuerAnchorsAgreeWithFullVerification: the one-signature shortcut for
// node chains accepts exactly what crypto/x509's full verification accepts
// (it may decline more, which then goes the full way), and it remembers only
// issuers that verified up to a root.
func TestIssuerAnchorsAgreeWithFullVerification(t *testing.T) {
	now := time.Now()
	later := now.Add(2 * time.Hour)
	year := 365 * 24 * time.Hour
	root := issueTestCert(t, caTemplate("root", now.Add(-time.Hour), now.Add(10*year)), nil)
	inter := issueTestCert(t, caTemplate("intermediate", now.Add(-time.Hour), now.Add(5*year)), root)
	// Same name as inter, another key: what a forger would send.
	forged := issueTestCert(t, caTemplate("intermediate", now.Add(-time.Hour), now.Add(5*year)), nil)
	otherRoot := issueTestCert(t, caTemplate("other root", now.Add(-time.Hour), now.Add(10*year)), nil)
	otherInter := issueTestCert(t, caTemplate("other intermediate", now.Add(-time.Hour), now.Add(5*year)), otherRoot)
	shortInter := issueTestCert(t, caTemplate("short-lived intermediate", now.Add(-time.Hour), now.Add(time.Hour)), root)
	// A root that expires before the issuer it signed: the issuer's chain
	// ends with it.
	shortRoot := issueTestCert(t, caTemplate("short-lived root", now.Add(-time.Hour), now.Add(time.Hour)), nil)
	underShortRoot := issueTestCert(
		t,
		caTemplate("intermediate under a short-lived root", now.Add(-time.Hour), now.Add(5*year)),
		shortRoot,
	)
	serverOnlyInter := issueTestCert(t, &x509.Certificate{Subject: pkix.Name{CommonName: "server-only intermediate"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(5 * year), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}, root)

	// leaf issues a node certificate valid from..until under issuer.
	leaf := func(name string, from, until time.Time, eku x509.ExtKeyUsage, issuer *testCA) *testCA {
		return issueTestCert(t, leafTemplate(name, from, until, eku), issuer)
	}
	client, server := x509.ExtKeyUsageClientAuth, x509.ExtKeyUsageServerAuth
	good := leaf("node-1", now.Add(-time.Minute), now.Add(24*time.Hour), client, inter)
	expired := leaf("node-2", now.Add(-48*time.Hour), now.Add(-24*time.Hour), client, inter)
	serverOnly := leaf("node-3", now.Add(-time.Minute), now.Add(24*time.Hour), server, inter)
	byForged := leaf("node-4", now.Add(-time.Minute), now.Add(24*time.Hour), client, forged)
	byOther := leaf("node-5", now.Add(-time.Minute), now.Add(24*time.Hour), client, otherInter)
	byShort := leaf("node-6", now.Add(-time.Minute), now.Add(24*time.Hour), client, shortInter)
	byUnderShortRoot := leaf("node-8", now.Add(-time.Minute), now.Add(24*time.Hour), client, underShortRoot)
	byServerOnly := leaf("node-7", now.Add(-time.Minute), now.Add(24*time.Hour), client, serverOnlyInter)

	roots := x509.NewCertPool()
	roots.AddCert(root.cert)
	roots.AddCert(shortRoot.cert)
	anchors := &issuerAnchors{roots: roots, byRaw: make(map[[32]byte]issuerAnchor)}

	for _, tc := range []struct {
		name     string
		chain    []*x509.Certificate
		at       time.Time
		shortcut bool // the shortcut accepts it (then the full verification must too)
	}{
		{"good chain", []*x509.Certificate{good.cert, inter.cert}, now, true},
		{"good chain again (remembered issuer)", []*x509.Certificate{good.cert, inter.cert}, now, true},
		{"expired leaf", []*x509.Certificate{expired.cert, inter.cert}, now, false},
		{"leaf for servers only", []*x509.Certificate{serverOnly.cert, inter.cert}, now, false},
		{"leaf signed by a forged issuer of the same name", []*x509.Certificate{byForged.cert, inter.cert}, now, false},
		{"forged issuer sent along", []*x509.Certificate{byForged.cert, forged.cert}, now, false},
		{"another CA's chain", []*x509.Certificate{byOther.cert, otherInter.cert}, now, false},
		{"issuer that limits itself to servers", []*x509.Certificate{byServerOnly.cert, serverOnlyInter.cert}, now, false},
		{"issuer valid now", []*x509.Certificate{byShort.cert, shortInter.cert}, now, true},
		{"the same issuer after it expired", []*x509.Certificate{byShort.cert, shortInter.cert}, later, false},
		{"issuer whose root is valid now", []*x509.Certificate{byUnderShortRoot.cert, underShortRoot.cert}, now, true},
		{"the same issuer after its root expired",
			[]*x509.Certificate{byUnderShortRoot.cert, underShortRoot.cert}, later, false},
		{"leaf alone", []*x509.Certificate{good.cert}, now, false},
		{"leaf, issuer and root", []*x509.Certificate{good.cert, inter.cert, root.cert}, now, false},
		{"issuer that is not a CA", []*x509.Certificate{good.cert, good.cert}, now, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := anchors.verify(tc.chain, tc.at)
			if got != tc.shortcut {
				t.Fatalf("shortcut accepted %v, want %v", got, tc.shortcut)
			}
			opts := x509.VerifyOptions{
				Roots:         roots,
				Intermediates: x509.NewCertPool(),
				KeyUsages:     clientAuth,
				CurrentTime:   tc.at,
			}
			for _, c := range tc.chain[1:] {
				opts.Intermediates.AddCert(c)
			}
			if _, err := tc.chain[0].Verify(opts); got && err != nil {
				t.Fatalf("the shortcut accepted a chain the full verification refuses: %v", err)
			}
		})
	}
	if n := len(anchors.byRaw); n != 3 { // inter, shortInter, underShortRoot
		t.Errorf("%d issuers remembered, want 3 (only those that verified up to a root)", n)
	}
}

// BenchmarkVerifyNodeChain: a node's chain through the full verification
// (two signatures) and through a remembered issuer (one).
func BenchmarkVerifyNodeChain(b *testing.B) {
	now := time.Now()
	root := issueTestCert(b, caTemplate("root", now.Add(-time.Hour), now.Add(time.Hour*24*365)), nil)
	inter := issueTestCert(b, caTemplate("intermediate", now.Add(-time.Hour), now.Add(time.Hour*24*365)), root)
	leaf := issueTestCert(
		b,
		leafTemplate("node", now.Add(-time.Minute), now.Add(time.Hour), x509.ExtKeyUsageClientAuth),
		inter,
	)
	roots := x509.NewCertPool()
	roots.AddCert(root.cert)
	chain := []*x509.Certificate{leaf.cert, inter.cert}
	b.Run("full", func(b *testing.B) {
		for b.Loop() {
			opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(), KeyUsages: clientAuth}
			opts.Intermediates.AddCert(inter.cert)
			if _, err := leaf.cert.Verify(opts); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("remembered-issuer", func(b *testing.B) {
		anchors := &issuerAnchors{roots: roots, byRaw: make(map[[32]byte]issuerAnchor)}
		for b.Loop() {
			if !anchors.verify(chain, time.Now()) {
				b.Fatal("refused")
			}
		}
	})
}
