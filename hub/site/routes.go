package site

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// Reaching nodes below sites, both ends of it:
//
//   - at a parent, Routes is the door's access.Sites: the child sites'
//     state (Children), their inventory (store site_nodes), and route
//     streams opened on a child's session;
//   - at a site, ServeParentRoute serves the route streams the parent
//     opens on the uplink: it re-checks the request (access.Door.Serve:
//     only a node of this hub's own subtree), audits the hop, and routes
//     on through its own door (its node, a replica holding it, or its own
//     child site, which does the same).

// routeOpenTimeout bounds opening a route stream on a child's session and
// reading its answer: the child may itself route on through a site below.
const routeOpenTimeout = 20 * time.Second

// Routes adapts the hub's child sites to access.Sites.
type Routes struct {
	children *Children
	store    store.SiteStore
	hubID    string

	mu  sync.Mutex // guards inv
	inv *inventoryIndex
}

// NewRoutes is the door's view of children, whose inventory st holds.
func NewRoutes(children *Children, st store.SiteStore, hubID string) *Routes {
	return &Routes{children: children, store: st, hubID: hubID}
}

// inventoryCacheTTL bounds how old the inventory index a lookup uses may
// be. A job over thousands of nodes below sites resolves each node
// several times (presence, connect, dial); one read of the inventory per
// interval serves them all. Staleness costs nothing in safety: the site
// re-checks the node with its own door.
const inventoryCacheTTL = time.Second

// inventoryIndex is the children's inventory indexed by ID and by name.
type inventoryIndex struct {
	at     time.Time
	all    []store.SiteNode
	byID   map[string][]store.SiteNode
	byName map[string]store.SiteNode
}

func (r *Routes) index(ctx context.Context) (*inventoryIndex, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.inv != nil && time.Since(r.inv.at) < inventoryCacheTTL {
		return r.inv, nil
	}
	ns, err := r.store.ListSiteNodes(ctx, "")
	if err != nil {
		return nil, err
	}
	ix := &inventoryIndex{at: time.Now(), all: ns, byID: make(map[string][]store.SiteNode, len(ns)),
		byName: make(map[string]store.SiteNode, len(ns))}
	for _, n := range ns {
		ix.byID[n.ID] = append(ix.byID[n.ID], n)
		ix.byName[n.FullName()] = n
	}
	r.inv = ix
	return ix, nil
}

func (r *Routes) HubID() string { return r.hubID }

func (r *Routes) Child(name string) (access.SiteState, bool) {
	c, ok := r.children.Get(name)
	if !ok {
		return access.SiteState{}, false
	}
	err := c.Unreachable()
	if err == nil {
		return access.SiteState{Reachable: true}, true
	}
	var ue *UnreachableError
	if errors.As(err, &ue) {
		return access.SiteState{Since: ue.Since}, true
	}
	return access.SiteState{Since: c.Since}, true
}

// Node finds an inventory node by ID or by its name at this hub. An ID two
// sites both report is refused: a site could otherwise take over the job
// targets (which key on IDs) of a node of another site.
func (r *Routes) Node(ctx context.Context, id, name string) (access.SiteNode, error) {
	ix, err := r.index(ctx)
	if err != nil {
		return access.SiteNode{}, err
	}
	var found []store.SiteNode
	if id != "" {
		found = ix.byID[id]
	} else if n, ok := ix.byName[name]; ok {
		found = []store.SiteNode{n}
	}
	switch len(found) {
	case 0:
		return access.SiteNode{}, fmt.Errorf("inventory: %w", store.ErrNotFound)
	case 1:
		return accessNodeOf(found[0]), nil
	}
	names := make([]string, 0, len(found))
	for _, n := range found {
		names = append(names, n.FullName())
	}
	return access.SiteNode{}, fmt.Errorf("node id %s is reported by several sites' inventories (%s); refusing to pick one",
		id, strings.Join(names, ", "))
}

func (r *Routes) Nodes(ctx context.Context) ([]access.SiteNode, error) {
	ix, err := r.index(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]access.SiteNode, 0, len(ix.all))
	for _, n := range ix.all {
		out = append(out, accessNodeOf(n))
	}
	return out, nil
}

func accessNodeOf(n store.SiteNode) access.SiteNode {
	return access.SiteNode{Name: n.FullName(), ID: n.ID, Labels: n.Labels, Online: n.Online, LastSeen: n.LastSeen,
		Transport: n.Transport, Revoked: n.Revoked}
}

