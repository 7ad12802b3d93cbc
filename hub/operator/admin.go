package operator

import (
	"context"
	"crypto"
	"crypto/sha256"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/tick"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
)

// Admin client certificates. Every one is short-lived and names who holds
// it: the hub machine's local identity (tether://admin/local), re-minted by
// the running hub in DATA_DIR/admin, or an operator holding the admin role
// (tether://admin/op.NAME.KEYTAG), from `tether login`. The hub accepts one
// only while its holder still may administer: see AuthorizeAdmin.
const (
	// LocalAdminTTL is the lifetime of the local admin identity; the hub
	// re-mints it at half its life.
	LocalAdminTTL = 8 * time.Hour
	// MaxAdminCertTTL bounds every admin certificate the hub accepts. The
	// 365-day certificates of hubs from before admin certificates were
	// short-lived fail it, so they stop working on upgrade.
	MaxAdminCertTTL = 24 * time.Hour

	// LocalAdminID is the local identity's ID in its certificate.
	LocalAdminID = "local"
	// OperatorAdminPrefix starts the ID of an operator's admin certificate
	// (op.NAME.KEYTAG).
	OperatorAdminPrefix = "op."
	// localAdminCheckEvery: how often the hub looks at DATA_DIR/admin; a
	// deleted or revoked local identity is back within this.
	localAdminCheckEvery = time.Minute
	// ClockSkewAllowance covers the CA's NotBefore backdating in lifetime
	// checks.
	ClockSkewAllowance = 10 * time.Minute
)

// admins is the hub's state about admin certificates.
type admins struct {
	// validFrom is the unix millisecond time of the last `tether ca
	// revoke-admin` (0: never): certificates issued before it are refused.
	// Held in memory so the per-request check reads no store.
	validFrom atomic.Int64
	mu        sync.Mutex // serializes writes of the local admin identity
}

// AdminValidFrom is when the last `tether ca revoke-admin` took effect
// (zero: never): admin and operator API certificates issued before it are
// refused.
func (s *Service) AdminValidFrom() time.Time {
	if ms := s.admins.validFrom.Load(); ms != 0 {
		return time.UnixMilli(ms)
	}
	return time.Time{}
}

// SetAdminValidFrom takes a revocation another replica made (read from the
// store) into account.
func (s *Service) SetAdminValidFrom(vf time.Time) { s.admins.validFrom.Store(vf.UnixMilli()) }

// WriteLocalAdmin mints the local admin identity at start, before Start:
// a data dir the hub cannot write is refused here, naming the file.
// Start then re-mints it if a revocation of the last second requires.
func (s *Service) WriteLocalAdmin(ctx context.Context) error {
	s.admins.mu.Lock()
	defer s.admins.mu.Unlock()
	_, reuseKey := s.localAdminState()
	return s.writeLocalAdminLocked(ctx, !reuseKey)
}

// localAdminState reads DATA_DIR/admin. reuseKey: its key may sign the next
// certificate, because it belongs to a local identity of this hub's own
// making (never to a 365-day one from before the upgrade, which READMEs
// told admins to copy around). fresh: no re-mint is needed.
func (s *Service) localAdminState() (fresh, reuseKey bool) {
	cert, _, err := apiclient.LoadAdminIdentity(filepath.Join(s.cfg.DataDir, apitype.AdminDir))
	if err != nil {
		return false, false
	}
	leaf := cert.Leaf
	id, err := s.cfg.CA.Verify(leaf)
	if err != nil || id.Kind != pki.KindAdmin || id.ID != LocalAdminID ||
		leaf.NotAfter.Sub(leaf.NotBefore) > MaxAdminCertTTL+ClockSkewAllowance {
		return false, false
	}
	return !ca.IssuedAt(leaf).Before(s.AdminValidFrom()) && time.Until(leaf.NotAfter) > LocalAdminTTL/2, true
}

