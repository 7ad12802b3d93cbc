package access

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"slices"
	"strings"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/validate"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// Every security decision about reaching a node is in this file. Each
// denies unless something explicitly allows.

// ProvisionPrincipal is the user-certificate principal of the hub's own
// provisioning certificate. Nodes accept it for their provisioning login
// only (PrincipalsFor), so a leaked provisioning certificate grants nothing
// else; it expires within minutes anyway.
const ProvisionPrincipal = "tether-hub"

// ProvisionLoginLabel on a node overrides the hub's provisioning login.
const ProvisionLoginLabel = "provision-login"

// UserCertKeyIDPrefix starts the key id of user certificates from `tether
// login`; the rest is the operator's name.
const UserCertKeyIDPrefix = "tether:operator:"

// CertPrincipal names what a user certificate grants: login L through role
// R. A node accepts it only if R selects the node (PrincipalsFor), so logins
// granted by one role never leak to nodes of another.
func CertPrincipal(role, login string) string { return "tether:" + role + ":" + login }

// Caller is who asks through the API: the admin, an API token bound to a
// role, or an operator with the API identity `tether login` gave them.
type Caller struct {
	Admin    bool
	Role     string // the API token's role; unused for the admin
	Operator string // the operator's name, for an operator's API identity
	Name     string // for audit: "admin", "apitoken:ID", "operator:NAME", "onboarding:ID"
	// Onboarding is set for an onboarding credential: it carries
	// RoleOnboarder and nothing else (see AuthorizeOnboard).
	Onboarding bool
}

// RoleOnboarder is the built-in permission of onboarding credentials
// (`tether onboarding create --role onboarder`): create one node per
// machine through the onboarding endpoint, and nothing else. It is not a
// stored role: it selects no node, so it lists, jumps to and runs jobs on
// none, and no API token or operator can hold it.
const RoleOnboarder = "onboarder"

// AuthorizeOnboard decides whether c may create a node for a machine: only
// an onboarding credential carrying RoleOnboarder may. That it is one node
// per machine is the store's (the machine binding); everything else an
// onboarding caller asks is denied below, since it has no role the
// snapshot knows, no operator name and is not the admin.
func (d *Door) AuthorizeOnboard(c Caller) error {
	if !c.Onboarding || c.Role != RoleOnboarder || c.Admin || c.Operator != "" {
		return refuse(ErrDenied,
			"%s may not onboard machines: only an onboarding credential (`tether onboarding create --role %s`) may",
			c.Name, RoleOnboarder)
	}
	return nil
}

// KubeOne clusters' identities. Each cluster has one SSH key (made by the
// hub, private half in its data dir). It logs in to the bastion as the
// cluster's bastion user, plain or as the cluster's user certificate, and
// may jump to the cluster's members only; on a member it is accepted for
// the cluster's login only: as an authorized key on the embedded SSH
// server, as a certificate principal on embedded and managed sshd alike.
// Nothing else accepts it: no role selects it, no other node is sent it.
const (
	// KubeOneUserPrefix starts a cluster's bastion user.
	KubeOneUserPrefix = "kubeone-"
	// KubeOneCertKeyIDPrefix starts the key id of a cluster's user
	// certificate; the rest is the cluster's ID.
	KubeOneCertKeyIDPrefix = "tether:kubeone:"
)

// KubeOneBastionUser is the bastion user of cluster's identity.
func KubeOneBastionUser(cluster string) string { return KubeOneUserPrefix + cluster }

// KubeOnePrincipal is the user-certificate principal a cluster's members
// accept for the cluster's login. It names the cluster's ID, not its name,
// so a certificate of a deleted cluster grants nothing to a new cluster of
// the same name.
func KubeOnePrincipal(clusterID, login string) string {
	return KubeOneCertKeyIDPrefix + clusterID + ":" + login
}

// kubeOneIdentity is the cluster identity user authenticates as with key
// (the cluster's key, or a certificate over it), if it is one.
func (s *Snapshot) kubeOneIdentity(user string, key gossh.PublicKey) (*KubeOneIdentity, bool) {
	id, ok := s.kubeone[user]
	if !ok || key == nil {
		return nil, false
	}
	if cert, isCert := key.(*gossh.Certificate); isCert {
		key = cert.Key
	}
	if !sameKey(id.Key, key) {
		return nil, false
	}
	return id, true
}