// OpenRoute opens a tunnel.ServiceRoute stream on child's session, sends
// req and reads the child's answer.
func (r *Routes) OpenRoute(ctx context.Context, child string, req *siteproto.RouteRequest) (tunnel.Stream, error) {
	conn, ok := r.children.Session(child)
	if !ok {
		c, _ := r.children.Get(child)
		if err := c.Unreachable(); err != nil {
			var ue *UnreachableError
			if errors.As(err, &ue) {
				return nil, &access.SiteUnreachableError{Site: child, Since: ue.Since}
			}
		}
		return nil, &access.SiteUnreachableError{Site: child, Since: c.Since}
	}
	ctx, cancel := context.WithTimeout(ctx, routeOpenTimeout)
	defer cancel()
	st, err := conn.Session.OpenStream(ctx)
	if err != nil {
		return nil, fmt.Errorf("open a route stream to site %s: %w", child, err)
	}
	deadline, _ := ctx.Deadline()
	_ = st.SetDeadline(deadline)
	if err := tunnel.WriteHeader(st, tunnel.Header{Service: tunnel.ServiceRoute}); err != nil {
		st.Close()
		return nil, fmt.Errorf("send the route header to site %s: %w", child, err)
	}
	if err := siteproto.WriteRouteRequest(st, req); err != nil {
		st.Close()
		return nil, fmt.Errorf("send the route request to site %s: %w", child, err)
	}
	rep, err := tunnel.ReadReply(st)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("read site %s's answer: %w", child, err)
	}
	_ = st.SetDeadline(time.Time{})
	if !rep.OK {
		st.Close()
		return nil, fmt.Errorf("site %s refused: %s", child, rep.Reason)
	}
	return st, nil
}

// ParentRouteConfig is what ServeParentRoute works with.
type ParentRouteConfig struct {
	// Door re-checks the request and routes it on (access.Door.Serve).
	Door interface {
		Serve(ctx context.Context, req *siteproto.RouteRequest) (store.Node, access.Route, error)
	}
	// Services, if set, serves the route streams of service tunnels
	// (hub/service), which their relay checks and audits.
	Services func(ctx context.Context, st tunnel.Stream, req *siteproto.RouteRequest)
	Audit    func(store.AuditEvent)
	Logger   *slog.Logger
}

// ServeParentRoute serves one route stream the parent opened on this
// site hub's uplink (the uplink hands over only streams accepted there):
// the door re-checks the request and finds the target in this hub's own
// subtree only; the hop is audited with the parent's operator, origin,
// purpose and trace, then the stream is routed on and carried.
func ServeParentRoute(ctx context.Context, st tunnel.Stream, req *siteproto.RouteRequest, cfg ParentRouteConfig) {
	ev := store.AuditEvent{At: time.Now(), Kind: "site_route", Operator: req.Operator, Node: req.Target,
		Detail: fmt.Sprintf("from parent hub; purpose %s; origin %s; trace %s; %s", req.Purpose, short(req.Origin),
			req.Trace, routeHeader(req))}
	if req.Purpose == siteproto.PurposeService {
		if f := cfg.Services; f != nil {
			f(ctx, st, req)
			return
		}
	}
	n, route, err := cfg.Door.Serve(ctx, req)
	var out tunnel.Stream
	if err == nil {
		hop := access.Hop{Purpose: req.Purpose, Operator: req.Operator, Origin: req.Origin, Trace: req.Trace}
		out, err = route.Dial(access.WithHop(ctx, hop), tunnel.Header{Service: tunnel.Service(req.Service), Port: req.Port})
	}
	if err != nil {
		ev.Result = "refused"
		switch {
		case errors.Is(err, access.ErrOffline):
			ev.Result = "offline"
		case errors.Is(err, access.ErrUnknownNode), errors.Is(err, access.ErrDenied),
			errors.Is(err, access.ErrRevoked):
		default:
			ev.Result = "error"
		}
		ev.Detail += "; " + err.Error()
		cfg.Audit(ev)
		cfg.Logger.Info("route from the parent refused", "target", req.Target, "operator", req.Operator,
			"trace", req.Trace, "err", err)
		_ = tunnel.WriteReply(st, tunnel.Reply{Reason: replyReason(err)})
		st.Close()
		return
	}
	if err := tunnel.WriteReply(st, tunnel.Reply{OK: true}); err != nil {
		out.Close()
		st.Close()
		return
	}
	ev.Node = n.Name
	cfg.Logger.Debug("route from the parent", "node", n.Name, "operator", req.Operator, "purpose", req.Purpose,
		"trace", req.Trace, "via", route.String())
	counts := tunnel.Pipe(st, out, nil)
	ev.Result, ev.EndedAt, ev.BytesToNode, ev.BytesFromNode = "ok", time.Now(), counts.AtoB, counts.BtoA
	cfg.Audit(ev)
}

// replyReason is err as a tunnel.Reply reason: no control characters, at
// most tunnel.MaxReasonLen bytes.
func replyReason(err error) string {
	r := strings.Map(func(c rune) rune {
		if unicode.IsControl(c) {
			return ' '
		}
		return c
	}, err.Error())
	for len(r) > tunnel.MaxReasonLen {
		r = r[:tunnel.MaxReasonLen]
		for !utf8.ValidString(r) {
			r = r[:len(r)-1]
		}
	}
	return r
}

func routeHeader(req *siteproto.RouteRequest) string {
	return tunnel.Header{Service: tunnel.Service(req.Service), Port: req.Port}.String()
}
