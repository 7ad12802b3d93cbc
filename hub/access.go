package hub

import (
	"context"
	"fmt"
	"slices"
	"strings"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/bastion"
	"github.com/tether-dev/tether/hub/registry"
	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/control"
)

// access is an immutable snapshot of who may reach what: operators with
// their keys and roles. The bastion and the key pushes read it without
// touching the store; it is rebuilt whenever operators or roles change.
type access struct {
	operators map[string]operatorAccess
	roles     map[string]roles.Role
}

type operatorAccess struct {
	key   gossh.PublicKey
	roles []roles.Role
}

func (s *Server) reloadAccess(ctx context.Context) error {
	ops, err := s.store.ListOperators(ctx)
	if err != nil {
		return err
	}
	rs, err := s.store.ListRoles(ctx)
	if err != nil {
		return err
	}
	a := &access{operators: make(map[string]operatorAccess, len(ops)), roles: make(map[string]roles.Role, len(rs))}
	for _, r := range rs {
		a.roles[r.Name] = roles.Role{Name: r.Name, Nodes: r.Nodes, Logins: r.Logins}
	}
	for _, o := range ops {
		k, err := api.ParseAuthorizedKey(o.PublicKey)
		if err != nil {
			s.log.Warn("skipping operator with unreadable key", "operator", o.Name, "err", err)
			continue
		}
		oa := operatorAccess{key: k}
		for _, name := range o.Roles {
			if r, ok := a.roles[name]; ok {
				oa.roles = append(oa.roles, r)
			}
		}
		a.operators[o.Name] = oa
	}
	s.access.Store(a)
	return nil
}

func (s *Server) authorizeOperator(user string, key gossh.PublicKey) bool {
	if cert, ok := key.(*gossh.Certificate); ok {
		return s.authorizeCert(user, cert)
	}
	o, ok := s.access.Load().operators[user]
	return ok && string(o.key.Marshal()) == string(key.Marshal())
}

// allowJump checks the operator's roles against the node's labels.
func (s *Server) allowJump(operator string, n store.Node) error {
	o, ok := s.access.Load().operators[operator]
	if !ok {
		return fmt.Errorf("operator %q is no longer registered", operator)
	}
	if ok, _ := roles.Allowed(o.roles, n.Labels); !ok {
		names := make([]string, 0, len(o.roles))
		for _, r := range o.roles {
			names = append(names, r.Name)
		}
		return fmt.Errorf("%w: operator %q's roles (%s) do not select node %q", bastion.ErrDenied, operator, strings.Join(names, ", "), n.Name)
	}
	return nil
}

// authorizedKeysFor are the operator keys pushed to a node's embedded SSH
// server: only operators whose roles select the node, each restricted to the
// logins those roles allow (as a tether-logins="a,b" key option; no option
// means any login).
func (s *Server) authorizedKeysFor(labels map[string]string) []string {
	a := s.access.Load()
	names := make([]string, 0, len(a.operators))
	for n := range a.operators {
		names = append(names, n)
	}
	slices.Sort(names)
	var out []string
	for _, name := range names {
		o := a.operators[name]
		ok, logins := roles.Allowed(o.roles, labels)
		if !ok {
			continue
		}
		line := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(o.key)))
		if !slices.Contains(logins, roles.AnyLogin) {
			line = fmt.Sprintf("tether-logins=%q %s", strings.Join(logins, ","), line)
		}
		out = append(out, line+" "+name)
	}
	return out
}

func (s *Server) pushKeys(c *registry.Conn) {
	c.PushMu.Lock() // see pushSSHTrust
	defer c.PushMu.Unlock()
	n, err := s.store.GetNode(context.Background(), c.NodeID)
	if err != nil {
		s.log.Info("push authorized keys: load node", "node", c.Name, "err", err)
		return
	}
	if err := c.Send(&control.Message{Type: control.TypeAuthorizedKeys, AuthorizedKeys: s.authorizedKeysFor(n.Labels)}); err != nil {
		s.log.Info("push authorized keys failed", "node", c.Name, "err", err)
	}
}

// accessChanged reloads operators and roles and pushes new key sets to every
// connected node.
func (s *Server) accessChanged() {
	if err := s.reloadAccess(context.Background()); err != nil {
		s.log.Error("reload operators and roles", "err", err)
		return
	}
	for _, c := range s.reg.All() {
		go func() {
			s.pushKeys(c)
			s.pushSSHTrust(c, c.HostKey, s.log.With("node", c.Name))
		}()
	}
}

// certPrincipal names what a user certificate from `tether login` grants:
// login L through role R. Nodes accept it only if R selects them.
func certPrincipal(role, login string) string { return "tether:" + role + ":" + login }

// nodePrincipals are the certificate principals a node with these labels
// accepts, per login, and those valid for any login.
func (s *Server) nodePrincipals(labels map[string]string) (perLogin map[string][]string, any []string) {
	perLogin = map[string][]string{}
	for _, r := range s.access.Load().roles {
		if ok, _ := roles.Allowed([]roles.Role{r}, labels); !ok {
			continue
		}
		for _, l := range r.Logins {
			if l == roles.AnyLogin {
				any = append(any, certPrincipal(r.Name, l))
				continue
			}
			perLogin[l] = append(perLogin[l], certPrincipal(r.Name, l))
		}
	}
	// The hub's own provisioning certificate, for the node's provisioning
	// login only.
	login := s.provisionLoginFor(labels)
	perLogin[login] = append(perLogin[login], ProvisionPrincipal)
	return perLogin, any
}
