package nodeconn

import (
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/store"
)

// VerifyNodeCerts makes the tunnel's TLS config verify client certificates
// itself, exactly as crypto/tls would with RequireAndVerifyClientCert and
// ClientCAs, so that a refused certificate (another CA's, an expired one)
// leaves an audit event. The tunnel listener does not tell the hub about
// failed handshakes, so the remote address is not known here; the event
// names the certificate instead.
func (s *Server) VerifyNodeCerts(cfg *tls.Config) {
	roots := cfg.ClientCAs
	anchors := &issuerAnchors{roots: roots, byRaw: make(map[[32]byte]issuerAnchor)}
	cfg.ClientAuth = tls.RequireAnyClientCert
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tether: a client certificate is required")
		}
		leaf := cs.PeerCertificates[0]
		if anchors.verify(cs.PeerCertificates, time.Now()) {
			return nil
		}
		opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(), KeyUsages: clientAuth}
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
		if _, err := leaf.Verify(opts); err != nil {
			s.cfg.Audit.Refusal("tls", "tls-handshake", store.AuditEvent{Kind: "connect", Result: "refused",
				Detail: fmt.Sprintf("TLS client certificate %q (issuer %q, serial %s) refused: %v",
					leaf.Subject.CommonName, leaf.Issuer.CommonName, leaf.SerialNumber.Text(16), err)})
			return fmt.Errorf("tether: client certificate refused: %w", err)
		}
		return nil
	}
}

var clientAuth = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}

// maxIssuerAnchors bounds issuerAnchors: a hub's node certificates come
// from one issuing CA (two during a rotation), so a handful is plenty.
const maxIssuerAnchors = 8

// issuerAnchors remembers issuing CA certificates (the intermediate a node
// sends after its leaf) already verified up to the roots, so a node's chain
// costs one signature check instead of two. After a hub restart the whole
// fleet reconnects, and the second check, the same intermediate against the
// same root every time, was half of what verifying a certificate cost.
//
// The leaf is still verified by crypto/x509, with the remembered issuer as
// its trust anchor: its signature, validity, key usage and the issuer's
// constraints and validity, as a full verification would. What the anchor
// skips (the issuer's signature and its chain up to a root) was verified
// when it was remembered, and the root's validity is kept with it. Only an
// issuer that verified is remembered; anything the shortcut does not accept
// goes through the full verification, which also produces the refusal.
type issuerAnchors struct {
	roots *x509.CertPool

	mu    sync.RWMutex
	byRaw map[[32]byte]issuerAnchor
}

type issuerAnchor struct {
	pool        *x509.CertPool // the issuer alone, as a trust anchor
	from, until time.Time      // when every certificate of its chain to a root is valid
}

// verify reports whether chain (leaf, issuer) verifies through a remembered
// issuer, remembering the issuer first if it verifies up to a root. Chains
// of another shape are left to the full verification.
func (a *issuerAnchors) verify(chain []*x509.Certificate, now time.Time) bool {
	if len(chain) != 2 {
		return false
	}
	key := sha256.Sum256(chain[1].Raw)
	a.mu.RLock()
	anchor, ok := a.byRaw[key]
	a.mu.RUnlock()
	if !ok {
		if anchor, ok = a.remember(key, chain[1]); !ok {
			return false
		}
	}
	if now.Before(anchor.from) || now.After(anchor.until) {
		return false
	}
	_, err := chain[0].Verify(x509.VerifyOptions{Roots: anchor.pool, KeyUsages: clientAuth, CurrentTime: now})
	return err == nil
}

func (a *issuerAnchors) remember(key [32]byte, issuer *x509.Certificate) (issuerAnchor, bool) {
	if !issuer.IsCA {
		return issuerAnchor{}, false
	}
	chains, err := issuer.Verify(x509.VerifyOptions{Roots: a.roots, KeyUsages: clientAuth})
	if err != nil {
		return issuerAnchor{}, false
	}
	anchor := issuerAnchor{pool: x509.NewCertPool()}
	anchor.pool.AddCert(issuer)
	for i, c := range chains[0] {
		if i == 0 || c.NotBefore.After(anchor.from) {
			anchor.from = c.NotBefore
		}
		if i == 0 || c.NotAfter.Before(anchor.until) {
			anchor.until = c.NotAfter
		}
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if len(a.byRaw) < maxIssuerAnchors {
		a.byRaw[key] = anchor
	}
	return anchor, true
}
