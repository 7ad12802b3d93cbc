// Package ca is the hub's certificate authority: it creates or loads the root
// CA in the hub data dir and signs hub, node and admin certificates with
// smallstep's x509util templates. Only the hub links this package.
package ca

import (
	"crypto"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"go.step.sm/crypto/x509util"

	"github.com/tether-dev/tether/pki"
)

// File names inside the CA directory. The root (whose SHA-256 is the join
// pin) only signs the intermediate; the intermediate signs every leaf, so the
// root key is touched once per intermediate, not per node.
const (
	CertFile             = "ca.crt"
	KeyFile              = "ca.key"
	IntermediateCertFile = "intermediate.crt"
	IntermediateKeyFile  = "intermediate.key"
)

// DefaultNodeTTL is how long a node certificate is valid; agents renew over
// the control stream at about two thirds of it.
const DefaultNodeTTL = 24 * time.Hour

// clockSkew backdates NotBefore so a node whose clock runs a little behind the
// hub still accepts fresh certificates.
const clockSkew = 5 * time.Minute

// CA signs Tether certificates: a root and the intermediate it certified.
type CA struct {
	root *x509.Certificate
	cert *x509.Certificate // intermediate: signs leaves
	key  crypto.Signer     // intermediate key
}

// LoadOrCreate loads the CA from dir, creating a new root (10 years) and
// intermediate (5 years) the first time. Keys are written 0600.
func LoadOrCreate(dir, name string) (*CA, error) {
	root, rootKey, err := loadOrCreatePair(dir, CertFile, KeyFile, func() (*x509.Certificate, crypto.Signer, error) {
		return newRoot(name)
	})
	if err != nil {
		return nil, err
	}
	inter, interKey, err := loadOrCreatePair(
		dir,
		IntermediateCertFile,
		IntermediateKeyFile,
		func() (*x509.Certificate, crypto.Signer, error) {
			return newIntermediate(name, root, rootKey)
		},
	)
	if err != nil {
		return nil, err
	}
	if err := inter.CheckSignatureFrom(root); err != nil {
		return nil, fmt.Errorf(
			"ca: %s was not signed by %s: %w",
			filepath.Join(dir, IntermediateCertFile), filepath.Join(dir, CertFile), err,
		)
	}
	return &CA{root: root, cert: inter, key: interKey}, nil
}

func loadOrCreatePair(
	dir, certFile, keyFile string, create func() (*x509.Certificate, crypto.Signer, error),
) (*x509.Certificate, crypto.Signer, error) {
	certPath, keyPath := filepath.Join(dir, certFile), filepath.Join(dir, keyFile)
	certPEM, certErr := pki.ReadFile(certPath)
	keyPEM, keyErr := pki.ReadFile(keyPath)
	switch {
	case certErr == nil && keyErr == nil:
		return load(certPEM, keyPEM, certPath, keyPath)
	case errors.Is(certErr, pki.ErrNotFound) && errors.Is(keyErr, pki.ErrNotFound):
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return nil, nil, fmt.Errorf("ca: %w", err)
		}
		cert, key, err := create()
		if err != nil {
			return nil, nil, err
		}
		keyPEM, err := pki.EncodeKey(key)
		if err != nil {
			return nil, nil, err
		}
		// Key first: a crash between the writes leaves a key without cert,
		// which is reported instead of silently minting a second CA.
		if err := pki.WriteFileAtomic(keyPath, keyPEM, 0o600); err != nil {
			return nil, nil, fmt.Errorf("ca: %w", err)
		}
		if err := pki.WriteFileAtomic(certPath, pki.EncodeCerts(cert), 0o644); err != nil {
			return nil, nil, fmt.Errorf("ca: %w", err)
		}
		return cert, key, nil
	case certErr != nil && !errors.Is(certErr, pki.ErrNotFound):
		return nil, nil, fmt.Errorf("ca: %w", certErr)
	case keyErr != nil && !errors.Is(keyErr, pki.ErrNotFound):
		return nil, nil, fmt.Errorf("ca: %w", keyErr)
	default:
		return nil, nil, fmt.Errorf(
			"ca: only one of %s and %s exists; restore the missing file from backup (creating a new CA would lock "+
				"out every joined node)",
			certPath, keyPath,
		)
	}
}

