package site

import (
	"context"
	"crypto/sha256"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
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
// certificates for every suffix of its path (HostPrincipals), and hubs
// above trust the site's host CA for names below it only.

// TrustConfig is what a hub's Trust works with.
type TrustConfig struct {
	HubID      string
	NodeSuffix string // nodes answer to NAME.NodeSuffix too
	Children   *Children
	// Uplink is nil on a hub without a parent.
	Uplink *Uplink
	// UserCAs and HostCAs are this hub's SSH user and host CA keys.
	UserCAs func() []gossh.PublicKey
	HostCAs func() []gossh.PublicKey
	// ForSite is this hub's entry of the trust child site suffix is sent
	// (access.Snapshot.TrustForSite of the newest access state).
	ForSite func(hubID, suffix string, userCAs []string) siteproto.AncestorTrust
	// Changed asks for a push round: nodes get new scoped CAs (the trust
	// of the hubs above changed) and child sites their trust (Push).
	Changed func()
	// PathChanged is called when the parent's welcome names this site
	// anew (first join, a move in the tree): host certificates carry every
	// suffix of the path, so they are issued again.
	PathChanged func()
	Logger      *slog.Logger
}

// Trust is a hub's SSH trust in the tree of hubs: what it sends each child
// site, and what it keeps of the trust of the hubs above it.
type Trust struct {
	cfg TrustConfig
	// above is the SSH trust of the hubs above this site hub, as its
	// parent last sent it (nil for a root).
	above atomic.Pointer[access.AncestorTrust]

	mu   sync.Mutex          // guards sent
	sent map[string][32]byte // child site -> digest of the trust last sent
}

// NewTrust hooks the trust paths to the sites: a child site is sent its
// trust when it connects; a site hub keeps its parent's trust.
func NewTrust(cfg TrustConfig) *Trust {
	t := &Trust{cfg: cfg, sent: map[string][32]byte{}}
	cfg.Children.OnConnect(func(ctx context.Context, c Child) {
		t.forget(c.Name)
		t.send(ctx, c)
	})
	u := cfg.Uplink
	if u == nil {
		return t
	}
	u.Handle(siteproto.TypeTrust, func(ctx context.Context, m *control.Message) {
		t.above.Store(access.CompileAncestorTrust(m.SiteTrust))
		cfg.Logger.Info("trust of the hubs above received", "hubs", len(m.SiteTrust.Ancestors))
		cfg.Changed() // nodes get the new scoped CAs; child sites the new trust
	})
	path := u.Path()
	var pathMu sync.Mutex
	u.OnConnect(func(context.Context) {
		pathMu.Lock()
		changed := u.Path() != path
		path = u.Path()
		pathMu.Unlock()
		if changed {
			cfg.Logger.Info("site path changed: re-issuing host certificates", "path", path)
			cfg.PathChanged()
		}
	})
	return t
}

func (t *Trust) forget(child string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.sent, child)
}

// Push sends every connected child site its trust if it changed.
func (t *Trust) Push(ctx context.Context) {
	for _, c := range t.cfg.Children.List() {
		if c.Connected {
			t.send(ctx, c)
		}
	}
}

// trustFor is the trust child c is sent: this hub's entry, then those of
// the hubs above it as they name the child.
func (t *Trust) trustFor(c Child) *siteproto.Trust {
	var cas []string
	for _, k := range t.cfg.UserCAs() {
		cas = append(cas, strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k))))
	}
	out := &siteproto.Trust{Ancestors: []siteproto.AncestorTrust{t.cfg.ForSite(t.cfg.HubID, c.Name, cas)}}
	if above := t.above.Load(); above != nil {
		for _, a := range above.Msg.Ancestors {
			if len(out.Ancestors) == siteproto.MaxDepth {
				break
			}
			a.Suffix = c.Name + "." + a.Suffix
			out.Ancestors = append(out.Ancestors, a)
		}
	}
	return out
}

func (t *Trust) send(ctx context.Context, c Child) {
	tr := t.trustFor(c)
	b, _ := json.Marshal(tr)
	sum := sha256.Sum256(b)
	t.mu.Lock()
	same := t.sent[c.Name] == sum
	t.mu.Unlock()
	if same {
		return
	}
	if err := t.cfg.Children.Send(ctx, c.Name, &control.Message{Type: siteproto.TypeTrust, SiteTrust: tr}); err != nil {
		t.cfg.Logger.Info("trust not sent to site", "site", c.Name, "err", err)
		return
	}
	t.mu.Lock()
	t.sent[c.Name] = sum
	t.mu.Unlock()
}

// WithAncestors adds to a node's trust what the hubs above this site hub
// grant on it (nothing on a hub that is no site).
func (t *Trust) WithAncestors(tr *control.SSHTrust, labels map[string]string) {
	above := t.above.Load()
	if above == nil {
		return
	}
	scoped, revoked := above.ScopedCAsFor(labels)
	tr.ScopedUserCAs = scoped
	if len(revoked) > 0 {
		tr.RevokedKeys = append(append([]string(nil), tr.RevokedKeys...), revoked...)
	}
}

// HostPrincipals are the names a node's host certificate is valid for: its
// name and name.NODESUFFIX, and on a site hub the name each hub above
// reaches it by ("n7.berlin" from the parent, "n7.berlin.region" from the
// root when the site's path is "berlin.region"), each also with
// .NODESUFFIX (what `tether config ssh` profiles type, when the hubs share
// a node suffix).
func (t *Trust) HostPrincipals(name string) []string {
	out := []string{name, name + "." + t.cfg.NodeSuffix}
	if t.cfg.Uplink == nil {
		return out
	}
	labels := strings.Split(t.cfg.Uplink.Path(), ".")
	for i := range labels {
		n := name + "." + strings.Join(labels[:i+1], ".")
		out = append(out, n, n+"."+t.cfg.NodeSuffix)
	}
	return out
}

// HostCAsBelow are the host CAs of every site below this hub, each with its
// suffix here: the child sites' own, and their sub-sites' as each child
// last reported them (GET /v1/ssh/trust; `tether config ssh`).
func (t *Trust) HostCAsBelow() []apitype.SiteHostCA {
	var out []apitype.SiteHostCA
	var walk func(suffix string, cas []string, st *siteproto.Status, depth int)
	walk = func(suffix string, cas []string, st *siteproto.Status, depth int) {
		if len(cas) > 0 {
			out = append(out, apitype.SiteHostCA{Suffix: suffix, HostCAs: cas})
		}
		if st == nil || depth >= siteproto.MaxDepth {
			return
		}
		for _, sub := range st.Sites {
			walk(sub.Name+"."+suffix, trimKeys(sub.HostCAs), sub.Status, depth+1)
		}
	}
	for _, c := range t.cfg.Children.List() {
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

// HostCAsFor are the SSH host CAs this hub's SSH client (jobs) trusts for
// node name: its own host CA for its own nodes; for a node below a site
// ("n7.sub.berlin") only the host CA of the site the node belongs to (sub,
// as berlin reported it), never this hub's own nor another site's.
func (t *Trust) HostCAsFor(name string) []gossh.PublicKey {
	_, _, suffix, ok := access.SplitSitePath(name)
	if !ok {
		return t.cfg.HostCAs()
	}
	var out []gossh.PublicKey
	for _, sc := range t.HostCAsBelow() {
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