// Start loads the admin revocation time and makes sure the local admin
// identity is fresh. Call it once the store is open.
func (s *Service) Start(ctx context.Context) error {
	vf, err := s.cfg.Store.AdminValidFrom(ctx)
	if err != nil {
		return err
	}
	if !vf.IsZero() {
		s.admins.validFrom.Store(vf.UnixMilli())
	}
	return s.RefreshLocalAdmin(ctx)
}

// KeepLocalAdminFresh re-mints the local admin identity whenever it is
// missing, unreadable, revoked or past half its life, until stop is called.
//
// The running hub re-mints rather than the CLI: the CA key stays in the one
// process that uses it (the CLI on the hub machine needs read access to
// DATA_DIR/admin only, not to DATA_DIR/ca), a revocation re-mints at once in
// the process that decided it, and nobody else needs to know the
// revocation time. Without a running hub there is nothing to talk to, so a
// stale file then costs nothing.
func (s *Service) KeepLocalAdminFresh() (stop func()) {
	return tick.Repeat(localAdminCheckEvery, func() bool {
		if err := s.RefreshLocalAdmin(context.Background()); err != nil {
			s.cfg.Log.Error("local admin identity", "err", err)
		}
		return true
	})
}

// RefreshLocalAdmin re-mints the local admin identity if it needs it. The
// key is kept when it may be, so a CLI reading the directory meanwhile never
// sees a new key beside an old certificate; a revocation makes a new one.
func (s *Service) RefreshLocalAdmin(ctx context.Context) error {
	s.admins.mu.Lock()
	defer s.admins.mu.Unlock()
	fresh, reuseKey := s.localAdminState()
	if fresh {
		return nil
	}
	return s.writeLocalAdminLocked(ctx, !reuseKey)
}

// writeLocalAdminLocked leaves a fresh local admin identity in the data dir
// (0700 dir, 0600 key) so CLI commands on this machine need only --data-dir;
// with newKey, or if the key is unreadable, over a new key. s.admins.mu
// must be held.
func (s *Service) writeLocalAdminLocked(ctx context.Context, newKey bool) error {
	dir := filepath.Join(s.cfg.DataDir, apitype.AdminDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("hub: admin identity: %w", err)
	}
	keyPath := filepath.Join(dir, apitype.AdminKeyFile)
	var key crypto.Signer
	if b, err := os.ReadFile(keyPath); err == nil && !newKey {
		key, _ = pki.ParseKey(b) // nil if unreadable: a new one is made
	}
	if key == nil {
		k, err := pki.GenerateKey()
		if err != nil {
			return fmt.Errorf("hub: admin identity: %w", err)
		}
		keyPEM, err := pki.EncodeKey(k)
		if err != nil {
			return fmt.Errorf("hub: admin identity: %w", err)
		}
		if err := pki.WriteFileAtomic(keyPath, keyPEM, 0o600); err != nil {
			return fmt.Errorf("hub: admin identity: %w", err)
		}
		key = k
	}
	csr, err := pki.NewCSR(key, LocalAdminID)
	if err != nil {
		return fmt.Errorf("hub: admin identity: %w", err)
	}
	cert, err := s.issueAdminCert(ctx, csr, LocalAdminID, "local-admin", LocalAdminTTL)
	if err != nil {
		return fmt.Errorf("hub: admin identity: %w", err)
	}
	for _, f := range []struct {
		name string
		data []byte
	}{
		{apitype.AdminCAFile, pki.EncodeCerts(s.cfg.CA.Certificate())},
		{apitype.AdminCertFile, pki.EncodeCerts(cert, s.cfg.CA.Intermediate())},
	} {
		if err := pki.WriteFileAtomic(filepath.Join(dir, f.name), f.data, 0o644); err != nil {
			return fmt.Errorf("hub: admin identity: %w", err)
		}
	}
	return nil
}