// authorizeKubeOneCert decides whether a certificate logs in as cluster
// identity id: issued by the hub for this cluster (key id and principal),
// signed by a trusted user CA, within its validity.
func (d *Door) authorizeKubeOneCert(id *KubeOneIdentity, cert *gossh.Certificate) error {
	principal := KubeOnePrincipal(id.ID, id.Login)
	if cert.CertType != gossh.UserCert || cert.KeyId != KubeOneCertKeyIDPrefix+id.ID ||
		!slices.Contains(cert.ValidPrincipals, principal) {
		return refuse(ErrDenied, "certificate was not issued to KubeOne cluster %q", id.Cluster)
	}
	if !slices.ContainsFunc(d.cfg.UserCAs(), func(k gossh.PublicKey) bool { return sameKey(k, cert.SignatureKey) }) {
		return refuse(ErrDenied, "certificate is not signed by the hub's user CA")
	}
	if err := (&gossh.CertChecker{}).CheckCert(principal, cert); err != nil {
		return refuse(ErrDenied, "certificate refused: %v", err)
	}
	return nil
}

// AuthorizeLogin decides whether key may log in to the bastion as operator:
// one of the operator's registered keys itself, or a user certificate from
// `tether login` over one. A KubeOne cluster's key (or its certificate)
// logs in as the cluster's bastion user.
func (d *Door) AuthorizeLogin(operator string, key gossh.PublicKey) error {
	if id, ok := d.Snapshot().kubeOneIdentity(operator, key); ok {
		if cert, isCert := key.(*gossh.Certificate); isCert {
			return d.authorizeKubeOneCert(id, cert)
		}
		return nil
	}
	if cert, ok := key.(*gossh.Certificate); ok {
		return d.AuthorizeCert(operator, cert)
	}
	o, ok := d.Snapshot().Operator(operator)
	if !ok || !o.HasKey(key) {
		return refuse(ErrDenied, "key is not registered for operator %q", operator)
	}
	return nil
}

// AuthorizeCert decides whether a user certificate logs in operator: a user
// certificate signed by a trusted user CA, within its validity, issued to
// this operator (key id), over one of the operator's currently registered
// keys. A removed operator's certificates, and those over a removed key,
// stop working at once.
func (d *Door) AuthorizeCert(operator string, cert *gossh.Certificate) error {
	if cert.CertType != gossh.UserCert || cert.KeyId != UserCertKeyIDPrefix+operator {
		return refuse(ErrDenied, "certificate was not issued to operator %q", operator)
	}
	if !slices.ContainsFunc(d.cfg.UserCAs(), func(k gossh.PublicKey) bool { return sameKey(k, cert.SignatureKey) }) {
		return refuse(ErrDenied, "certificate is not signed by the hub's user CA")
	}
	o, ok := d.Snapshot().Operator(operator)
	if !ok || !o.HasKey(cert.Key) {
		return refuse(ErrDenied, "certificate's key is not registered for operator %q", operator)
	}
	principal := ""
	if len(cert.ValidPrincipals) > 0 {
		principal = cert.ValidPrincipals[0]
	}
	// CheckCert: validity window, critical options, signature.
	if err := (&gossh.CertChecker{}).CheckCert(principal, cert); err != nil {
		return refuse(ErrDenied, "certificate refused: %v", err)
	}
	return nil
}

// AuthorizeJump decides whether operator may open a stream to node n
// through the bastion: one of the operator's roles must select it. Which
// login the operator may use there is the node's decision (KeysFor,
// PrincipalsFor), since the login travels end-to-end encrypted.
func (d *Door) AuthorizeJump(operator string, n store.Node) error {
	o, ok := d.Snapshot().Operator(operator)
	if !ok {
		return refuse(ErrDenied, "operator %q is no longer registered", operator)
	}
	if ok, _ := roles.AllowedCompiled(o.Roles, n.Labels); !ok {
		return refuse(ErrDenied, "operator %q's roles (%s) do not select node %q", operator, o.roleNames(), n.Name)
	}
	return nil
}

// AuthorizeJumpAs decides whether user, logged in to the bastion with key,
// may open a stream to node n: a KubeOne cluster's identity only to the
// cluster's members, an operator as AuthorizeJump decides.
func (d *Door) AuthorizeJumpAs(user string, key gossh.PublicKey, n store.Node) error {
	if id, ok := d.Snapshot().kubeOneIdentity(user, key); ok {
		if !id.Members[n.ID] {
			return refuse(ErrDenied, "node %q is not a member of KubeOne cluster %q", n.Name, id.Cluster)
		}
		return nil
	}
	return d.AuthorizeJump(user, n)
}

