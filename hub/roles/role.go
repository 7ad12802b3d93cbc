// Package roles decides which nodes an operator may reach through the bastion.
//
// A role is a node label selector plus the SSH logins (user names on the node)
// it allows. The bastion refuses an operator's jump to a node unless one of
// the operator's roles selects that node's labels; the logins of the roles
// that do are the user names the operator may use there.
//
// Everything here denies by default: an invalid role grants nothing, and the
// zero Selector matches no node.
package roles

import (
	"fmt"
	"slices"

	"github.com/tether-dev/tether/internal/validate"
)

// Bounds on a role.
const (
	MaxRoleNameLen = validate.MaxDNSLabelLen // a DNS label
	MaxLoginLen    = validate.MaxLoginLen    // the common useradd limit
	MaxLogins      = 64                      // logins in one role
)

// AnyLogin in Logins allows every login name (the built-in "all" role).
const AnyLogin = "*"

// BuiltinAll is the role an operator gets when added without --role: every
// node, any login, as before roles existed. Give operators narrower roles
// for least privilege.
var BuiltinAll = Role{Name: "all", Nodes: "*", Logins: []string{AnyLogin}}

// BuiltinAdmin is the role that makes an operator a hub admin: `tether
// login` gives its holders a short-lived admin client certificate for the
// HTTP API besides their SSH certificate, and `tether operator rm` (or
// taking the role away) ends their API access at the next request. Like
// "all" it selects every node with any login, since an admin can grant
// themselves that anyway; holding the role by name is what makes an admin.
var BuiltinAdmin = Role{Name: "admin", Nodes: "*", Logins: []string{AnyLogin}}

// Role is a named node selector plus the logins it allows on those nodes.
type Role struct {
	// Name identifies the role: a DNS label (lowercase letters, digits and
	// inner dashes, at most 63 characters, not all digits; validate.RoleName).
	Name string `json:"name"`
	// Nodes is the node label selector as given by the operator (see
	// Selector for the syntax). "" and "*" select every node.
	Nodes string `json:"nodes"`
	// Logins are the SSH user names the role allows on selected nodes,
	// e.g. ["root", "ubuntu"], each valid for validate.Login (or AnyLogin).
	// At least one is required.
	Logins []string `json:"logins"`
	// NoForwarding refuses port forwarding (ssh -L to the node's loopback,
	// ssh -R on it) to logins this role grants. The zero value allows it:
	// a login that may run a shell can forward ports anyway (socat, an ssh
	// client on the node), so refusing it is a policy signal, not a wall;
	// `tether role create --forwarding=false` sets it.
	NoForwarding bool `json:"no_forwarding,omitempty"`
	// Confirm lets the role's holders confirm over-the-air upgrades that
	// wait for a person on the nodes the role selects (`tether upgrade
	// confirm`). The zero value does not: saying yes to new software on a
	// machine in the field is its own decision, apart from reaching it.
	Confirm bool `json:"confirm,omitempty"`
	// Services are the service-tunnel permissions the role grants on the
	// nodes it selects: ServiceExpose (publish one of their allow-listed
	// ports under a name) and ServiceConnect (make them consumers of a
	// service). The zero value grants neither: carrying bytes between
	// machines is its own decision, apart from reaching them.
	Services []string `json:"services,omitempty"`
}

// Service-tunnel permissions of a role (Role.Services).
const (
	ServiceExpose  = "expose"
	ServiceConnect = "connect"
)

// AllowsService reports whether the role grants service permission perm
// (ServiceExpose or ServiceConnect) on the nodes it selects.
func (r Role) AllowsService(perm string) bool { return slices.Contains(r.Services, perm) }

// Validate checks the name, the selector and the logins, and names the first
// problem found. A bad selector is reported as a *SelectorError.
func (r Role) Validate() error {
	_, err := r.check()
	return err
}

// check is Validate, also returning the parsed selector.
func (r Role) check() (Selector, error) {
	if err := validate.RoleName(r.Name); err != nil {
		return Selector{}, fmt.Errorf("roles: %w", err)
	}
	sel, err := ParseSelector(r.Nodes)
	if err != nil {
		if se, ok := err.(*SelectorError); ok {
			se.Role = r.Name
		}
		return Selector{}, err
	}
	if len(r.Logins) == 0 {
		return Selector{}, fmt.Errorf("roles: role %q: no logins; give at least one SSH user name", r.Name)
	}
	if len(r.Logins) > MaxLogins {
		return Selector{}, fmt.Errorf("roles: role %q: %d logins, at most %d", r.Name, len(r.Logins), MaxLogins)
	}
	for _, p := range r.Services {
		if p != ServiceExpose && p != ServiceConnect {
			return Selector{}, fmt.Errorf(
				"roles: role %q: service permission %q: want %s or %s",
				r.Name, p, ServiceExpose, ServiceConnect,
			)
		}
	}
	for _, l := range r.Logins {
		if l == AnyLogin {
			continue
		}
		// One rule with the node's side: a login the node's managed sshd
		// cannot name a principals file after must not be granted here.
		if err := validate.Login(l); err != nil {
			return Selector{}, fmt.Errorf("roles: role %q: %w", r.Name, err)
		}
	}
	return sel, nil
}

// Allowed reports whether any of roles selects a node with these labels, and
// the union of the logins those roles allow, sorted and deduplicated. Roles
// that fail Validate are skipped: a broken role grants nothing.
func Allowed(roles []Role, labels map[string]string) (ok bool, logins []string) {
	for _, r := range roles {
		sel, err := r.check()
		if err != nil || !sel.Matches(labels) {
			continue
		}
		ok = true
		logins = append(logins, r.Logins...)
	}
	slices.Sort(logins)
	return ok, slices.Compact(logins)
}
