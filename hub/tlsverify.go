package hub

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"

	"github.com/tether-dev/tether/hub/store"
)

// verifyNodeCerts makes the tunnel's TLS config verify client certificates
// itself, exactly as crypto/tls would with RequireAndVerifyClientCert and
// ClientCAs, so that a refused certificate (another CA's, an expired one)
// leaves an audit event. The tunnel listener does not tell the hub about
// failed handshakes, so the remote address is not known here; the event
// names the certificate instead.
func (s *Server) verifyNodeCerts(cfg *tls.Config) {
	roots := cfg.ClientCAs
	cfg.ClientAuth = tls.RequireAnyClientCert
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tether: a client certificate is required")
		}
		leaf := cs.PeerCertificates[0]
		opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
		if _, err := leaf.Verify(opts); err != nil {
			s.auditRefusal("tls", "tls-handshake", store.AuditEvent{Kind: "connect", Result: "refused",
				Detail: fmt.Sprintf("TLS client certificate %q (issuer %q, serial %s) refused: %v",
					leaf.Subject.CommonName, leaf.Issuer.CommonName, leaf.SerialNumber.Text(16), err)})
			return fmt.Errorf("tether: client certificate refused: %w", err)
		}
		return nil
	}
}