// issueAdminCert signs an admin client certificate for id from a DER CSR.
// Certificates carry their issue time to the second (ca.IssuedAt) and a
// revocation takes effect from the start of the next second, so a
// certificate signed in that second would look issued before it: wait.
func (s *Service) issueAdminCert(
	ctx context.Context,
	csrDER []byte,
	id, commonName string,
	ttl time.Duration,
) (*x509.Certificate, error) {
	return s.issueAPICert(ctx, csrDER, pki.Identity{Kind: pki.KindAdmin, ID: id}, commonName, ttl)
}

// issueAPICert signs an API client certificate (admin or operator) for id.
func (s *Service) issueAPICert(
	ctx context.Context,
	csrDER []byte,
	id pki.Identity,
	commonName string,
	ttl time.Duration,
) (*x509.Certificate, error) {
	if wait := time.Until(s.AdminValidFrom()); wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		select {
		case <-t.C:
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.cfg.CA.SignCSR(csrDER, id, commonName, min(ttl, MaxAdminCertTTL))
}

// keyTag names an operator's registered key in their admin certificate, so
// a certificate dies with the key it was issued for.
var (
	errAdminLegacy = fmt.Errorf(
		"%w: it is a long-lived admin certificate from before admin certificates became short-lived "+
			"and revocable; on the hub machine use --data-dir (the hub keeps a fresh one in DATA_DIR/admin), "+
			"elsewhere run `tether login` as an operator with the admin role "+
			"(`tether operator add NAME --key FILE --role admin`)",
		ErrAdminRefused,
	)
	errNotAdmin = fmt.Errorf("%w: not an admin identity of this hub", ErrAdminRefused)
)

// AuthorizeAdmin is the one decision "may this TLS client certificate
// use the admin API now": it must chain to the hub's own CA (never to an
// external step-ca trusted for nodes), name an admin, live at most
// MaxAdminCertTTL, be issued after the last `tether ca revoke-admin`, and be
// either the local identity or an operator's who still exists with the
// same key and still holds the admin role (checked against the in-memory
// snapshot, so `tether operator rm` ends access at the next request).
func (s *Service) AuthorizeAdmin(chain []*x509.Certificate) (string, error) {
	if len(chain) == 0 {
		return "", errNotAdmin
	}
	leaf := chain[0]
	id, err := s.cfg.CA.Verify(leaf)
	if err == nil && id.Kind == pki.KindOperator {
		return "", fmt.Errorf(
			"%w: certificate %q is an operator's API identity; "+
				"it lists the nodes the operator's roles select (tether nodes) and nothing else",
			ErrAdminRefused,
			leaf.Subject.CommonName,
		)
	}
	if err != nil || id.Kind != pki.KindAdmin {
		return "", fmt.Errorf("certificate %q: %w", leaf.Subject.CommonName, errNotAdmin)
	}
	if leaf.NotAfter.Sub(leaf.NotBefore) > MaxAdminCertTTL+ClockSkewAllowance {
		return "", fmt.Errorf(
			"admin certificate %q (valid until %s): %w",
			leaf.Subject.CommonName,
			leaf.NotAfter.Format(time.DateOnly),
			errAdminLegacy,
		)
	}
	if issued, vf := ca.IssuedAt(leaf), s.AdminValidFrom(); issued.Before(vf) {
		return "", fmt.Errorf(
			"%w: admin certificate %q was issued at %s, before `tether ca revoke-admin` took effect at %s; "+
				"get a new one: `tether login` (on the hub machine, --data-dir picks up the re-minted local identity)",
			ErrAdminRefused,
			leaf.Subject.CommonName,
			issued.UTC().Format(time.RFC3339),
			vf.UTC().Format(time.RFC3339),
		)
	}
	if id.ID == LocalAdminID {
		return LocalAdminID, nil
	}
	rest, ok := strings.CutPrefix(id.ID, OperatorAdminPrefix)
	name, tag, ok2 := strings.Cut(rest, ".")
	if !ok || !ok2 {
		return "", fmt.Errorf("admin certificate %q: %w", id.ID, errAdminLegacy)
	}
	if err := s.cfg.Door.AuthorizeAdmin(name, tag); err != nil {
		return "", fmt.Errorf("%w: %w", ErrAdminRefused, err)
	}
	return name, nil
}

// RevokeAdmin makes every admin certificate issued until now invalid, from
// the start of the next second (durably, before anything else), audits it
// and re-mints the local identity with a new key.
func (s *Service) RevokeAdmin(ctx context.Context, by, remote string) (time.Time, error) {
	vf := time.Now().Truncate(time.Second).Add(time.Second)
	if err := s.cfg.Store.SetAdminValidFrom(ctx, vf); err != nil {
		return time.Time{}, err
	}
	s.admins.validFrom.Store(vf.UnixMilli())
	s.cfg.Publish(store.ChangeAdminRevoked, "")
	s.cfg.Audit.Write(store.AuditEvent{At: time.Now(), Kind: "admin_revoke", Operator: by, Remote: remote, Result: "ok",
		Detail: "admin certificates issued before " + vf.UTC().Format(time.RFC3339) + " are refused"})
	s.cfg.Log.Warn("admin certificates revoked", "valid_from", vf, "by", by, "remote", remote)
	s.admins.mu.Lock()
	defer s.admins.mu.Unlock()
	if err := s.writeLocalAdminLocked(ctx, true); err != nil {
		return vf, err
	}
	return vf, nil
}

// AdminLoginPayload is what an operator signs to log in and ask for an admin
// certificate: LoginPayload bound to the CSR, so the certificate can only
// be for a key the operator chose.
func AdminLoginPayload(operator, nonce string, csrDER []byte) []byte {
	sum := sha256.Sum256(csrDER)
	return append(LoginPayload(operator, nonce), "\x00admin-csr:"+hex.EncodeToString(sum[:])...)
}

// loginPayloadOf is the payload a login request's signature must cover.
func loginPayloadOf(req apitype.LoginRequest) []byte {
	if len(req.AdminCSR) > 0 {
		return AdminLoginPayload(req.Operator, req.Nonce, req.AdminCSR)
	}
	return LoginPayload(req.Operator, req.Nonce)
}

// loginAdminCert issues the admin certificate of a login that asked for one,
// if the operator holds the admin role ("" otherwise), as a PEM chain.
func (s *Service) loginAdminCert(
	ctx context.Context,
	req apitype.LoginRequest,
	o *access.Operator,
	key gossh.PublicKey,
	remote string,
) (string, error) {
	if len(req.AdminCSR) == 0 || s.cfg.Door.AuthorizeAdmin(o.Name, access.AdminKeyTag(key)) != nil {
		return "", nil
	}
	ttl := min(s.cfg.UserCertTTL, MaxAdminCertTTL)
	cert, err := s.issueAdminCert(
		ctx,
		req.AdminCSR,
		OperatorAdminPrefix+req.Operator+"."+access.AdminKeyTag(key),
		req.Operator,
		ttl,
	)
	if err != nil {
		return "", fmt.Errorf("%w: admin certificate request: %v", ErrLoginRefused, err)
	}
	s.cfg.Audit.Write(
		store.AuditEvent{
			At:             time.Now(),
			Kind:           "login",
			Operator:       req.Operator,
			KeyFingerprint: gossh.FingerprintSHA256(key),
			Remote:         remote,
			Result:         "ok",
			Detail:         "admin client certificate until " + cert.NotAfter.UTC().Format(time.RFC3339),
		},
	)
	return string(pki.EncodeCerts(cert, s.cfg.CA.Intermediate())), nil
}

// Admins is the Service's admin certificate decisions as the API's route
// table asks them.
func (s *Service) Admins() AdminCerts { return AdminCerts{s} }

// AdminCerts decides which admin client certificates the API accepts.
type AdminCerts struct{ s *Service }

// Authorize is AuthorizeAdmin.
func (a AdminCerts) Authorize(chain []*x509.Certificate) (string, error) {
	return a.s.AuthorizeAdmin(chain)
}
