package sshserver

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// keySet is an immutable set of public keys keyed by their wire encoding,
// each with what it grants. It is swapped as a whole so a reader never sees
// half an update.
type keySet struct {
	keys map[string]keyGrant
}

// keyGrant is what an authorized key may do on this node.
type keyGrant struct {
	logins    []string // nil: any login
	noForward bool     // port forwarding refused (OpenSSH's no-port-forwarding)
	name      string   // whose key (the authorized_keys comment), for logs and audit
}

func newKeySet(keys []gossh.PublicKey) *keySet {
	ks := &keySet{keys: make(map[string]keyGrant, len(keys))}
	for _, k := range keys {
		if k == nil {
			continue
		}
		ks.keys[string(k.Marshal())] = keyGrant{}
	}
	return ks
}

// contains reports whether k is in the set. Public keys are not secret, so
// a map lookup (not constant time) leaks nothing worth protecting.
func (ks *keySet) contains(k gossh.PublicKey) bool {
	_, ok := ks.grant(k)
	return ok
}

// grant returns what k is granted, if it is in the set.
func (ks *keySet) grant(k gossh.PublicKey) (keyGrant, bool) {
	if k == nil {
		return keyGrant{}, false
	}
	g, ok := ks.keys[string(k.Marshal())]
	return g, ok
}

// allows reports whether k is in the set and may log in as user.
func (ks *keySet) allows(k gossh.PublicKey, user string) bool {
	g, ok := ks.grant(k)
	return ok && (g.logins == nil || slices.Contains(g.logins, user))
}

// AuthorizedKey is an operator key with what it may do on this node.
type AuthorizedKey struct {
	Key    gossh.PublicKey
	Logins []string // nil or empty: any login
	// NoForwarding refuses ssh -L and ssh -R to this key (the hub sets it
	// for operators none of whose roles selecting the node allows
	// forwarding). The zero value allows forwarding: what a key that may run
	// a shell could do anyway with socat or an ssh client on the node.
	NoForwarding bool
	// Name is whose key this is (the operator), for logs and audit.
	Name string
}

// SetAuthorizedKeyLogins is SetAuthorizedKeys with a login restriction per
// key: a key may only log in as one of its Logins (the operator's roles'
// logins for this node). Connections whose key no longer may log in as
// their login are closed at once (see recheckConns).
func (s *Server) SetAuthorizedKeyLogins(keys []AuthorizedKey) {
	ks := &keySet{keys: make(map[string]keyGrant, len(keys))}
	for _, k := range keys {
		if k.Key == nil {
			continue
		}
		g := keyGrant{noForward: k.NoForwarding, name: k.Name}
		if len(k.Logins) > 0 {
			g.logins = slices.Clone(k.Logins)
		}
		ks.keys[string(k.Key.Marshal())] = g
	}
	s.authorized.Store(ks)
	s.recheckConns()
}

func (ks *keySet) empty() bool { return len(ks.keys) == 0 }

// SetAuthorizedKeys replaces the set of operator keys that may log in. The
// hub pushes the complete set for the node, so this is a replacement, not a
// merge; keys compare by their wire encoding. Connections whose key is no
// longer accepted are closed. A nil or empty slice locks out plain keys
// (user certificates from trusted CAs still work). Certificates in keys are
// matched as exact certificates only.
func (s *Server) SetAuthorizedKeys(keys []gossh.PublicKey) {
	s.authorized.Store(newKeySet(keys))
	s.recheckConns()
}

// SetTrustedUserCAs replaces the set of certificate authorities whose user
// certificates are accepted in addition to the authorized keys. A
// certificate must be a user certificate, be within its validity window,
// carry no critical options other than source-address (which is enforced
// against the connection's remote address) and, if it lists principals,
// list the login name. Empty (the default) accepts no certificates.
func (s *Server) SetTrustedUserCAs(keys []gossh.PublicKey) {
	s.userCAs.Store(newKeySet(keys))
	s.recheckConns()
}

