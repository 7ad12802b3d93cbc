package site

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/resume"
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
// reading its answer while the session is up (a dead one fails the wait at
// once): well under the 10 s a stock ssh's ConnectTimeout commonly gives a
// whole jump, so the operator reads which hop is slow rather than
// "Connection timed out during banner exchange". The child may route on
// through a site below; it is told how long this hub waits
// (RouteRequest.WaitMillis) and answers within it.
const routeOpenTimeout = 7 * time.Second

// goneWait bounds how long a route whose site session just failed waits
// for the session's end to be recorded, to say since when the site is
// unreachable (it takes a store write or two).
const goneWait = 2 * time.Second

// noAnswerError: a hop did not answer a route in time, its session up.
type noAnswerError struct {
	hop    string // "site berlin", "node n1"
	within time.Duration
}

func (e *noAnswerError) Error() string {
	return fmt.Sprintf("%s did not answer within %s", e.hop, e.within.Round(time.Millisecond))
}

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
// req and reads the child's answer. A child that is down, or whose session
// ends meanwhile (its watchdog found it silent), fails the route with an
// *access.SiteUnreachableError; one that does not answer within
// routeOpenTimeout (or ctx's deadline, if sooner) with an error saying so.
func (r *Routes) OpenRoute(ctx context.Context, child string, req *siteproto.RouteRequest) (tunnel.Stream, error) {
	conn, gone, ok := r.children.session(child)
	if !ok {
		return nil, r.unreachable(child)
	}
	wait := routeOpenTimeout
	if d, ok := ctx.Deadline(); ok {
		wait = min(wait, time.Until(d))
	}
	if wait <= 0 {
		return nil, fmt.Errorf("route to site %s: %w", child, context.DeadlineExceeded)
	}
	ctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	sent := *req
	sent.WaitMillis = int(wait / time.Millisecond)
	failed := func(what string, err error) error {
		if sessionEnded(conn.Session, err) {
			// The session ended under the route: the site is down.
			select {
			case <-gone:
			case <-time.After(goneWait):
			}
			return r.unreachable(child)
		}
		if isTimeout(err) {
			return fmt.Errorf("%w, though its session is up: it, or a hop below it, is slow or overloaded; "+
				"try again, or see `tether sites`", &noAnswerError{hop: "site " + child, within: wait})
		}
		return fmt.Errorf("%s site %s: %w", what, child, err)
	}
	st, err := conn.Session.OpenStream(ctx)
	if err != nil {
		return nil, failed("open a route stream to", err)
	}
	deadline, _ := ctx.Deadline()
	_ = st.SetDeadline(deadline)
	if err := tunnel.WriteHeader(st, tunnel.Header{Service: tunnel.ServiceRoute}); err != nil {
		st.Close()
		return nil, failed("send the route header to", err)
	}
	// A site that keeps its parent's streams (control.CapResume) gets the
	// resume Open frame, and the stream outlives a flap of its uplink.
	p, err := conn.OpenResumable(st)
	if err != nil {
		st.Close()
		return nil, failed("send the route stream's id to", err)
	}
	st = p
	if err := siteproto.WriteRouteRequest(st, &sent); err != nil {
		st.Close()
		return nil, failed("send the route request to", err)
	}
	rep, err := tunnel.ReadReply(st)
	if err != nil {
		st.Close()
		return nil, failed("read the answer of", err)
	}
	_ = st.SetDeadline(time.Time{})
	if !rep.OK {
		st.Close()
		return nil, fmt.Errorf("site %s refused: %s", child, rep.Reason)
	}
	kept, err := resume.Answered(st)
	if err != nil {
		return nil, fmt.Errorf("route to site %s: %w", child, err)
	}
	return kept, nil
}

// unreachable is the error for a route to child while it is down, since
// when this hub lost it (now, if the loss is not recorded yet).
func (r *Routes) unreachable(child string) error {
	c, ok := r.children.Get(child)
	err := c.Unreachable()
	var ue *UnreachableError
	switch {
	case ok && errors.As(err, &ue):
		return &access.SiteUnreachableError{Site: child, Since: ue.Since}
	case ok:
		return &access.SiteUnreachableError{Site: child, Since: time.Now()}
	}
	return &access.SiteUnreachableError{Site: child}
}

// sessionEnded: err, from a stream of sess, says sess ended (a stream
// hears of it before the session's Done closes).
func sessionEnded(sess tunnel.Session, err error) bool {
	select {
	case <-sess.Done():
		return true
	default:
		return errors.Is(err, tunnel.ErrSessionClosed)
	}
}

// isTimeout: err is a deadline's (a stream's or a context's).
func isTimeout(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, os.ErrDeadlineExceeded) ||
		(errors.As(err, &ne) && ne.Timeout())
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
		dctx, cancel := context.WithCancel(ctx)
		budget := answerBudget(req.WaitMillis)
		if budget > 0 {
			dctx, cancel = context.WithTimeout(ctx, budget)
		}
		out, err = route.Dial(access.WithHop(dctx, hop), tunnel.Header{Service: tunnel.Service(req.Service), Port: req.Port})
		// The deadline, not dctx.Err(): a stream's deadline may fire a hair
		// before the context's own timer does.
		dl, _ := dctx.Deadline()
		var na *noAnswerError
		if err != nil && budget > 0 && !time.Now().Before(dl) && isTimeout(err) && !errors.As(err, &na) {
			err = fmt.Errorf("%w: its agent or its link is slow", &noAnswerError{hop: "node " + n.Name, within: budget})
		}
		cancel()
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
	// Answered, a stream that outlives the uplink's session
	// (resume.Pending) is held from here on.
	if st, err = resume.Answered(st); err != nil {
		cfg.Logger.Info("route from the parent not kept", "target", req.Target, "trace", req.Trace, "err", err)
		out.Close()
		return
	}
	// ctx ends with the uplink (a held stream outlives the session it
	// came on): a route whose one way is done must not wait on the other.
	stop := context.AfterFunc(ctx, func() { st.Close(); out.Close() })
	defer stop()
	ev.Node = n.Name
	cfg.Logger.Debug("route from the parent", "node", n.Name, "operator", req.Operator, "purpose", req.Purpose,
		"trace", req.Trace, "via", route.String())
	counts := tunnel.Pipe(st, out, nil)
	ev.Result, ev.EndedAt, ev.BytesToNode, ev.BytesFromNode = "ok", time.Now(), counts.AtoB, counts.BtoA
	cfg.Audit(ev)
}

// answerBudget is how long a site routing on a stream from its parent may
// take to answer, the parent waiting waitMillis (0: unsaid, the hops' own
// timeouts apply): a tenth less, and at least half a second less, so that
// the refusal naming the slow hop reaches the parent before it gives up.
func answerBudget(waitMillis int) time.Duration {
	if waitMillis <= 0 {
		return 0
	}
	wait := time.Duration(waitMillis) * time.Millisecond
	return max(wait-max(wait/10, 500*time.Millisecond), 100*time.Millisecond)
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
