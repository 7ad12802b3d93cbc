package hub

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/registry"
	"github.com/tether-dev/tether/hub/site"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// SiteConfig makes a hub a site of a parent hub (tether hub --parent
// JOIN --site NAME); the zero value is a hub with no parent. Every hub
// takes sites below it.
type SiteConfig struct {
	// ParentJoin is a site join string from the parent (`tether site
	// token create`); needed only until DATA_DIR/parent holds the
	// identity it buys.
	ParentJoin string
	// Name is this site's name at the parent (a DNS label).
	Name string
	// StatusInterval is how often this hub reports its status up, and the
	// beat its own sites are judged by (stale after site.StaleFactor of
	// it); default site.DefaultStatusInterval.
	StatusInterval time.Duration
	// Transport is how the uplink dials (auto: QUIC raced against TCP).
	Transport tunnel.Transport
}

// parentDir holds the site's identity at its parent.
const parentDir = "parent"

// hasParent: this hub is configured, or already joined, as a site.
func (c SiteConfig) hasParent(dataDir string) bool {
	return c.ParentJoin != "" || c.Name != "" || site.Joined(filepath.Join(dataDir, parentDir))
}

// setupSites makes the parent's side (every hub) and, for a site, joins
// the parent once (the identity is kept in DATA_DIR/parent) and prepares
// the uplink; Run keeps it up.
func (s *Server) setupSites(ctx context.Context) error {
	cfg := s.cfg.Site
	if cfg.StatusInterval == 0 {
		cfg.StatusInterval = site.DefaultStatusInterval
	}
	if cfg.StatusInterval < 100*time.Millisecond || cfg.StatusInterval > time.Hour {
		return fmt.Errorf("hub: --site-status-interval %s: want 100ms..1h", cfg.StatusInterval)
	}
	s.cfg.Site = cfg
	hubID := s.ca.Pin()
	if cfg.hasParent(s.cfg.DataDir) {
		dir := filepath.Join(s.cfg.DataDir, parentDir)
		if cfg.Name == "" && !site.Joined(dir) {
			return errors.New("hub: --parent needs --site NAME (this hub's name at the parent)")
		}
		joined, err := site.JoinParent(ctx, dir, cfg.ParentJoin, cfg.Name)
		if err != nil {
			return fmt.Errorf("hub: %w", err)
		}
		var hostCAs []string
		for _, k := range s.hostCA.TrustedKeys() {
			hostCAs = append(hostCAs, string(gossh.MarshalAuthorizedKey(k)[:len(gossh.MarshalAuthorizedKey(k))-1]))
		}
		s.uplink, err = site.NewUplink(site.UplinkConfig{
			Dir: dir, HubID: hubID, HostCAs: hostCAs, StatusInterval: cfg.StatusInterval,
			Subtree:      func() []string { return s.children.Subtree() },
			Status:       s.siteStatus,
			Inventory:    s.siteInventory,
			AgentVersion: Version, Transport: cfg.Transport, Tunnel: s.cfg.Tunnel,
			Logger: s.log,
		})
		if err != nil {
			return fmt.Errorf("hub: %w", err)
		}
		if cfg.Name != "" && s.uplink.Name() != cfg.Name {
			return fmt.Errorf("hub: --site %s, but %s holds this hub's identity as site %q at its parent; drop --site or use another --data-dir",
				cfg.Name, dir, s.uplink.Name())
		}
		if joined {
			s.log.Info("joined the parent hub as a site", "site", s.uplink.Name(), "identity", dir)
		}
	}
	above := func() (string, []string) { return "", nil }
	changed := func() {}
	if u := s.uplink; u != nil {
		above = func() (string, []string) { return u.Path(), u.Ancestors() }
		changed = u.Changed
	}
	var err error
	s.children, err = site.NewChildren(ctx, site.ChildrenConfig{Store: s.store, HubID: hubID, Above: above,
		StaleAfter: site.StaleFactor * cfg.StatusInterval, Audit: s.audit, Changed: changed, Logger: s.log.With("component", "sites")})
	if err != nil {
		return fmt.Errorf("hub: %w", err)
	}
	return nil
}

// startUplink keeps the uplink up (a site hub) until the returned stop is
// called. A refusal for good stops only the uplink: the hub goes on
// serving its own nodes and sites.
func (s *Server) startUplink(ctx context.Context) (stop func()) {
	if s.uplink == nil {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = s.uplink.Run(ctx) })
	return func() { cancel(); wg.Wait() }
}

// admitSite decides, for a session whose certificate and hello are
// checked, whether it is a site: a hello with CapSite must come from a
// site token's certificate (and make no cycle), and a site token's
// certificate may not serve as a node's. It returns the welcome's site
// section (nil for a node) or why the session is refused.
func (s *Server) admitSite(ctx context.Context, node store.Node, h *control.Hello) (*control.SiteWelcome, error) {
	if !slices.Contains(h.Capabilities, control.CapSite) {
		if _, err := s.store.GetSite(ctx, node.ID); err == nil {
			return nil, fmt.Errorf("%w: %s joined with a site token; only a site hub (tether hub --parent) may use its certificate", site.ErrNotSite, node.Name)
		} else if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		return nil, nil
	}
	return s.children.Admit(ctx, node.ID, node.Name, h.Site)
}