// SetRevokedKeys replaces the set of keys refused outright: a plain key in
// the set, or a certificate whose key is in it, never logs in (a removed
// operator's still-valid certificates stop working at once), and its live
// connections are closed.
func (s *Server) SetRevokedKeys(keys []gossh.PublicKey) {
	s.revoked.Store(newKeySet(keys))
	s.recheckConns()
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
// Connections whose certificate no longer grants their login are closed.
func (s *Server) SetCertPrincipals(perLogin map[string][]string, anyLogin []string) {
	if perLogin == nil && anyLogin == nil {
		s.principals.Store(nil)
	} else {
		s.principals.Store(&certPrincipals{perLogin: perLogin, any: anyLogin})
	}
	s.recheckConns()
}

// SetNoForwardingPrincipals lists the user-certificate principals that do
// not allow port forwarding (those of roles created with
// --forwarding=false). A certificate login may forward if the principal it
// logged in with is not listed; nil (the default, and what a hub that
// predates the setting sends) allows forwarding for every principal.
func (s *Server) SetNoForwardingPrincipals(principals []string) {
	s.noForward.Store(&principals)
}

// ScopedCA is a user CA trusted only for some principals: the user CA of a
// hub above this node's site hub, whose certificates may log in only
// through the principals that hub's roles grant on this node. Its
// certificates are never checked against the node's own principals
// (SetCertPrincipals), so a certificate of an ancestor naming a principal
// the ancestor did not grant here is refused, even if the node's own hub
// grants that principal to its own operators.
type ScopedCA struct {
	Keys []gossh.PublicKey
	// PerLogin maps a login to the principals that may use it; AnyLogin
	// are valid for every login.
	PerLogin map[string][]string
	AnyLogin []string
	// NoForwarding lists the principals that may not forward ports.
	NoForwarding []string
}

// scopedCAs are the scoped user CAs by CA key (wire encoding).
type scopedCAs struct {
	byKey map[string]*ScopedCA
}

func (sc *scopedCAs) lookup(k gossh.PublicKey) (*ScopedCA, bool) {
	if sc == nil || k == nil {
		return nil, false
	}
	c, ok := sc.byKey[string(k.Marshal())]
	return c, ok
}

// SetScopedUserCAs replaces the scoped user CAs. Connections whose
// certificate no longer grants their login are closed.
func (s *Server) SetScopedUserCAs(cas []ScopedCA) {
	sc := &scopedCAs{byKey: map[string]*ScopedCA{}}
	for i := range cas {
		c := cas[i]
		for _, k := range c.Keys {
			if k != nil {
				sc.byKey[string(k.Marshal())] = &c
			}
		}
	}
	s.scoped.Store(sc)
	s.recheckConns()
}

// allowedLogin re-checks key for the login that finally authenticated.
func (s *Server) allowedLogin(user string, key gossh.PublicKey) bool {
	_, err := s.check(user, key)
	return err == nil
}

// grantOf is how a key logged in: a plain authorized key or a certificate
// through one principal.
type grantOf struct {
	plain     bool
	grant     keyGrant // plain keys
	principal string   // certificates: the principal that granted the login
	perms     *gossh.Permissions
	scopeCA   gossh.PublicKey // certificates of a scoped CA: that CA
}

// refusal is an authentication failure the operator can act on: a key the
// node knows, asking for a login it does not grant. It travels as an SSH
// banner to the client and as an Event to the hub's audit.
type refusal struct {
	operator string
	reason   string
}

func (r *refusal) Error() string { return "sshserver: " + r.reason }

var (
	errUnknownKey = errors.New("sshserver: key not authorized")
	errKeyRevoked = errors.New("sshserver: key revoked")
)

// check decides whether key may log in as user, now. Errors of type
// *refusal name a known key refused for this login.
func (s *Server) check(user string, key gossh.PublicKey) (grantOf, error) {
	if key == nil {
		return grantOf{}, errUnknownKey
	}
	revoked := s.revoked.Load()
	cert, isCert := key.(*gossh.Certificate)
	if revoked.contains(key) || (isCert && revoked.contains(cert.Key)) {
		return grantOf{}, errKeyRevoked
	}
	if g, ok := s.authorized.Load().grant(key); ok {
		if g.logins == nil || slices.Contains(g.logins, user) {
			return grantOf{plain: true, grant: g}, nil
		}
		return grantOf{}, &refusal{operator: g.name, reason: fmt.Sprintf(
			"key %s (operator %q) may not log in as %q on this node; the operator's roles allow: %s. "+
				"Log in as one of those, or ask a hub admin to add %q to a role of yours "+
				"(tether role create ROLE -l SELECTOR --logins ...)",
			gossh.FingerprintSHA256(key), g.name, user, strings.Join(g.logins, ","), user)}
	}
	if !isCert {
		return grantOf{}, errUnknownKey
	}
	var scopeCA gossh.PublicKey
	var perms *gossh.Permissions
	var principal string
	var err error
	if sc, ok := s.scoped.Load().lookup(cert.SignatureKey); ok && !s.userCAs.Load().contains(cert.SignatureKey) {
		scopeCA = cert.SignatureKey
		perms, principal, err = checkScopedCert(user, cert, sc)
	} else {
		perms, principal, err = s.checkUserCert(user, cert)
	}
	if err != nil {
		var r *refusal
		if errors.As(err, &r) {
			return grantOf{}, err
		}
		return grantOf{}, fmt.Errorf("%w: %w", errUnknownKey, err)
	}
	return grantOf{principal: principal, perms: perms, scopeCA: scopeCA}, nil
}

// mayForward reports whether the login of g may forward ports now.
func (s *Server) mayForward(g grantOf) bool {
	if g.plain {
		return !g.grant.noForward
	}
	if g.scopeCA != nil {
		sc, ok := s.scoped.Load().lookup(g.scopeCA)
		return ok && !slices.Contains(sc.NoForwarding, g.principal)
	}
	if nf := s.noForward.Load(); nf != nil {
		return !slices.Contains(*nf, g.principal)
	}
	return true
}

// publicKeyCallback is x/crypto's PublicKeyCallback (set in serverConfig,
// not through gliderlabs, which can only say yes or no). It runs for key
// queries and for signed attempts alike; x/crypto verifies the signature
// separately. A known key refused for this login gets a banner saying why,
// and is reported (once per connection) as an EventLoginRefused.
func (s *Server) publicKeyCallback(
	ctx ssh.Context, md gossh.ConnMetadata, key gossh.PublicKey,
) (*gossh.Permissions, error) {
	st := connStateFrom(ctx)
	g, err := s.check(md.User(), key)
	if err != nil {
		var r *refusal
		if errors.As(err, &r) {
			if st != nil && st.firstRefusal(md.User(), key) {
				st.log.Info("login refused", "user", md.User(), "key", keyDescription(key), "reason", r.reason)
				s.emit(Event{Kind: EventLoginRefused, Login: md.User(), Operator: r.operator,
					KeyFingerprint: fingerprint(key), Detail: r.reason})
			}
			return nil, &gossh.BannerError{Err: err, Message: "tether: " + r.reason + "\r\n"}
		}
		if st != nil && isCertificate(key) {
			st.log.Debug("user certificate rejected", "user", md.User(), "key", keyDescription(key), "err", err)
		}
		return nil, err
	}
	ctx.SetValue(ssh.ContextKeyPublicKey, key)
	// x/crypto caches the returned pointer per key, so every accepted key
	// gets its own value; it enforces a certificate's source-address from it.
	if g.perms != nil {
		return &gossh.Permissions{CriticalOptions: g.perms.CriticalOptions, Extensions: g.perms.Extensions}, nil
	}
	return &gossh.Permissions{}, nil
}

// userCertKeyIDPrefix starts the key id of the user certificates `tether
// login` issues (hub/access.UserCertKeyIDPrefix); the rest is the operator.
const userCertKeyIDPrefix = "tether:operator:"

// operatorOf is whose key k is, as far as the node knows: the authorized
// key's comment, or the operator a certificate was issued to; "" if unknown.
func (s *Server) operatorOf(k gossh.PublicKey) string {
	if g, ok := s.authorized.Load().grant(k); ok {
		return g.name
	}
	if c, ok := k.(*gossh.Certificate); ok {
		if name, ok := strings.CutPrefix(c.KeyId, userCertKeyIDPrefix); ok {
			return name
		}
	}
	return ""
}

func isCertificate(k gossh.PublicKey) bool {
	_, ok := k.(*gossh.Certificate)
	return ok
}

// fingerprint is the SHA256 fingerprint of a key, or of a certificate's key.
func fingerprint(k gossh.PublicKey) string {
	if c, ok := k.(*gossh.Certificate); ok {
		return gossh.FingerprintSHA256(c.Key)
	}
	return gossh.FingerprintSHA256(k)
}

// checkUserCert checks cert for login user and returns the principal that
// granted it.
func (s *Server) checkUserCert(user string, cert *gossh.Certificate) (*gossh.Permissions, string, error) {
	cas := s.userCAs.Load()
	if cas.empty() {
		return nil, "", errors.New("sshserver: no trusted user CAs")
	}
	if cert.CertType != gossh.UserCert {
		return nil, "", fmt.Errorf("sshserver: certificate type %d is not a user certificate", cert.CertType)
	}
	if !cas.contains(cert.SignatureKey) {
		return nil, "", errors.New("sshserver: certificate signed by an untrusted authority")
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
			// Only a certificate otherwise valid here is worth a reason.
			if err := checker.CheckCert(firstOr(cert.ValidPrincipals, ""), cert); err != nil {
				return nil, "", fmt.Errorf("sshserver: check user certificate: %w", err)
			}
			return nil, "", &refusal{operator: strings.TrimPrefix(cert.KeyId, userCertKeyIDPrefix), reason: fmt.Sprintf(
				"certificate %q (principals %s) does not allow login %q on this node. Log in with a login one of your "+
					"roles allows here, or ask a hub admin to add %q to such a role, then run tether login again",
				cert.KeyId, strings.Join(cert.ValidPrincipals, ","), user, user)}
		}
	}
	// CheckCert covers validity window, principals, critical options and
	// the CA signature.
	if err := checker.CheckCert(principal, cert); err != nil {
		return nil, "", fmt.Errorf("sshserver: check user certificate: %w", err)
	}
	return &cert.Permissions, principal, nil
}

