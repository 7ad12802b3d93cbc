package site

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// A hub's own side of the tree: what it admits as a site, the status and
// inventory a site hub reports up, and the sites the API lists.

// AdmitHello decides, for a session whose certificate and hello are
// checked, whether it is a site: a hello with CapSite must come from a
// site token's certificate (and make no cycle), and a site token's
// certificate may not serve as a node's. It returns the welcome's site
// section (nil for a node) or why the session is refused; a site that
// announced siteproto.CapSiteLiveness is told its heartbeat there.
func (c *Children) AdmitHello(ctx context.Context, node store.Node, h *control.Hello) (*siteproto.Welcome, error) {
	if !slices.Contains(h.Capabilities, siteproto.CapSite) {
		if _, err := c.cfg.Store.GetSite(ctx, node.ID); err == nil {
			return nil, fmt.Errorf("%w: %s joined with a site token; only a site hub (tether hub --parent) "+
				"may use its certificate", ErrNotSite, node.Name)
		} else if !errors.Is(err, store.ErrNotFound) {
			return nil, err
		}
		return nil, nil
	}
	w, err := c.Admit(ctx, node.ID, node.Name, h.Site)
	if err == nil && slices.Contains(h.Capabilities, siteproto.CapSiteLiveness) {
		w.HeartbeatMillis = int(c.cfg.Heartbeat / time.Millisecond)
		w.DeadPeerMillis = int(c.cfg.DeadPeer / time.Millisecond)
	}
	return w, err
}

// NodeLister lists this hub's own nodes (store.Store).
type NodeLister interface {
	ListNodes(ctx context.Context) ([]store.Node, error)
}

// Status is this site hub's status: its own nodes, its sites.
func (c *Children) Status(ctx context.Context, nodes NodeLister) (*siteproto.Status, error) {
	own, err := nodes.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	st := &siteproto.Status{Health: siteproto.Healthy}
	children := c.List()
	isSite := make(map[string]bool, len(children))
	for _, c := range children {
		isSite[c.NodeID] = true
	}
	for _, n := range own {
		if isSite[n.ID] || !n.RevokedAt.IsZero() {
			continue
		}
		st.NodesTotal++
		if n.Online {
			st.NodesOnline++
		}
	}
	for _, c := range children {
		sub := siteproto.SubSite{Name: c.Name, HubID: c.HubID, HostCAs: c.HostCAs, Connected: c.Connected,
			LastHeartbeat: c.LastHeartbeat, Status: c.Status}
		if sub.HubID == "" {
			continue // never connected: nothing to report of it yet
		}
		if c.Stale {
			st.Health = siteproto.Degraded
			if sub.Status != nil {
				cp := *sub.Status
				cp.Health = siteproto.Stale
				sub.Status = &cp
			}
		} else if sub.Status != nil && sub.Status.Health != siteproto.Healthy {
			st.Health = siteproto.Degraded
		}
		st.Sites = append(st.Sites, sub)
	}
	if st.NodesOnline < st.NodesTotal {
		st.Health = siteproto.Degraded
	}
	return st, nil
}

// Inventory is this site's nodes and its sites' nodes, named relative to
// this hub (what the parent appends this site's name to); the sites' nodes
// are those the children's inventories stored.
func (c *Children) Inventory(ctx context.Context, nodes NodeLister) ([]siteproto.Node, error) {
	own, err := nodes.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	isSite := map[string]bool{}
	for _, ch := range c.List() {
		isSite[ch.NodeID] = true
	}
	var out []siteproto.Node
	for _, n := range own {
		if isSite[n.ID] {
			continue
		}
		out = append(out, siteproto.Node{Name: n.Name, ID: n.ID, Labels: maps.Clone(n.Labels), Online: n.Online,
			LastSeen: n.LastSeen, Transport: n.Transport, Revoked: !n.RevokedAt.IsZero()})
	}
	below, err := c.cfg.Store.ListSiteNodes(ctx, "")
	if err != nil {
		return nil, err
	}
	for _, n := range below {
		out = append(out, siteproto.Node{Name: n.FullName(), ID: n.ID, Labels: n.Labels, Online: n.Online,
			LastSeen: n.LastSeen, Transport: n.Transport, Revoked: n.Revoked})
	}
	return out, nil
}

// API serves GET /v1/sites: the sites below this hub (none when Children
// is nil).
type API struct{ Children *Children }

// Sites is this hub's sites as it judges them, and below each the
// sub-sites as that site last reported them.
func (a API) Sites(ctx context.Context) ([]apitype.Site, error) {
	now := time.Now()
	var out []apitype.Site
	for _, c := range a.Children.List() {
		v := apitype.Site{Name: c.Name, Path: c.Name, HubID: c.HubID, Health: c.Health(), Connected: c.Connected,
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
func fillSite(v *apitype.Site, st *siteproto.Status, now time.Time) {
	if st == nil {
		return
	}
	v.NodesOnline, v.NodesTotal = st.NodesOnline, st.NodesTotal
	v.ReceivedMissions, v.ActiveMissions = len(st.ReceivedMissions), len(st.ActiveMissions)
	v.QueuedSince = st.QueuedSince
	for _, sub := range st.Sites {
		sv := apitype.Site{Name: sub.Name, Path: sub.Name + "." + v.Path, HubID: sub.HubID, Connected: sub.Connected,
			LastHeartbeat: sub.LastHeartbeat, Health: siteproto.Stale}
		if !sub.LastHeartbeat.IsZero() {
			sv.AgeSeconds = int64(now.Sub(sub.LastHeartbeat) / time.Second)
		}
		if sub.Status != nil {
			sv.Health = sub.Status.Health
		}
		if v.Stale {
			sv.Health = siteproto.Stale // what its parent said is old news
		}
		if sv.Health == siteproto.Stale {
			sv.Stale = true
			if !sub.LastHeartbeat.IsZero() {
				sv.StaleSeconds = sv.AgeSeconds
			}
		}
		fillSite(&sv, sub.Status, now)
		v.Sites = append(v.Sites, sv)
	}
}