// AuthorizeLiveJump decides whether a jump already under way may go on
// after an access change: the operator must still be registered, the key
// they authenticated with (a certificate's underlying key) still theirs,
// and their roles must still select node n. A certificate's validity
// window is not checked again: like sshd, a session outlives the
// certificate that opened it, but not the withdrawal of access.
func (d *Door) AuthorizeLiveJump(operator string, key gossh.PublicKey, n store.Node) error {
	if _, ok := d.Snapshot().kubeOneIdentity(operator, key); ok {
		// A member that left, or a deleted cluster, ends the jump.
		return d.AuthorizeJumpAs(operator, key, n)
	}
	if cert, ok := key.(*gossh.Certificate); ok {
		key = cert.Key
	}
	o, ok := d.Snapshot().Operator(operator)
	switch {
	case !ok:
		return refuse(ErrDenied, "operator %q was removed", operator)
	case key == nil || !o.HasKey(key):
		return refuse(ErrDenied, "the key operator %q jumped with was revoked", operator)
	}
	return d.AuthorizeJump(operator, n)
}

// AuthorizeTerminal decides whether operator may have, or keep, a shell
// as login on node n through the hub's browser terminal, and returns the
// principals of the user certificate the hub signs for it: one of the
// operator's roles must select n (as for a jump) and allow login there, by
// name or with "*". A jump's login travels encrypted and is the node's to
// decide; the terminal's is known to the hub, which decides it here when
// the terminal opens and at each re-check, so a role change that takes the
// login away ends the terminal as a withdrawn jump ends.
func (d *Door) AuthorizeTerminal(operator, login string, n store.Node) ([]string, error) {
	o, ok := d.Snapshot().Operator(operator)
	if !ok {
		return nil, refuse(ErrDenied, "operator %q is no longer registered", operator)
	}
	selects, logins := roles.AllowedCompiled(o.Roles, n.Labels)
	if !selects {
		return nil, refuse(ErrDenied, "operator %q's roles (%s) do not select node %q", operator, o.roleNames(), n.Name)
	}
	var principals []string
	for _, r := range o.Roles {
		if !r.Selects(n.Labels) {
			continue
		}
		switch {
		case slices.Contains(r.Logins, login):
			principals = append(principals, CertPrincipal(r.Name, login))
		case slices.Contains(r.Logins, roles.AnyLogin):
			principals = append(principals, CertPrincipal(r.Name, roles.AnyLogin))
		}
	}
	if len(principals) == 0 {
		return nil, refuse(ErrDenied, "operator %q may not log in as %q on node %q; their roles allow: %s",
			operator, login, n.Name, strings.Join(logins, ", "))
	}
	return principals, nil
}

// AuthorizeJob decides whether c may run jobs on node n, which run as the
// node's provisioning login: the admin may run anywhere; an API token's
// role must select the node and allow that login.
func (d *Door) AuthorizeJob(c Caller, n store.Node) error {
	if c.Onboarding {
		return refuse(ErrDenied, "%s is an onboarding credential: it may only onboard machines", c.Name)
	}
	if c.Admin {
		return nil
	}
	r, ok := d.Snapshot().Role(c.Role)
	if !ok {
		return refuse(ErrDenied, "role %q no longer exists", c.Role)
	}
	login := d.ProvisionLoginFor(n.Labels)
	if !r.Selects(n.Labels) || !r.AllowsLogin(login) {
		return refuse(ErrDenied, "role %q does not allow login %q on node %q", c.Role, login, n.Name)
	}
	return nil
}

