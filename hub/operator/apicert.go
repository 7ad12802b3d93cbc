package operator

import (
	"context"
	"crypto/x509"
	"fmt"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
)

// Operators' API identities. `tether login` gives an operator without the
// admin role a client certificate of kind operator
// (tether://operator/NAME.KEYTAG), as short-lived as an admin's and ended
// by the same `tether ca revoke-admin`. It admits them to the node listing,
// which shows only the nodes their roles select; every other endpoint
// refuses it (403).

var errNotOperator = ErrNotOperatorIdentity

// loginOperatorCert issues an operator's API certificate for a login that
// sent a CSR, as a PEM chain ("" without a CSR). The caller puts it in
// LoginResponse.APICert.
func (s *Service) loginOperatorCert(
	ctx context.Context,
	req apitype.LoginRequest,
	key gossh.PublicKey,
	remote string,
) (string, error) {
	if len(req.AdminCSR) == 0 {
		return "", nil
	}
	cert, err := s.issueAPICert(
		ctx,
		req.AdminCSR,
		pki.Identity{Kind: pki.KindOperator, ID: req.Operator + "." + access.AdminKeyTag(key)},
		req.Operator,
		min(s.cfg.UserCertTTL, MaxAdminCertTTL),
	)
	if err != nil {
		return "", fmt.Errorf("%w: API certificate request: %v", ErrLoginRefused, err)
	}
	s.cfg.Audit.Write(
		store.AuditEvent{
			At:             time.Now(),
			Kind:           "login",
			Operator:       req.Operator,
			KeyFingerprint: gossh.FingerprintSHA256(key),
			Remote:         remote,
			Result:         "ok",
			Detail:         "operator API certificate (node listing) until " + cert.NotAfter.UTC().Format(time.RFC3339),
		},
	)
	return string(pki.EncodeCerts(cert, s.cfg.CA.Intermediate())), nil
}

// AuthorizeOperator decides whether a TLS client certificate is an
// operator's API identity valid now: it must chain to the hub's own CA,
// be of kind operator, live at most MaxAdminCertTTL, be issued after the
// last `tether ca revoke-admin`, and belong to an operator still
// registered with the same key (the in-memory snapshot: `tether operator
// rm` ends it at the next request).
func (s *Service) AuthorizeOperator(chain []*x509.Certificate) (string, error) {
	if len(chain) == 0 {
		return "", errNotOperator
	}
	leaf := chain[0]
	id, err := s.cfg.CA.Verify(leaf)
	if err != nil || id.Kind != pki.KindOperator {
		return "", fmt.Errorf("certificate %q: %w", leaf.Subject.CommonName, errNotOperator)
	}
	if leaf.NotAfter.Sub(leaf.NotBefore) > MaxAdminCertTTL+ClockSkewAllowance {
		return "", fmt.Errorf(
			"certificate %q lives longer than %s, which no API certificate of this hub does; run `tether login` again",
			leaf.Subject.CommonName,
			MaxAdminCertTTL,
		)
	}
	if ca.IssuedAt(leaf).Before(s.AdminValidFrom()) {
		return "", fmt.Errorf(
			"certificate %q was issued before `tether ca revoke-admin`; run `tether login` again",
			leaf.Subject.CommonName,
		)
	}
	name, tag, ok := strings.Cut(id.ID, ".")
	if !ok {
		return "", fmt.Errorf("certificate %q: %w", id.ID, errNotOperator)
	}
	if err := s.cfg.Door.AuthorizeAPIIdentity(name, tag); err != nil {
		return "", err
	}
	return name, nil
}

// Operators is AuthorizeOperator as the API's route table asks it.
func (s *Service) Operators() OperatorCerts { return OperatorCerts{s} }

// OperatorCerts decides which operators' API client certificates the API
// accepts.
type OperatorCerts struct{ s *Service }

// Authorize is AuthorizeOperator.
func (o OperatorCerts) Authorize(chain []*x509.Certificate) (string, error) {
	return o.s.AuthorizeOperator(chain)
}