func load(certPEM, keyPEM []byte, certPath, keyPath string) (*x509.Certificate, crypto.Signer, error) {
	certs, err := pki.ParseCerts(certPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("ca: %s: %w", certPath, err)
	}
	key, err := pki.ParseKey(keyPEM)
	if err != nil {
		return nil, nil, fmt.Errorf("ca: %s: %w", keyPath, err)
	}
	if !certs[0].IsCA {
		return nil, nil, fmt.Errorf("ca: %s is not a CA certificate", certPath)
	}
	if err := checkPair(certs[0], key); err != nil {
		return nil, nil, fmt.Errorf("ca: %s does not match %s: %w", keyPath, certPath, err)
	}
	return certs[0], key, nil
}

func checkPair(cert *x509.Certificate, key crypto.Signer) error {
	type equaler interface{ Equal(crypto.PublicKey) bool }
	if pk, ok := key.Public().(equaler); !ok || !pk.Equal(cert.PublicKey) {
		return errors.New("public keys differ")
	}
	return nil
}

func newRoot(name string) (*x509.Certificate, crypto.Signer, error) {
	key, err := pki.GenerateKey()
	if err != nil {
		return nil, nil, err
	}
	data := x509util.NewTemplateData()
	data.SetSubject(x509util.Subject{CommonName: name + " Root CA", Organization: []string{"Tether"}})
	tmpl, err := x509util.NewCertificateFromX509(&x509.Certificate{PublicKey: key.Public()},
		x509util.WithTemplate(x509util.DefaultRootTemplate, data))
	if err != nil {
		return nil, nil, fmt.Errorf("ca: root template: %w", err)
	}
	x := tmpl.GetCertificate()
	now := time.Now()
	x.NotBefore, x.NotAfter = now.Add(-clockSkew), now.Add(10*365*24*time.Hour)
	cert, err := x509util.CreateCertificate(x, x, key.Public(), key)
	if err != nil {
		return nil, nil, fmt.Errorf("ca: sign root: %w", err)
	}
	return cert, key, nil
}

func newIntermediate(
	name string, root *x509.Certificate, rootKey crypto.Signer,
) (*x509.Certificate, crypto.Signer, error) {
	key, err := pki.GenerateKey()
	if err != nil {
		return nil, nil, err
	}
	data := x509util.NewTemplateData()
	data.SetSubject(x509util.Subject{CommonName: name + " Intermediate CA", Organization: []string{"Tether"}})
	tmpl, err := x509util.NewCertificateFromX509(&x509.Certificate{PublicKey: key.Public()},
		x509util.WithTemplate(x509util.DefaultIntermediateTemplate, data))
	if err != nil {
		return nil, nil, fmt.Errorf("ca: intermediate template: %w", err)
	}
	x := tmpl.GetCertificate()
	now := time.Now()
	x.NotBefore, x.NotAfter = now.Add(-clockSkew), now.Add(5*365*24*time.Hour)
	if x.NotAfter.After(root.NotAfter) {
		x.NotAfter = root.NotAfter
	}
	cert, err := x509util.CreateCertificate(x, root, key.Public(), rootKey)
	if err != nil {
		return nil, nil, fmt.Errorf("ca: sign intermediate: %w", err)
	}
	return cert, key, nil
}

// Certificate returns the root certificate.
func (c *CA) Certificate() *x509.Certificate { return c.root }

// Intermediate returns the certificate that signs leaves; leaf chains carry it.
func (c *CA) Intermediate() *x509.Certificate { return c.cert }

// Pin is the root's SHA-256, the value join strings carry.
func (c *CA) Pin() string { return pki.Fingerprint(c.root) }

// Pool returns a pool holding only the root.
func (c *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(c.root)
	return p
}

// leafTemplate takes only the subject and SANs we set, never those in the
// CSR, so a node cannot ask for another identity or for the hub's name.
const clientTemplate = `{
	"subject": {{ toJson .Subject }},
	"sans": {{ toJson .SANs }},
	"keyUsage": ["digitalSignature"],
	"extKeyUsage": ["clientAuth"]
}`

const serverTemplate = `{
	"subject": {{ toJson .Subject }},
	"sans": {{ toJson .SANs }},
	"keyUsage": ["digitalSignature"],
	"extKeyUsage": ["serverAuth", "clientAuth"]
}`

func (c *CA) sign(
	csr *x509.CertificateRequest, tmplText, cn string, sans []string, ttl time.Duration,
) (*x509.Certificate, error) {
	data := x509util.CreateTemplateData(cn, sans)
	tmpl, err := x509util.NewCertificate(csr, x509util.WithTemplate(tmplText, data))
	if err != nil {
		return nil, fmt.Errorf("ca: certificate template for %q: %w", cn, err)
	}
	x := tmpl.GetCertificate()
	now := time.Now()
	x.NotBefore, x.NotAfter = now.Add(-clockSkew), now.Add(ttl)
	if x.NotAfter.After(c.cert.NotAfter) {
		x.NotAfter = c.cert.NotAfter
	}
	cert, err := x509util.CreateCertificate(x, c.cert, csr.PublicKey, c.key)
	if err != nil {
		return nil, fmt.Errorf("ca: sign %q: %w", cn, err)
	}
	return cert, nil
}