// AuthorizeConfirm decides whether c may confirm an upgrade waiting for a
// person on node n: the admin may; an API token's role, or one of an
// operator's roles, must select the node and carry the confirm permission.
// Reaching the node is not enough: saying yes to new software on a machine
// in the field is its own grant.
func (d *Door) AuthorizeConfirm(c Caller, n store.Node) error {
	switch {
	case c.Onboarding:
		return refuse(ErrDenied, "%s is an onboarding credential: it may only onboard machines", c.Name)
	case c.Admin:
		return nil
	case c.Operator != "":
		o, ok := d.Snapshot().Operator(c.Operator)
		if !ok {
			return refuse(ErrDenied, "no operator named %q", c.Operator)
		}
		if slices.ContainsFunc(o.Roles, func(r roles.Compiled) bool { return r.Confirm && r.Selects(n.Labels) }) {
			return nil
		}
		return refuse(ErrDenied, "no role of operator %q selects node %q with the confirm permission", c.Operator, n.Name)
	case c.Role != "":
		r, ok := d.Snapshot().Role(c.Role)
		if !ok {
			return refuse(ErrDenied, "role %q no longer exists", c.Role)
		}
		if !r.Confirm || !r.Selects(n.Labels) {
			return refuse(ErrDenied, "role %q may not confirm upgrades on node %q "+
				"(it needs `tether role create --confirm` and to select the node)", c.Role, n.Name)
		}
		return nil
	}
	return refuse(ErrDenied, "no identity given")
}

// AuthorizeService decides whether c may use service-tunnel permission
// perm (roles.ServiceExpose or roles.ServiceConnect) on node n: the admin
// may; otherwise a role of the operator, or the API token's role, must
// select the node and carry the permission. Exposing publishes one of n's
// allow-listed ports; connecting makes n a consumer, so it is needed on
// the consumer and on the service's target alike: nobody makes a node
// reach another they could not grant a tunnel to.
func (d *Door) AuthorizeService(c Caller, perm string, n store.Node) error {
	if perm != roles.ServiceExpose && perm != roles.ServiceConnect {
		return refuse(ErrDenied, "unknown service permission %q", perm)
	}
	switch {
	case c.Onboarding:
		return refuse(ErrDenied, "%s is an onboarding credential: it may only onboard machines", c.Name)
	case c.Admin:
		return nil
	case c.Operator != "":
		o, ok := d.Snapshot().Operator(c.Operator)
		if !ok {
			return refuse(ErrDenied, "no operator named %q", c.Operator)
		}
		if slices.ContainsFunc(o.Roles, func(r roles.Compiled) bool { return r.AllowsService(perm) && r.Selects(n.Labels) }) {
			return nil
		}
		return refuse(ErrDenied, "no role of operator %q selects node %q with the service permission %q "+
			"(`tether role create --services %s`)", c.Operator, n.Name, perm, perm)
	case c.Role != "":
		r, ok := d.Snapshot().Role(c.Role)
		if !ok {
			return refuse(ErrDenied, "role %q no longer exists", c.Role)
		}
		if !r.AllowsService(perm) || !r.Selects(n.Labels) {
			return refuse(ErrDenied, "role %q may not %s services on node %q "+
				"(it needs `tether role create --services %s` and to select the node)", c.Role, perm, n.Name, perm)
		}
		return nil
	}
	return refuse(ErrDenied, "no identity given")
}

// AuthorizeUpgrade decides whether c may roll out an upgrade to node n:
// an upgrade replaces software as root, so only the admin may (jobs run as
// the node's provisioning login, which a role can grant; an upgrade has no
// login to scope it by).
func (d *Door) AuthorizeUpgrade(c Caller, n store.Node) error {
	if c.Admin {
		return nil
	}
	return refuse(ErrDenied, "%s may not upgrade node %q: rolling out upgrades is for the hub admin", c.Name, n.Name)
}

// AuthorizeList decides whether c may see node n in a listing or an
// inventory: the admin sees every node; an operator the nodes one of their
// roles selects (those they may jump to); an API token the nodes its role
// selects. Selection reads the hub-set labels only: labels a node reports
// about itself never decide who sees or reaches it.
func (d *Door) AuthorizeList(c Caller, n store.Node) error {
	switch {
	case c.Onboarding:
		return refuse(ErrDenied, "%s is an onboarding credential: it may only onboard machines", c.Name)
	case c.Admin:
		return nil
	case c.Operator != "":
		return d.AuthorizeJump(c.Operator, n)
	case c.Role != "":
		r, ok := d.Snapshot().Role(c.Role)
		if !ok {
			return refuse(ErrDenied, "role %q no longer exists", c.Role)
		}
		if !r.Selects(n.Labels) {
			return refuse(ErrDenied, "role %q does not select node %q", c.Role, n.Name)
		}
		return nil
	}
	return refuse(ErrDenied, "no identity given")
}

