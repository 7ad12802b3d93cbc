// Package operator is operators' identity at the hub: `tether login`
// (challenges, SSH user certificates), the admin client certificates (the
// local identity in DATA_DIR/admin, operators with the admin role, their
// revocation) and operators' own API certificates, with the API endpoints
// that serve them (Register).
package operator

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki/ca"
)

// Errors the refusals wrap. They are defined in hub/api/route so that the
// route table maps them to statuses without importing this feature.
var (
	// ErrLoginRefused is wrapped by login errors the client caused (403).
	ErrLoginRefused = route.ErrLoginRefused
	// ErrAdminRefused is wrapped by AuthorizeAdmin's refusals.
	ErrAdminRefused = route.ErrAdminRefused
	// ErrNotOperatorIdentity is wrapped by AuthorizeOperator when the
	// certificate is no operator API identity of this hub at all.
	ErrNotOperatorIdentity = route.ErrNotOperatorIdentity
)

// Door is the part of the access door a login and the certificate checks
// ask (hub/access).
type Door interface {
	Snapshot() *access.Snapshot
	LoginGrant(operator string) (*access.Operator, []string, error)
	AuthorizeAdmin(operator, keyTag string) error
	AuthorizeAPIIdentity(operator, keyTag string) error
}

// UserCA signs the SSH user certificates a login hands out.
type UserCA interface {
	SignUser(pub gossh.PublicKey, keyID string, logins []string, ttl time.Duration) (*gossh.Certificate, error)
}

// Auditor writes the audit log (hub/auditlog).
type Auditor interface {
	Write(e store.AuditEvent)
	// Limited writes within the per-source limit of refusals.
	Limited(remote string, e store.AuditEvent)
}

// Config is what the Service uses.
type Config struct {
	// Store keeps the admin revocation time.
	Store store.AdminStore
	// CA is the hub's own CA: it signs and verifies API client
	// certificates (never an external step-ca).
	CA     *ca.CA
	UserCA UserCA
	Door   Door
	Audit  Auditor
	// DataDir holds the local admin identity (DATA_DIR/admin).
	DataDir string
	// UserCertTTL is the lifetime of login certificates; API certificates
	// live at most MaxAdminCertTTL.
	UserCertTTL time.Duration
	// RateLimited counts login challenges refused to a flooding source.
	RateLimited prometheus.Counter
	// Publish tells the other hub replicas of a change (store.Change*).
	Publish func(kind, subject string)
	Log     *slog.Logger
}

// Service serves logins and decides which API client certificates are
// accepted.
type Service struct {
	cfg        Config
	challenges challenges // pending tether login nonces
	admins     admins     // admin certificates: revocation time, local identity
}

// New makes a Service; Start starts it.
func New(cfg Config) *Service { return &Service{cfg: cfg} }