// checkScopedCert checks a certificate of scoped CA sc for login user: it
// must carry one of the principals sc grants for that login.
func checkScopedCert(user string, cert *gossh.Certificate, sc *ScopedCA) (*gossh.Permissions, string, error) {
	if cert.CertType != gossh.UserCert {
		return nil, "", fmt.Errorf("sshserver: certificate type %d is not a user certificate", cert.CertType)
	}
	checker := gossh.CertChecker{SupportedCriticalOptions: []string{"source-address"}}
	principal := ""
	for _, p := range cert.ValidPrincipals {
		if slices.Contains(sc.PerLogin[user], p) || slices.Contains(sc.AnyLogin, p) {
			principal = p
			break
		}
	}
	if principal == "" {
		if err := checker.CheckCert(firstOr(cert.ValidPrincipals, ""), cert); err != nil {
			return nil, "", fmt.Errorf("sshserver: check user certificate: %w", err)
		}
		return nil, "", &refusal{operator: strings.TrimPrefix(cert.KeyId, userCertKeyIDPrefix), reason: fmt.Sprintf(
			"certificate %q of a hub above this node's site (principals %s) does not allow login %q on this node: "+
				"that hub's roles grant it here no such login",
			cert.KeyId, strings.Join(cert.ValidPrincipals, ","), user)}
	}
	if err := checker.CheckCert(principal, cert); err != nil {
		return nil, "", fmt.Errorf("sshserver: check user certificate: %w", err)
	}
	return &cert.Permissions, principal, nil
}

func firstOr(ss []string, def string) string {
	if len(ss) > 0 {
		return ss[0]
	}
	return def
}

// keyDescription names a key in logs the way OpenSSH does.
func keyDescription(k gossh.PublicKey) string {
	if cert, ok := k.(*gossh.Certificate); ok {
		return fmt.Sprintf(
			"%s %s id=%q serial=%d CA %s",
			cert.Type(), gossh.FingerprintSHA256(cert.Key), cert.KeyId, cert.Serial,
			gossh.FingerprintSHA256(cert.SignatureKey),
		)
	}
	return k.Type() + " " + gossh.FingerprintSHA256(k)
}