// siteConnected records a welcomed site session; the returned function is
// called when it ends.
func (s *Server) siteConnected(ctx context.Context, conn *registry.Conn, h *control.Hello, w *control.SiteWelcome) (disconnected func()) {
	return s.children.Connected(ctx, conn, h.Site, w)
}

// siteStatus is this site hub's status: its own nodes, its sites.
func (s *Server) siteStatus(ctx context.Context) (*control.SiteStatus, error) {
	nodes, err := s.store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	st := &control.SiteStatus{Health: control.SiteHealthy}
	children := s.children.List()
	isSite := make(map[string]bool, len(children))
	for _, c := range children {
		isSite[c.NodeID] = true
	}
	for _, n := range nodes {
		if isSite[n.ID] || !n.RevokedAt.IsZero() {
			continue
		}
		st.NodesTotal++
		if n.Online {
			st.NodesOnline++
		}
	}
	for _, c := range children {
		sub := control.SubSite{Name: c.Name, HubID: c.HubID, HostCAs: c.HostCAs, Connected: c.Connected, LastHeartbeat: c.LastHeartbeat, Status: c.Status}
		if sub.HubID == "" {
			continue // never connected: nothing to report of it yet
		}
		if c.Stale {
			st.Health = control.SiteDegraded
			if sub.Status != nil {
				cp := *sub.Status
				cp.Health = control.SiteStale
				sub.Status = &cp
			}
		} else if sub.Status != nil && sub.Status.Health != control.SiteHealthy {
			st.Health = control.SiteDegraded
		}
		st.Sites = append(st.Sites, sub)
	}
	if st.NodesOnline < st.NodesTotal {
		st.Health = control.SiteDegraded
	}
	return st, nil
}

// siteInventory is this site's nodes and its sites' nodes, named relative
// to this hub (what the parent appends this site's name to).
func (s *Server) siteInventory(ctx context.Context) ([]control.SiteNode, error) {
	nodes, err := s.store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	isSite := map[string]bool{}
	for _, c := range s.children.List() {
		isSite[c.NodeID] = true
	}
	var out []control.SiteNode
	for _, n := range nodes {
		if isSite[n.ID] {
			continue
		}
		out = append(out, control.SiteNode{Name: n.Name, ID: n.ID, Labels: maps.Clone(n.Labels), Online: n.Online,
			LastSeen: n.LastSeen, Transport: n.Transport, Revoked: !n.RevokedAt.IsZero()})
	}
	below, err := s.store.ListSiteNodes(ctx, "")
	if err != nil {
		return nil, err
	}
	for _, n := range below {
		out = append(out, control.SiteNode{Name: n.FullName(), ID: n.ID, Labels: n.Labels, Online: n.Online,
			LastSeen: n.LastSeen, Transport: n.Transport, Revoked: n.Revoked})
	}
	return out, nil
}

// sitesAPI lists the sites below this hub for GET /v1/sites.
type sitesAPI struct{ s *Server }

// Sites implements api.Sites: this hub's sites as it judges them, and
// below each the sub-sites as that site last reported them.
func (a sitesAPI) Sites(ctx context.Context) ([]api.Site, error) {
	now := time.Now()
	var out []api.Site
	for _, c := range a.s.children.List() {
		v := api.Site{Name: c.Name, Path: c.Name, HubID: c.HubID, Health: c.Health(), Connected: c.Connected,
			LastHeartbeat: c.LastHeartbeat, Stale: c.Stale, StaleSeconds: int64(c.StaleFor / time.Second)}
		if !c.LastHeartbeat.IsZero() {
			v.AgeSeconds = int64(now.Sub(c.LastHeartbeat) / time.Second)
		}
		if !c.Connected {
			v.UnreachableSince = c.Since
		}
		fillSite(&v, c.Status, now)
		out = append(out, v)
	}
	return out, nil
}

// fillSite copies what a site's status says into v, nested sub-sites too.
func fillSite(v *api.Site, st *control.SiteStatus, now time.Time) {
	if st == nil {
		return
	}
	v.NodesOnline, v.NodesTotal = st.NodesOnline, st.NodesTotal
	v.ReceivedMissions, v.ActiveMissions = len(st.ReceivedMissions), len(st.ActiveMissions)
	v.QueuedSince = st.QueuedSince
	for _, sub := range st.Sites {
		sv := api.Site{Name: sub.Name, Path: sub.Name + "." + v.Path, HubID: sub.HubID, Connected: sub.Connected,
			LastHeartbeat: sub.LastHeartbeat, Health: control.SiteStale}
		if !sub.LastHeartbeat.IsZero() {
			sv.AgeSeconds = int64(now.Sub(sub.LastHeartbeat) / time.Second)
		}
		if sub.Status != nil {
			sv.Health = sub.Status.Health
		}
		if v.Stale {
			sv.Health = control.SiteStale // what its parent said is old news
		}
		if sv.Health == control.SiteStale {
			sv.Stale = true
			if !sub.LastHeartbeat.IsZero() {
				sv.StaleSeconds = sv.AgeSeconds
			}
		}
		fillSite(&sv, sub.Status, now)
		v.Sites = append(v.Sites, sv)
	}
}