// SignCSR issues a client certificate for id from a DER CSR (whose signature
// proves possession of the key). The CSR's own subject and SANs are ignored.
func (c *CA) SignCSR(csrDER []byte, id pki.Identity, commonName string, ttl time.Duration) (*x509.Certificate, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("ca: parse CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("ca: CSR signature: %w", err)
	}
	return c.sign(csr, clientTemplate, commonName, []string{id.URI().String()}, ttl)
}

// IssueKeyPair makes a key and a client certificate for id, for identities the
// hub creates itself (the local admin).
func (c *CA) IssueKeyPair(id pki.Identity, commonName string, ttl time.Duration) (tls.Certificate, []byte, error) {
	key, err := pki.GenerateKey()
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	csr, err := pki.NewCSR(key, commonName)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	cert, err := c.SignCSR(csr, id, commonName, ttl)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	keyPEM, err := pki.EncodeKey(key)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	return tls.Certificate{Certificate: [][]byte{cert.Raw, c.cert.Raw}, PrivateKey: key, Leaf: cert}, keyPEM, nil
}

// IssueHubServer makes the hub's serving certificate (HubServerName plus the
// extra DNS names / IPs in sans). The chain includes the intermediate and the
// root so joining agents can check the pin.
func (c *CA) IssueHubServer(hubName string, sans []string, ttl time.Duration) (tls.Certificate, error) {
	key, err := pki.GenerateKey()
	if err != nil {
		return tls.Certificate{}, err
	}
	csrDER, err := pki.NewCSR(key, hubName)
	if err != nil {
		return tls.Certificate{}, err
	}
	csr, _ := x509.ParseCertificateRequest(csrDER)
	id := pki.Identity{Kind: pki.KindHub, ID: hubName}
	all := append([]string{pki.HubServerName, id.URI().String()}, sans...)
	cert, err := c.sign(csr, serverTemplate, hubName, all, ttl)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{cert.Raw, c.cert.Raw, c.root.Raw}, PrivateKey: key, Leaf: cert}, nil
}

// ReplicaServerName is the DNS name in every replica's peer certificate,
// the name replicas verify each other by (besides the replica kind).
const ReplicaServerName = "tether-replica"

// IssueReplica makes a hub replica's peer certificate: identity
// tether://replica/ID and ReplicaServerName, for both ends of a peer link.
// Only the hub calls it, with its own key; nothing a node or an operator
// sends can make the CA issue this kind.
func (c *CA) IssueReplica(replicaID string, ttl time.Duration) (tls.Certificate, error) {
	key, err := pki.GenerateKey()
	if err != nil {
		return tls.Certificate{}, err
	}
	csrDER, err := pki.NewCSR(key, "replica "+replicaID)
	if err != nil {
		return tls.Certificate{}, err
	}
	csr, _ := x509.ParseCertificateRequest(csrDER)
	id := pki.Identity{Kind: pki.KindReplica, ID: replicaID}
	cert, err := c.sign(csr, serverTemplate, "replica "+replicaID, []string{ReplicaServerName, id.URI().String()}, ttl)
	if err != nil {
		return tls.Certificate{}, err
	}
	return tls.Certificate{Certificate: [][]byte{cert.Raw, c.cert.Raw}, PrivateKey: key, Leaf: cert}, nil
}

// Verify checks that cert was issued by this CA for client auth at now, and
// returns its identity.
func (c *CA) Verify(cert *x509.Certificate) (pki.Identity, error) {
	inter := x509.NewCertPool()
	inter.AddCert(c.cert)
	if _, err := cert.Verify(x509.VerifyOptions{
		Roots: c.Pool(), Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return pki.Identity{}, fmt.Errorf("ca: verify %q: %w", cert.Subject.CommonName, err)
	}
	return pki.IdentityOf(cert)
}

// IssuedAt is when this CA signed cert, to the second: its NotBefore
// without the clock-skew backdating. The hub compares it with the time of
// the last admin revocation.
func IssuedAt(cert *x509.Certificate) time.Time { return cert.NotBefore.Add(clockSkew) }