// LoginGrant is what `tether login` certifies for an operator: the
// role-scoped principals of every role the operator holds.
func (d *Door) LoginGrant(operator string) (*Operator, []string, error) {
	o, ok := d.Snapshot().Operator(operator)
	if !ok {
		return nil, nil, refuse(ErrDenied, "no operator named %q", operator)
	}
	var principals []string
	for _, r := range o.Roles {
		for _, l := range r.Logins {
			principals = append(principals, CertPrincipal(r.Name, l))
		}
	}
	slices.Sort(principals)
	principals = slices.Compact(principals)
	if len(principals) == 0 {
		return nil, nil, refuse(ErrDenied, "operator %q has no roles, so no certificate would grant anything", operator)
	}
	return o, principals, nil
}

// AdminKeyTag names an operator's key in the admin certificates `tether
// login` gives them, so a certificate stops working when the key changes.
func AdminKeyTag(k gossh.PublicKey) string {
	sum := sha256.Sum256(k.Marshal())
	return hex.EncodeToString(sum[:16])
}

// AuthorizeAdmin decides whether an admin certificate issued to operator
// over the key tagged keyTag still admits them to the admin API: the
// operator must still be registered, with that key among theirs, holding
// the admin role.
// Certificate validity and `tether ca revoke-admin` are checked by the
// caller, which holds the CA.
func (d *Door) AuthorizeAdmin(operator, keyTag string) error {
	o, err := apiIdentity(d.Snapshot(), operator, keyTag)
	if err != nil {
		return err
	}
	if !slices.ContainsFunc(o.Roles, func(r roles.Compiled) bool { return r.Name == roles.BuiltinAdmin.Name }) {
		return refuse(ErrDenied, "operator %q no longer holds the %q role", operator, roles.BuiltinAdmin.Name)
	}
	return nil
}

// AuthorizeAPIIdentity decides whether an operator's API client
// certificate, issued over the key tagged keyTag, still names them: the
// operator must still be registered with that key. What it admits them to
// is AuthorizeList's decision.
func (d *Door) AuthorizeAPIIdentity(operator, keyTag string) error {
	_, err := apiIdentity(d.Snapshot(), operator, keyTag)
	return err
}

// apiIdentity is the operator an API client certificate over the key
// tagged keyTag names, if they are still registered with that key.
func apiIdentity(s *Snapshot, operator, keyTag string) (*Operator, error) {
	o, ok := s.Operator(operator)
	switch {
	case !ok:
		return nil, refuse(ErrDenied, "operator %q is no longer registered", operator)
	case !slices.ContainsFunc(o.Keys, func(k gossh.PublicKey) bool { return AdminKeyTag(k) == keyTag }):
		return nil, refuse(ErrDenied,
			"operator %q's registered key changed since this certificate was issued (that key was removed); "+
				"run `tether login` again", operator)
	}
	return o, nil
}

// ProvisionLoginFor is the login jobs use on a node with these labels.
func (d *Door) ProvisionLoginFor(labels map[string]string) string {
	return d.Snapshot().ProvisionLoginFor(labels)
}

// ProvisionLoginFor is the login jobs use on a node with these labels.
func (s *Snapshot) ProvisionLoginFor(labels map[string]string) string {
	if l := labels[ProvisionLoginLabel]; validate.Login(l) == nil {
		return l
	}
	return s.provisionLogin
}

// KeysFor are the operator keys a node's embedded SSH server accepts: only
// operators whose roles select the node, each restricted to the logins
// those roles allow (a tether-logins="a,b" key option; no option means any
// login), one line per key, sorted by operator name. A key none of whose
// roles selecting the node allows port forwarding carries OpenSSH's
// no-port-forwarding option (absent, as from hubs before the option, the
// node allows forwarding).
func (s *Snapshot) KeysFor(labels map[string]string) []string {
	names := make([]string, 0, len(s.operators))
	for n := range s.operators {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []string
	for _, name := range names {
		o := s.operators[name]
		ok, logins := roles.AllowedCompiled(o.Roles, labels)
		if !ok {
			continue
		}
		var opts []string
		if !slices.ContainsFunc(o.Roles, func(r roles.Compiled) bool { return !r.NoForwarding && r.Selects(labels) }) {
			opts = append(opts, "no-port-forwarding")
		}
		if !slices.Contains(logins, roles.AnyLogin) {
			opts = append(opts, fmt.Sprintf("tether-logins=%q", strings.Join(logins, ",")))
		}
		for _, k := range o.Keys {
			line := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k)))
			if len(opts) > 0 {
				line = strings.Join(opts, ",") + " " + line
			}
			out = append(out, line+" "+name)
		}
	}
	return out
}

