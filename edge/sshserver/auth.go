package sshserver

import (
	"errors"
	"fmt"
	"slices"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// keySet is an immutable set of public keys keyed by their wire encoding,
// each with the logins it may use (nil: any login). It is swapped as a
// whole so a reader never sees half an update.
type keySet struct {
	keys map[string][]string
}

func newKeySet(keys []gossh.PublicKey) *keySet {
	ks := &keySet{keys: make(map[string][]string, len(keys))}
	for _, k := range keys {
		if k == nil {
			continue
		}
		ks.keys[string(k.Marshal())] = nil
	}
	return ks
}

// contains reports whether k is in the set. Public keys are not secret, so
// a map lookup (not constant time) leaks nothing worth protecting.
func (ks *keySet) contains(k gossh.PublicKey) bool {
	if k == nil {
		return false
	}
	_, ok := ks.keys[string(k.Marshal())]
	return ok
}

// allows reports whether k is in the set and may log in as user.
func (ks *keySet) allows(k gossh.PublicKey, user string) bool {
	if k == nil {
		return false
	}
	logins, ok := ks.keys[string(k.Marshal())]
	if !ok {
		return false
	}
	return logins == nil || slices.Contains(logins, user)
}

// AuthorizedKey is an operator key with the logins it may use on this node.
type AuthorizedKey struct {
	Key    gossh.PublicKey
	Logins []string // nil or empty: any login
}

// SetAuthorizedKeyLogins is SetAuthorizedKeys with a login restriction per
// key: a key may only log in as one of its Logins (the operator's roles'
// logins for this node).
func (s *Server) SetAuthorizedKeyLogins(keys []AuthorizedKey) {
	ks := &keySet{keys: make(map[string][]string, len(keys))}
	for _, k := range keys {
		if k.Key == nil {
			continue
		}
		var logins []string
		if len(k.Logins) > 0 {
			logins = slices.Clone(k.Logins)
		}
		ks.keys[string(k.Key.Marshal())] = logins
	}
	s.authorized.Store(ks)
}

func (ks *keySet) empty() bool { return len(ks.keys) == 0 }

// SetAuthorizedKeys replaces the set of operator keys that may log in. The
// hub pushes the complete set for the node, so this is a replacement, not a
// merge; keys compare by their wire encoding. It affects authentication of
// new connections; connections already established keep running. A nil or
// empty slice locks out plain keys (user certificates from trusted CAs still
// work). Certificates in keys are matched as exact certificates only.
func (s *Server) SetAuthorizedKeys(keys []gossh.PublicKey) {
	s.authorized.Store(newKeySet(keys))
}

// SetTrustedUserCAs replaces the set of certificate authorities whose user
// certificates are accepted in addition to the authorized keys. A
// certificate must be a user certificate, be within its validity window,
// carry no critical options other than source-address (which is enforced
// against the connection's remote address) and, if it lists principals,
// list the login name. Empty (the default) accepts no certificates.
func (s *Server) SetTrustedUserCAs(keys []gossh.PublicKey) {
	s.userCAs.Store(newKeySet(keys))
}

// SetRevokedKeys replaces the set of keys refused outright: a plain key in
// the set, or a certificate whose key is in it, never logs in (a removed
// operator's still-valid certificates stop working at once).
func (s *Server) SetRevokedKeys(keys []gossh.PublicKey) {
	s.revoked.Store(newKeySet(keys))
}

// certPrincipals is the node's mapping from login to accepted user
// certificate principals (nil: a certificate must name the login itself).
type certPrincipals struct {
	perLogin map[string][]string
	any      []string
}

// SetCertPrincipals makes user certificates role-scoped: a certificate may
// log in as LOGIN only if it carries one of perLogin[LOGIN] or of anyLogin.
// This is how a certificate naming roles works only on nodes those roles
// select. Calling it with a nil map restores the default (principal = login).
func (s *Server) SetCertPrincipals(perLogin map[string][]string, anyLogin []string) {
	if perLogin == nil && anyLogin == nil {
		s.principals.Store(nil)
		return
	}
	s.principals.Store(&certPrincipals{perLogin: perLogin, any: anyLogin})
}

// allowedLogin re-checks key for the login that finally authenticated.
func (s *Server) allowedLogin(user string, key gossh.PublicKey) bool {
	if key == nil {
		return false
	}
	revoked := s.revoked.Load()
	if revoked.contains(key) {
		return false
	}
	if s.authorized.Load().allows(key, user) {
		return true
	}
	cert, ok := key.(*gossh.Certificate)
	if !ok || revoked.contains(cert.Key) {
		return false
	}
	_, err := s.checkUserCert(user, cert)
	return err == nil
}

// authorize is the gliderlabs PublicKeyHandler. It runs for key queries and
// for signed attempts alike; x/crypto verifies the signature separately.
func (s *Server) authorize(ctx ssh.Context, key ssh.PublicKey) bool {
	// gliderlabs hands x/crypto the context's *Permissions after this
	// returns, and x/crypto caches that pointer per key. Give every
	// accepted key its own Permissions value so one certificate's
	// source-address cannot be overwritten by another key's query.
	p := ctx.Permissions()
	revoked := s.revoked.Load()
	if revoked.contains(key) {
		return false
	}
	if c, ok := key.(*gossh.Certificate); ok && revoked.contains(c.Key) {
		return false
	}
	if s.authorized.Load().allows(key, ctx.User()) {
		p.Permissions = &gossh.Permissions{}
		return true
	}
	cert, ok := key.(*gossh.Certificate)
	if !ok {
		return false
	}
	perms, err := s.checkUserCert(ctx.User(), cert)
	if err != nil {
		if st := connStateFrom(ctx); st != nil {
			st.log.Debug("user certificate rejected", "user", ctx.User(), "key", keyDescription(cert), "err", err)
		}
		return false
	}
	// x/crypto enforces source-address from the returned permissions.
	p.Permissions = &gossh.Permissions{
		CriticalOptions: perms.CriticalOptions,
		Extensions:      perms.Extensions,
	}
	return true
}

func (s *Server) checkUserCert(user string, cert *gossh.Certificate) (*gossh.Permissions, error) {
	cas := s.userCAs.Load()
	if cas.empty() {
		return nil, errors.New("sshserver: no trusted user CAs")
	}
	if cert.CertType != gossh.UserCert {
		return nil, fmt.Errorf("sshserver: certificate type %d is not a user certificate", cert.CertType)
	}
	if !cas.contains(cert.SignatureKey) {
		return nil, errors.New("sshserver: certificate signed by an untrusted authority")
	}
	checker := gossh.CertChecker{
		SupportedCriticalOptions: []string{"source-address"},
	}
	principal := user
	if cp := s.principals.Load(); cp != nil {
		principal = ""
		for _, p := range cert.ValidPrincipals {
			if slices.Contains(cp.perLogin[user], p) || slices.Contains(cp.any, p) {
				principal = p
				break
			}
		}
		if principal == "" {
			return nil, fmt.Errorf("sshserver: certificate principals %v do not allow login %q on this node", cert.ValidPrincipals, user)
		}
	}
	// CheckCert covers validity window, principals, critical options and
	// the CA signature.
	if err := checker.CheckCert(principal, cert); err != nil {
		return nil, fmt.Errorf("sshserver: check user certificate: %w", err)
	}
	return &cert.Permissions, nil
}

// keyDescription names a key in logs the way OpenSSH does.
func keyDescription(k gossh.PublicKey) string {
	if cert, ok := k.(*gossh.Certificate); ok {
		return fmt.Sprintf("%s %s id=%q serial=%d CA %s", cert.Type(), gossh.FingerprintSHA256(cert.Key), cert.KeyId, cert.Serial, gossh.FingerprintSHA256(cert.SignatureKey))
	}
	return k.Type() + " " + gossh.FingerprintSHA256(k)
}
