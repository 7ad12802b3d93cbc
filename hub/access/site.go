package access

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// The site route: a node below one of this hub's child sites ("n7.berlin",
// "n7.sub.berlin") is reached by opening a tunnel.ServiceRoute stream on
// the child site's session and asking it, with a siteproto.RouteRequest, to
// route on to the target named relative to the child ("n7", "n7.sub").
// Nodes below sites are not in this hub's nodes table: they come from the
// inventory the sites report (Sites.Node). The decision whether a caller
// may reach one is made here, on this hub, with this hub's roles on the
// node's inventory labels (SiteNodeLabels); the sites below only check
// that the request came from their parent and names a node of theirs.

// Sites is what the door needs of this hub's child sites: their state,
// their inventory, and a way to open a route stream on a child's session.
type Sites interface {
	// HubID is this hub's ID (the Origin of the routes it opens).
	HubID() string
	// Child is the state of child site name; ok is false if this hub has
	// no such child.
	Child(name string) (s SiteState, ok bool)
	// Node finds a node of the children's inventory: by ID when id is set,
	// else by its name relative to this hub ("n7.berlin"). It returns an
	// error matching store.ErrNotFound when there is none.
	Node(ctx context.Context, id, name string) (SiteNode, error)
	// Nodes lists the whole inventory of every child.
	Nodes(ctx context.Context) ([]SiteNode, error)
	// OpenRoute opens a ServiceRoute stream on child's session, writes
	// req and reads the child's reply; the stream is then ready for
	// payload bytes.
	OpenRoute(ctx context.Context, child string, req *siteproto.RouteRequest) (tunnel.Stream, error)
}

// SiteState is a child site's reachability as this hub sees it.
type SiteState struct {
	// Reachable: its uplink session is up and its heartbeat is not stale.
	Reachable bool
	// Since is when it stopped being reachable (zero: never connected).
	Since time.Time
}

// SiteNode is one node of a child site's inventory.
type SiteNode struct {
	// Name is the node's name relative to this hub ("n7.berlin").
	Name      string
	ID        string
	Labels    map[string]string // the labels the node's own hub selects it by
	Online    bool
	LastSeen  time.Time
	Transport string
	Revoked   bool
}

// SplitSitePath splits a node name relative to this hub into the child
// site it is below ("berlin" for "n7.sub.berlin"), the name relative to
// that child ("n7.sub") and the node's site path relative to this hub
// ("sub.berlin"). ok is false for a name of this hub's own (no dot).
func SplitSitePath(name string) (child, rest, suffix string, ok bool) {
	_, suffix, ok = strings.Cut(name, ".")
	if !ok {
		return "", "", "", false
	}
	i := strings.LastIndexByte(name, '.')
	return name[i+1:], name[:i], suffix, true
}

// SiteUnreachableError says the child site a node is below cannot be
// reached now (its uplink is down, or its heartbeat is stale). It matches
// ErrOffline, so every caller that handles an offline node handles it.
type SiteUnreachableError struct {
	Site  string    // the child site
	Node  string    // the node asked for, relative to this hub
	Since time.Time // zero: never connected
}

func (e *SiteUnreachableError) Error() string { return e.Reason() }

// Reason is the error as a sentence: "site berlin unreachable since
// 2026-11-24T08:40:00Z (3m ago)".
func (e *SiteUnreachableError) Reason() string {
	if e.Since.IsZero() {
		return fmt.Sprintf("site %s unreachable (never connected)", e.Site)
	}
	ago := time.Since(e.Since)
	agoText := ago.Round(time.Second).String()
	if ago >= time.Minute {
		agoText = ago.Truncate(time.Minute).String()
		agoText = strings.TrimSuffix(agoText, "0s")
	}
	return fmt.Sprintf("site %s unreachable since %s (%s ago)", e.Site, e.Since.UTC().Format(time.RFC3339), agoText)
}

// Is makes errors.Is(err, ErrOffline) true.
func (e *SiteUnreachableError) Is(target error) bool { return target == ErrOffline }

// SetSites makes Resolve route names below child sites (and inventory node
// IDs) through s. A hub without child sites never calls it.
func (d *Door) SetSites(s Sites) { d.sites.Store(&s) }

func (d *Door) siteSource() Sites {
	if p := d.sites.Load(); p != nil {
		return *p
	}
	return nil
}

// resolveSite finds a node below a child site and its route; ref is by
// name (dotted) or by an ID not in this hub's own nodes.
func (d *Door) resolveSite(ctx context.Context, sites Sites, ref NodeRef) (store.Node, Route, error) {
	sn, err := sites.Node(ctx, ref.id, ref.name)
	switch {
	case errors.Is(err, store.ErrNotFound) && ref.id != "":
		return store.Node{}, nil, refuse(ErrUnknownNode,
			"node id %s is not registered here nor in any site's inventory (the node was removed)", ref.id)
	case errors.Is(err, store.ErrNotFound):
		child, _, _, _ := SplitSitePath(ref.name)
		if _, ok := sites.Child(child); !ok {
			return store.Node{}, nil, refuse(ErrUnknownNode,
				"no node named %q: this hub has no site %q (see `tether sites`)", ref.name, child)
		}
		return store.Node{}, nil, refuse(ErrUnknownNode,
			"no node named %q in site %s's inventory (see `tether nodes -l site=%s`)", ref.name, child, child)
	case err != nil:
		return store.Node{}, nil, fmt.Errorf("access: look up %s in the sites' inventory: %w", ref, err)
	}
	child, rest, _, ok := SplitSitePath(sn.Name)
	if !ok || siteproto.ValidNodePath(sn.Name) != nil {
		return store.Node{}, nil, fmt.Errorf("access: inventory node %q is not named below a site", sn.Name)
	}
	n := SiteNodeAsNode(sn)
	if sn.Revoked {
		return n, nil, refuse(ErrRevoked, "node %q was revoked at its site", n.Name)
	}
	st, ok := sites.Child(child)
	if !ok {
		return n, nil, refuse(ErrUnknownNode, "no node named %q: this hub has no site %q (see `tether sites`)", n.Name, child)
	}
	if !st.Reachable {
		return n, nil, &SiteUnreachableError{Site: child, Node: n.Name, Since: st.Since}
	}
	if !sn.Online {
		return n, nil, &OfflineError{Node: n.Name, LastSeen: sn.LastSeen}
	}
	return n, siteRoute{sites: sites, child: child, target: rest, node: n.Name, m: d}, nil
}