// KubeOneKeysFor are the authorized-keys lines of the KubeOne cluster node
// nodeID is a member of (none if it is in none): the cluster's key, for the
// cluster's login only. Port forwarding stays allowed: KubeOne reaches the
// node's own kube-apiserver and etcd through the node's SSH connection.
func (s *Snapshot) KubeOneKeysFor(nodeID string) []string {
	id, ok := s.kubeoneByNode[nodeID]
	if !ok {
		return nil
	}
	line := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(id.Key)))
	return []string{fmt.Sprintf("tether-logins=%q %s %s", id.Login, line, KubeOneBastionUser(id.Cluster))}
}

// KubeOneKey is the key of the KubeOne cluster identity whose bastion user
// is user, for naming it in what nodes report (ok false if there is none).
func (s *Snapshot) KubeOneKey(user string) (gossh.PublicKey, bool) {
	id, ok := s.kubeone[user]
	if !ok {
		return nil, false
	}
	return id.Key, true
}

// KubeOnePrincipalFor is the certificate principal node nodeID accepts for
// login as a member of its KubeOne cluster (ok false if it is in none).
func (s *Snapshot) KubeOnePrincipalFor(nodeID string) (login, principal string, ok bool) {
	id, ok := s.kubeoneByNode[nodeID]
	if !ok {
		return "", "", false
	}
	return id.Login, KubeOnePrincipal(id.ID, id.Login), true
}

// PrincipalsFor are the user-certificate principals a node with these labels
// accepts, per login, and those valid for any login (roles allowing "*").
// The hub's provisioning principal is valid for the node's provisioning
// login only.
func (s *Snapshot) PrincipalsFor(labels map[string]string) (perLogin map[string][]string, anyLogin []string) {
	perLogin = map[string][]string{}
	for _, r := range s.roles {
		if !r.Selects(labels) {
			continue
		}
		for _, l := range r.Logins {
			if l == roles.AnyLogin {
				anyLogin = append(anyLogin, CertPrincipal(r.Name, l))
				continue
			}
			perLogin[l] = append(perLogin[l], CertPrincipal(r.Name, l))
		}
	}
	login := s.ProvisionLoginFor(labels)
	perLogin[login] = append(perLogin[login], ProvisionPrincipal)
	return perLogin, anyLogin
}

// NoForwardingFor are the user-certificate principals (of PrincipalsFor)
// whose role does not allow port forwarding on a node with these labels.
func (s *Snapshot) NoForwardingFor(labels map[string]string) []string {
	var out []string
	for _, r := range s.roles {
		if !r.NoForwarding || !r.Selects(labels) {
			continue
		}
		for _, l := range r.Logins {
			out = append(out, CertPrincipal(r.Name, l))
		}
	}
	return out
}

func sameKey(a, b gossh.PublicKey) bool { return string(a.Marshal()) == string(b.Marshal()) }

// SiteLabel is the label a node below a site carries at every hub above
// it: its site path relative to that hub ("berlin", "sub.berlin").
const SiteLabel = "site"

// SiteNodeLabels are the labels this hub's decisions see on a node below
// one of its sites: the labels its own hub selects it by, with
// SiteLabel=suffix (its site path relative to this hub) replacing any
// site label of its own, so a role here selecting site=berlin selects
// exactly the nodes below berlin, whatever a site calls its own nodes.
// Roles, -l selectors and listings at this hub all match these.
func SiteNodeLabels(suffix string, labels map[string]string) map[string]string {
	out := make(map[string]string, len(labels)+1)
	maps.Copy(out, labels)
	out[SiteLabel] = suffix
	return out
}

