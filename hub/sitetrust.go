package hub

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"strings"
	"sync"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/site"
	"github.com/tether-dev/tether/tunnel/control"
)

// SSH trust down the tree. Operators of a hub above a site reach the
// site's nodes with their own hub's certificates:
//
//   - a parent sends each child site TypeSiteTrust: its own entry (user
//     CAs, roles with selectors and logins, revoked keys, provisioning
//     login; access.Snapshot.TrustForSite) in front of the entries it
//     received from its own parent, renamed for the child. It is sent on
//     connect and after every access change (the pusher's round);
//   - a site keeps the last SiteTrust from its parent and pushes, in each
//     own node's SSHTrust, one ScopedUserCA per hub above: that hub's user
//     CA trusted only for the principals its roles grant on the node
//     (access.AncestorTrust.ScopedCAsFor), plus every hub's revoked keys.
//
// Host certificates go the other way: a site names its nodes' host
// certificates for every suffix of its path (hostPrincipals), and hubs
// above trust the site's host CA for names below it only.

// siteTrustState is what a hub keeps of the trust of the hubs above it,
// and what it last sent each child.
type siteTrustState struct {
	mu   sync.Mutex          // guards sent
	sent map[string][32]byte // child site -> digest of the trust last sent
}

// setupSiteRoutes plugs sites into the door and the trust paths: the
// door routes names below child sites; a site serves its parent's route
// streams and keeps its parent's trust for its nodes.
func (s *Server) setupSiteRoutes() {
	hubID := s.ca.Pin()
	s.door.SetSites(&siteRoutes{children: s.children, store: s.store, hubID: hubID})
	s.children.OnConnect(func(ctx context.Context, c site.Child) {
		s.siteTrust.forget(c.Name)
		s.sendSiteTrust(ctx, c)
	})
	u := s.uplink
	if u == nil {
		return
	}
	u.ServeRoutes(s.serveParentRoute)
	u.Handle(control.TypeSiteTrust, func(ctx context.Context, m *control.Message) {
		s.ancestorTrust.Store(access.CompileAncestorTrust(m.SiteTrust))
		s.log.Info("trust of the hubs above received", "hubs", len(m.SiteTrust.Ancestors))
		s.kickPush() // nodes get the new scoped CAs; child sites the new trust
	})
	path := u.Path()
	var pathMu sync.Mutex
	u.OnConnect(func(context.Context) {
		// The welcome may name this site anew (first join, a move in the
		// tree): host certificates carry every suffix of the path.
		pathMu.Lock()
		changed := u.Path() != path
		path = u.Path()
		pathMu.Unlock()
		if changed {
			s.log.Info("site path changed: re-issuing host certificates", "path", path)
			for _, c := range s.reg.All() {
				s.certifyHost(c, s.log.With("node", c.Name))
			}
			s.kickPush()
		}
	})
}

// kickPush asks the pusher for a round (nodes and child sites).
func (s *Server) kickPush() {
	select {
	case s.pushKick <- struct{}{}:
	default:
	}
}

func (t *siteTrustState) forget(child string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sent, child)
}

// pushSiteTrust sends every connected child site its trust if it changed.
func (s *Server) pushSiteTrust(ctx context.Context) {
	if s.children == nil {
		return
	}
	for _, c := range s.children.List() {
		if c.Connected {
			s.sendSiteTrust(ctx, c)
		}
	}
}

// siteTrustFor is the SiteTrust child c is sent: this hub's entry, then
// those of the hubs above it as they name the child.
func (s *Server) siteTrustFor(c site.Child) *control.SiteTrust {
	var cas []string
	for _, k := range s.userCA.TrustedKeys() {
		cas = append(cas, strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k))))
	}
	t := &control.SiteTrust{Ancestors: []control.AncestorTrust{s.door.Snapshot().TrustForSite(s.ca.Pin(), c.Name, cas)}}
	if above := s.ancestorTrust.Load(); above != nil {
		for _, a := range above.Msg.Ancestors {
			if len(t.Ancestors) == control.MaxSiteDepth {
				break
			}
			a.Suffix = c.Name + "." + a.Suffix
			t.Ancestors = append(t.Ancestors, a)
		}
	}
	return t
}