// SiteNodeAsNode is an inventory node as this hub's decisions and listings
// see it: named relative to this hub, with the labels of SiteNodeLabels.
func SiteNodeAsNode(sn SiteNode) store.Node {
	_, _, suffix, _ := SplitSitePath(sn.Name)
	return store.Node{ID: sn.ID, Name: sn.Name, Labels: SiteNodeLabels(suffix, sn.Labels), Online: sn.Online,
		LastSeen: sn.LastSeen, Transport: sn.Transport}
}

// InventoryNodes lists the nodes below this hub's child sites as
// SiteNodeAsNode names them (none without sites), for listings and job
// target selection; what a caller may see of them is AuthorizeList's.
func (d *Door) InventoryNodes(ctx context.Context) ([]store.Node, error) {
	sites := d.siteSource()
	if sites == nil {
		return nil, nil
	}
	sns, err := sites.Nodes(ctx)
	if err != nil {
		return nil, fmt.Errorf("access: list the sites' inventory: %w", err)
	}
	out := make([]store.Node, 0, len(sns))
	for _, sn := range sns {
		child, _, _, ok := SplitSitePath(sn.Name)
		if !ok {
			continue
		}
		n := SiteNodeAsNode(sn)
		if st, ok := sites.Child(child); !ok || !st.Reachable {
			// Its site's last word may be old: nothing below an
			// unreachable site is reachable from here.
			n.Online = false
		}
		out = append(out, n)
	}
	return out, nil
}

// Hop says on whose behalf a stream is routed: every hub on a site route
// audits it. Callers that reach nodes put it in the context they dial with
// (WithHop); a hub that routes on a stream from its parent passes the
// parent's on.
type Hop struct {
	Purpose  string // siteproto.Purpose*
	Operator string // who asked, as the authorizing hub knows them
	// Origin is the hub ID that authorized the stream; empty means this
	// hub.
	Origin string
	Trace  string // correlates the audit rows of one stream; empty: a new one
	// Service names the service tunnel of a siteproto.PurposeService stream.
	Service string
}

type hopKey struct{}

// WithHop returns ctx carrying h for the site routes dialed with it.
func WithHop(ctx context.Context, h Hop) context.Context { return context.WithValue(ctx, hopKey{}, h) }

// HopFrom is the Hop in ctx (zero if none).
func HopFrom(ctx context.Context) Hop {
	h, _ := ctx.Value(hopKey{}).(Hop)
	return h
}

// NewTrace returns a fresh trace ID for the audit rows of one stream.
func NewTrace() string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// siteRoute reaches a node below child site child, named target there.
type siteRoute struct {
	sites  Sites
	child  string
	target string
	node   string // relative to this hub, for errors
	m      *Door
}

func (r siteRoute) Dial(ctx context.Context, h tunnel.Header) (tunnel.Stream, error) {
	hop := HopFrom(ctx)
	req := &siteproto.RouteRequest{Target: r.target, Service: uint8(h.Service), Port: h.Port, Purpose: hop.Purpose,
		Operator: hop.Operator, Origin: hop.Origin, Trace: hop.Trace, ServiceName: hop.Service}
	if req.Purpose == "" {
		req.Purpose = siteproto.PurposeJump
	}
	if req.Origin == "" {
		req.Origin = r.sites.HubID()
	}
	if req.Trace == "" {
		req.Trace = NewTrace()
	}
	st, err := r.sites.OpenRoute(ctx, r.child, req)
	if m := r.m.cfg.Metrics; m != nil {
		result := "ok"
		if err != nil {
			result = "error"
		}
		m.StreamsOpened.WithLabelValues(h.Service.String(), result).Inc()
	}
	if err != nil {
		return nil, fmt.Errorf("route to %s through site %s: %w", r.node, r.child, err)
	}
	return st, nil
}

func (r siteRoute) String() string { return "site " + r.child }

// Serve is what a site hub does with a route request from its parent once
// the stream came on its uplink: AuthorizeRoute re-checks it, Resolve
// finds the target in this hub's own subtree only, and the target's route
// opens the stream with the parent's Hop, so the hubs further down audit
// the same operator, origin and trace.
func (d *Door) Serve(ctx context.Context, req *siteproto.RouteRequest) (store.Node, Route, error) {
	if err := d.AuthorizeRoute(req); err != nil {
		return store.Node{}, nil, err
	}
	return d.Resolve(ctx, ByName(req.Target))
}

// HasSite reports whether name is one of this hub's child sites.
func (d *Door) HasSite(name string) bool {
	sites := d.siteSource()
	if sites == nil {
		return false
	}
	_, ok := sites.Child(name)
	return ok
}
