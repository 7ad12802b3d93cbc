// Package stepca lets the hub delegate node certificate issuance to an
// existing smallstep step-ca, through its JWK provisioner, using
// github.com/smallstep/certificates' client. Only the hub links it.
package stepca

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/smallstep/certificates/api"
	"github.com/smallstep/certificates/ca"

	"github.com/tether-dev/tether/pki"
)

// Config names the step-ca and the provisioner the hub uses.
type Config struct {
	URL          string // e.g. https://ca.example.com:9000
	RootFile     string // the step-ca root certificate (trust for the CA's TLS and for node certificates)
	Provisioner  string // JWK provisioner name
	PasswordFile string // decrypts the provisioner key
}

// Issuer signs node certificates with a step-ca.
type Issuer struct {
	prov *ca.Provisioner
	root *x509.Certificate
}

// New connects to the step-ca, loads and decrypts the provisioner key.
func New(cfg Config) (*Issuer, error) {
	if cfg.URL == "" || cfg.RootFile == "" || cfg.Provisioner == "" || cfg.PasswordFile == "" {
		return nil, errors.New("stepca: --step-ca-url, --step-ca-root, --step-ca-provisioner and --step-ca-password-file are all required")
	}
	rootPEM, err := os.ReadFile(cfg.RootFile)
	if err != nil {
		return nil, fmt.Errorf("stepca: root: %w", err)
	}
	roots, err := pki.ParseCerts(rootPEM)
	if err != nil {
		return nil, fmt.Errorf("stepca: root %s: %w", cfg.RootFile, err)
	}
	pw, err := os.ReadFile(cfg.PasswordFile)
	if err != nil {
		return nil, fmt.Errorf("stepca: password file: %w", err)
	}
	p, err := ca.NewProvisioner(cfg.Provisioner, "", cfg.URL, []byte(strings.TrimRight(string(pw), "\r\n")), ca.WithRootFile(cfg.RootFile))
	if err != nil {
		return nil, fmt.Errorf("stepca: provisioner %q at %s: %w", cfg.Provisioner, cfg.URL, err)
	}
	return &Issuer{prov: p, root: roots[0]}, nil
}

// Root is the step-ca root: the hub trusts node certificates chaining to it.
func (i *Issuer) Root() *x509.Certificate { return i.root }

// IssueNode asks the step-ca to sign csrDER for identity id: the one-time
// token carries the subject and the tether:// URI SAN, so the certificate
// says exactly what the hub decided, whatever the CSR asked for.
func (i *Issuer) IssueNode(ctx context.Context, csrDER []byte, id pki.Identity, commonName string, ttl time.Duration) ([]*x509.Certificate, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("stepca: parse CSR: %w", err)
	}
	if err := csr.CheckSignature(); err != nil {
		return nil, fmt.Errorf("stepca: CSR signature: %w", err)
	}
	if csr.Subject.CommonName != commonName || len(csr.DNSNames)+len(csr.IPAddresses)+len(csr.EmailAddresses)+len(csr.URIs) > 0 {
		return nil, fmt.Errorf("stepca: CSR must name %q and carry no SANs", commonName)
	}
	tok, err := i.prov.Token(commonName, id.URI().String())
	if err != nil {
		return nil, fmt.Errorf("stepca: token: %w", err)
	}
	resp, err := i.prov.Client.SignWithContext(ctx, &api.SignRequest{
		CsrPEM:   api.CertificateRequest{CertificateRequest: csr},
		OTT:      tok,
		NotAfter: api.NewTimeDuration(time.Now().Add(ttl)),
	})
	if err != nil {
		return nil, fmt.Errorf("stepca: sign %q: %w", commonName, err)
	}
	chain := []*x509.Certificate{resp.ServerPEM.Certificate}
	switch {
	case len(resp.CertChainPEM) > 1:
		for _, c := range resp.CertChainPEM[1:] {
			chain = append(chain, c.Certificate)
		}
	case resp.CaPEM.Certificate != nil:
		chain = append(chain, resp.CaPEM.Certificate)
	}
	return chain, nil
}