func (s *Server) sendSiteTrust(ctx context.Context, c site.Child) {
	t := s.siteTrustFor(c)
	b, _ := json.Marshal(t)
	sum := sha256.Sum256(b)
	s.siteTrust.mu.Lock()
	if s.siteTrust.sent == nil {
		s.siteTrust.sent = map[string][32]byte{}
	}
	same := s.siteTrust.sent[c.Name] == sum
	s.siteTrust.mu.Unlock()
	if same {
		return
	}
	if err := s.children.Send(ctx, c.Name, &control.Message{Type: control.TypeSiteTrust, SiteTrust: t}); err != nil {
		s.log.Info("trust not sent to site", "site", c.Name, "err", err)
		return
	}
	s.siteTrust.mu.Lock()
	s.siteTrust.sent[c.Name] = sum
	s.siteTrust.mu.Unlock()
}

// withAncestors adds to a node's trust what the hubs above this site hub
// grant on it (nothing on a hub that is no site).
func (s *Server) withAncestors(t *control.SSHTrust, labels map[string]string) {
	above := s.ancestorTrust.Load()
	if above == nil {
		return
	}
	scoped, revoked := above.ScopedCAsFor(labels)
	t.ScopedUserCAs = scoped
	if len(revoked) > 0 {
		t.RevokedKeys = append(append([]string(nil), t.RevokedKeys...), revoked...)
	}
}

// hostPrincipals are the names a node's host certificate is valid for: its
// name and name.NODESUFFIX, and on a site hub the name each hub above
// reaches it by ("n7.berlin" from the parent, "n7.berlin.region" from the
// root when the site's path is "berlin.region"), each also with
// .NODESUFFIX (what `tether config ssh` profiles type, when the hubs share
// a node suffix).
func (s *Server) hostPrincipals(name string) []string {
	out := []string{name, name + "." + s.cfg.NodeSuffix}
	if s.uplink == nil {
		return out
	}
	labels := strings.Split(s.uplink.Path(), ".")
	for i := range labels {
		n := name + "." + strings.Join(labels[:i+1], ".")
		out = append(out, n, n+"."+s.cfg.NodeSuffix)
	}
	return out
}

// siteHostCAs are the host CAs of every site below this hub, each with its
// suffix here: the child sites' own, and their sub-sites' as each child
// last reported them (GET /v1/ssh/trust; `tether config ssh`).
func (s *Server) siteHostCAs() []api.SiteHostCA {
	var out []api.SiteHostCA
	var walk func(suffix string, cas []string, st *control.SiteStatus, depth int)
	walk = func(suffix string, cas []string, st *control.SiteStatus, depth int) {
		if len(cas) > 0 {
			out = append(out, api.SiteHostCA{Suffix: suffix, HostCAs: cas})
		}
		if st == nil || depth >= control.MaxSiteDepth {
			return
		}
		for _, sub := range st.Sites {
			walk(sub.Name+"."+suffix, trimKeys(sub.HostCAs), sub.Status, depth+1)
		}
	}
	for _, c := range s.children.List() {
		walk(c.Name, trimKeys(c.HostCAs), c.Status, 1)
	}
	return out
}

func trimKeys(keys []string) []string {
	out := make([]string, 0, len(keys))
	for _, k := range keys {
		out = append(out, strings.TrimSpace(k))
	}
	return out
}

// hostCAsFor are the SSH host CAs this hub's SSH client (jobs) trusts for
// node name: its own host CA for its own nodes; for a node below a site
// ("n7.sub.berlin") only the host CA of the site the node belongs to (sub,
// as berlin reported it), never this hub's own nor another site's.
func (s *Server) hostCAsFor(name string) []gossh.PublicKey {
	_, _, suffix, ok := access.SplitSitePath(name)
	if !ok {
		return s.hostCA.TrustedKeys()
	}
	var out []gossh.PublicKey
	for _, sc := range s.siteHostCAs() {
		if sc.Suffix != suffix {
			continue
		}
		for _, l := range sc.HostCAs {
			if k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(l)); err == nil {
				out = append(out, k)
			}
		}
	}
	return out
}