// AuthorizeRoute decides, at a site hub, whether a route request its
// parent sent may be served. The parent authorized the caller with its own
// roles; this hub grants nothing because of the request's operator or
// origin. It re-checks only what is its own to check: the request came on
// its uplink (the caller serves only streams accepted there), its purpose
// is one a parent may route (a service tunnel goes through the services'
// own check), and its target is a node of this hub's own subtree, which
// Resolve then finds in this hub's nodes or its own sites' inventories,
// never anywhere else.
func (d *Door) AuthorizeRoute(req *siteproto.RouteRequest) error {
	if err := req.Validate(); err != nil {
		return refuse(ErrDenied, "route request refused: %v", err)
	}
	switch req.Purpose {
	case siteproto.PurposeJump, siteproto.PurposeJob, siteproto.PurposeConsole, siteproto.PurposeUpgrade:
	default:
		return refuse(ErrDenied, "route request for purpose %q is not served on the parent's route stream", req.Purpose)
	}
	if req.Service != uint8(tunnel.ServiceSSH) && req.Service != uint8(tunnel.ServiceTCP) {
		return refuse(ErrDenied, "route request for service %d refused: only ssh and tcp reach a node", req.Service)
	}
	return nil
}

// TrustForSite is this hub's entry of the SiteTrust it sends a child site
// (suffix: how this hub names the site): its user CAs, every role with its
// selector and logins, the revoked operator keys and the provisioning
// login. The site grants with it only what these roles grant here.
func (s *Snapshot) TrustForSite(hubID, suffix string, userCAs []string) siteproto.AncestorTrust {
	a := siteproto.AncestorTrust{HubID: hubID, Suffix: suffix, UserCAs: userCAs, RevokedKeys: s.revoked,
		ProvisionLogin: s.provisionLogin}
	for _, r := range s.roles {
		a.Roles = append(a.Roles, siteproto.TrustRole{Name: r.Name, Selector: r.Nodes, Logins: r.Logins,
			NoForwarding: r.NoForwarding})
	}
	return a
}

// AncestorTrust is the trust of the hubs above this site, with their
// roles compiled once per change: what ScopedCAsFor decides on.
type AncestorTrust struct {
	Msg       *siteproto.Trust
	ancestors []compiledAncestor
}

type compiledAncestor struct {
	a     siteproto.AncestorTrust
	roles []roles.Compiled
}

// CompileAncestorTrust compiles t's roles. A role whose selector or
// logins do not validate here grants nothing.
func CompileAncestorTrust(t *siteproto.Trust) *AncestorTrust {
	out := &AncestorTrust{Msg: t}
	for _, a := range t.Ancestors {
		ca := compiledAncestor{a: a}
		for _, r := range a.Roles {
			c, err := roles.Compile(roles.Role{Name: r.Name, Nodes: r.Selector, Logins: r.Logins, NoForwarding: r.NoForwarding})
			if err != nil {
				continue
			}
			ca.roles = append(ca.roles, c)
		}
		out.ancestors = append(out.ancestors, ca)
	}
	return out
}

// ScopedCAsFor decides, on a site, what each hub above it may do on one of
// the site's own nodes with these labels: its user CA is trusted only for
// the principals of its roles that select the node as that hub sees it
// (the node's labels with site=SUFFIX, SiteNodeLabels), and for its
// provisioning principal on its provisioning login. An ancestor granting
// nothing here is left out: its certificates log in nowhere on the node.
// Revoked are the keys every ancestor revoked: refused on the node too.
func (t *AncestorTrust) ScopedCAsFor(labels map[string]string) (scoped []control.ScopedUserCA, revoked []string) {
	if t == nil {
		return nil, nil
	}
	for _, ca := range t.ancestors {
		revoked = append(revoked, ca.a.RevokedKeys...)
		seen := SiteNodeLabels(ca.a.Suffix, labels)
		sc := control.ScopedUserCA{Keys: ca.a.UserCAs, Principals: map[string][]string{}}
		for _, r := range ca.roles {
			if !r.Selects(seen) {
				continue
			}
			for _, l := range r.Logins {
				p := CertPrincipal(r.Name, l)
				if l == roles.AnyLogin {
					sc.AnyLogin = append(sc.AnyLogin, p)
				} else {
					sc.Principals[l] = append(sc.Principals[l], p)
				}
				if r.NoForwarding {
					sc.NoForwarding = append(sc.NoForwarding, p)
				}
			}
		}
		login := seen[ProvisionLoginLabel]
		if validate.Login(login) != nil {
			login = ca.a.ProvisionLogin
		}
		if validate.Login(login) == nil {
			sc.Principals[login] = append(sc.Principals[login], ProvisionPrincipal)
		}
		if len(sc.Keys) > 0 {
			scoped = append(scoped, sc)
		}
	}
	return scoped, revoked
}
