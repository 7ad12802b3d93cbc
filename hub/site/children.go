package site

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// ChildrenConfig configures the parent's side.
type ChildrenConfig struct {
	// Store holds the sites and their inventories. Required.
	Store store.SiteStore
	// HubID is this hub's ID (see HubID). Required.
	HubID string
	// Above returns this hub's own path as the root names it ("" at the
	// root) and the hub IDs above it, parent first (nil at the root): a
	// site hub's uplink (Uplink.Path, Uplink.Ancestors). Nil means root.
	Above func() (path string, ancestors []string)
	// StaleAfter is how long a site may stay silent before it is shown
	// stale; default StaleFactor × DefaultStatusInterval.
	StaleAfter time.Duration
	// Heartbeat is how often a site that announced
	// siteproto.CapSiteLiveness is asked to heartbeat, and DeadPeer how
	// long nothing may arrive on its session before this hub closes it;
	// defaults DefaultSiteHeartbeat and DefaultSiteDeadPeer.
	Heartbeat time.Duration
	DeadPeer  time.Duration
	// Audit records refusals and inventory violations; nil drops them.
	Audit func(store.AuditEvent)
	// Changed, if set, is called (without locks held, must not block)
	// when a site's status or inventory changed here, so a hub that is
	// itself a site can report up sooner.
	Changed func()
	Logger  *slog.Logger
	// Now is the clock (tests); default time.Now.
	Now func() time.Time
}

// CheckAndSetDefaults validates c and fills defaults.
func (c *ChildrenConfig) CheckAndSetDefaults() error {
	if c.Store == nil {
		return errors.New("site: ChildrenConfig.Store is required")
	}
	if !validHubID(c.HubID) {
		return fmt.Errorf("site: ChildrenConfig.HubID %q is not a hub ID", c.HubID)
	}
	if c.Above == nil {
		c.Above = func() (string, []string) { return "", nil }
	}
	if c.StaleAfter <= 0 {
		c.StaleAfter = StaleFactor * DefaultStatusInterval
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = DefaultSiteHeartbeat
	}
	if c.DeadPeer <= 0 {
		c.DeadPeer = DefaultSiteDeadPeer
	}
	if c.Heartbeat < siteproto.MinHeartbeatMillis*time.Millisecond || c.DeadPeer < 2*c.Heartbeat ||
		c.DeadPeer > siteproto.MaxLivenessMillis*time.Millisecond {
		return fmt.Errorf("site: a site heartbeat every %s, dead after %s: want at least %dms, and dead after "+
			"two heartbeats or more", c.Heartbeat, c.DeadPeer, siteproto.MinHeartbeatMillis)
	}
	if c.Audit == nil {
		c.Audit = func(store.AuditEvent) {}
	}
	if c.Changed == nil {
		c.Changed = func() {}
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Now == nil {
		c.Now = time.Now
	}
	return nil
}

// Children are the sites below this hub: who they are, whether their uplink
// is up, their last status and their inventory. Their sessions live in the
// hub's registry like nodes' sessions; Children only knows which of them
// are sites.
type Children struct {
	cfg ChildrenConfig
	log *slog.Logger

	hmu        sync.Mutex // guards handlers and onConnect
	handlers   map[control.Type]func(ctx context.Context, site Child, m *control.Message)
	onConnect  []func(ctx context.Context, site Child)
	onStreams  func(ctx context.Context, site Child, st tunnel.Stream, req *siteproto.RouteRequest)
	mu         sync.Mutex        // guards sites
	sites      map[string]*child // by site name
	knownSince time.Time         // when this hub started (sites not heard since are unreachable since then)
}

// child is one site's live state.
type child struct {
	Child
	subtree []string
	seq     uint64 // highest status Seq stored
	// sessionStart is when its latest session began: a fresh session
	// counts as heard from.
	sessionStart time.Time
	conn         *nodeconn.Conn // the live session; nil when down
	// gone is closed once conn's end is recorded (Since set): a route that
	// saw the session fail waits for it to say since when.
	gone chan struct{}
	// staging holds a full inventory run until its Done page.
	staging []store.SiteNode
	inFull  bool
}

// NewChildren loads the sites this hub knows from the store.
func NewChildren(ctx context.Context, cfg ChildrenConfig) (*Children, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	c := &Children{cfg: cfg, log: cfg.Logger, handlers: map[control.Type]func(context.Context, Child, *control.Message){},
		sites: map[string]*child{}, knownSince: cfg.Now()}
	rows, err := cfg.Store.ListSites(ctx)
	if err != nil {
		return nil, err
	}
	for _, r := range rows {
		c.sites[r.Name] = c.childOf(r)
	}
	return c, nil
}

// StaleAfter is how long a site may stay silent before it is shown stale.
func (c *Children) StaleAfter() time.Duration { return c.cfg.StaleAfter }

// Handle registers h for control messages of type t from any site. It is
// called on the site session's reader, in order, so it must not block for
// long; a message type without a handler (and not one of the site
// protocol's own: status, inventory) closes that site's session.
func (c *Children) Handle(t control.Type, h func(ctx context.Context, site Child, m *control.Message)) {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	c.handlers[t] = h
}

// OnConnect registers f, called in its own goroutine each time a site's
// session is welcomed (ctx ends with that session): desired state is resent
// from here.
func (c *Children) OnConnect(f func(ctx context.Context, site Child)) {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	c.onConnect = append(c.onConnect, f)
}

// ServeStreams registers f for the tunnel.ServiceRoute streams a site
// opens on its uplink (service tunnels up the tree): the header and the
// route request are read and checked here, and f, called in its own
// goroutine, owns st, answers with a tunnel.Reply and carries the bytes.
// Without f such streams are refused with a reply, and welcomes do not
// list siteproto.HubCapSiteStreams (register f before sessions are served).
func (c *Children) ServeStreams(
	f func(ctx context.Context, site Child, st tunnel.Stream, req *siteproto.RouteRequest),
) {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	c.onStreams = f
}

// ServesStreams reports whether streams from sites are served (a
// ServeStreams callback is set): the welcome then lists
// siteproto.HubCapSiteStreams.
func (c *Children) ServesStreams() bool {
	c.hmu.Lock()
	defer c.hmu.Unlock()
	return c.onStreams != nil
}

// Get returns the site called name.
func (c *Children) Get(name string) (Child, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.sites[name]
	if !ok {
		return Child{}, false
	}
	return c.viewLocked(ch), true
}

// List returns every site below this hub, by name. It first reconciles
// with the store: a site removed (`tether nodes rm`) is gone, and a status
// another hub replica received is taken.
func (c *Children) List() []Child {
	c.refresh()
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Child, 0, len(c.sites))
	for _, ch := range c.sites {
		out = append(out, c.viewLocked(ch))
	}
	slices.SortFunc(out, func(a, b Child) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// refresh reconciles the sites with the store (best effort: on an error
// the ones in memory stand).
func (c *Children) refresh() {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	rows, err := c.cfg.Store.ListSites(ctx)
	if err != nil {
		c.log.Warn("list sites", "err", err)
		return
	}
	byID := make(map[string]store.Site, len(rows))
	for _, r := range rows {
		byID[r.NodeID] = r
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	for name, ch := range c.sites {
		r, ok := byID[ch.NodeID]
		if !ok {
			delete(c.sites, name)
			continue
		}
		delete(byID, ch.NodeID)
		if r.StatusSeq > ch.seq && len(r.Status) > 0 {
			var st siteproto.Status
			if json.Unmarshal(r.Status, &st) == nil {
				ch.seq, ch.Status, ch.LastHeartbeat = r.StatusSeq, &st, r.StatusAt
			}
		}
	}
	for _, r := range byID { // joined since (or on another replica)
		if _, taken := c.sites[r.Name]; !taken {
			c.sites[r.Name] = c.childOf(r)
		}
	}
}

// childOf is a stored site not connected here.
func (c *Children) childOf(r store.Site) *child {
	ch := &child{Child: Child{Name: r.Name, NodeID: r.NodeID, HubID: r.HubID, Path: r.Path, HostCAs: r.HostCAs,
		LastHeartbeat: r.StatusAt, Since: c.knownSince}, subtree: r.Subtree, seq: r.StatusSeq}
	if len(r.Status) > 0 {
		var st siteproto.Status
		if json.Unmarshal(r.Status, &st) == nil {
			ch.Status = &st
		}
	}
	return ch
}

// viewLocked is ch as shown now: stale when nothing was heard from it
// (a status, or the start of its session) within the stale timeout.
func (c *Children) viewLocked(ch *child) Child {
	v := ch.Child
	now := c.cfg.Now()
	heard := v.LastHeartbeat
	if ch.sessionStart.After(heard) {
		heard = ch.sessionStart
	}
	if heard.IsZero() {
		heard = c.knownSince
	}
	if silent := now.Sub(heard); silent > c.cfg.StaleAfter {
		v.Stale, v.StaleFor = true, silent.Round(time.Second)
		if v.Connected {
			// Unreachable since this hub judged it so, not since the
			// status before: the site may have been well after that.
			v.Since = heard.Add(c.cfg.StaleAfter)
		}
	}
	if !v.Connected && v.Since.IsZero() {
		v.Since = heard
	}
	if v.Status != nil {
		st := *v.Status
		v.Status = &st
	}
	v.HostCAs = slices.Clone(v.HostCAs)
	return v
}

// Session returns the live session of site name, to open tunnel.ServiceRoute
// streams on (false when the site is down or no such site).
func (c *Children) Session(name string) (*nodeconn.Conn, bool) {
	conn, _, ok := c.session(name)
	return conn, ok
}

// session is Session, and a channel closed once that session's end is
// recorded.
func (c *Children) session(name string) (*nodeconn.Conn, <-chan struct{}, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	ch, ok := c.sites[name]
	if !ok || ch.conn == nil {
		return nil, nil, false
	}
	return ch.conn, ch.gone, true
}

// Send writes a control message to site name: ErrNoSuchSite, or an
// *UnreachableError when its uplink is down.
func (c *Children) Send(ctx context.Context, site string, m *control.Message) error {
	c.mu.Lock()
	ch, ok := c.sites[site]
	var conn *nodeconn.Conn
	var view Child
	if ok {
		conn, view = ch.conn, c.viewLocked(ch)
	}
	c.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w: %q", ErrNoSuchSite, site)
	}
	if conn == nil {
		return view.Unreachable()
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := conn.Send(m); err != nil {
		return fmt.Errorf("site %s: send %s: %w (%w)", site, m.Type, err, ErrSiteUnreachable)
	}
	return nil
}

// Subtree is the hub IDs below this hub (its sites' subtrees), for this
// hub's own hello when it is a site too.
func (c *Children) Subtree() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	var out []string
	for _, ch := range c.sites {
		out = append(out, ch.subtree...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Admit decides whether the session of node (nodeID, name) may be a site:
// its certificate came from a site token (ErrNotSite otherwise), its hello
// names it as the certificate does, and its subtree holds neither this hub
// nor one above it (ErrCycle). It returns the welcome's site section.
func (c *Children) Admit(ctx context.Context, nodeID, name string, h *siteproto.Hello) (*siteproto.Welcome, error) {
	if _, err := c.cfg.Store.GetSite(ctx, nodeID); errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf(
			"%w: %s joined with a node token; a site hub joins with a site token (`tether site token create`)", ErrNotSite, name)
	} else if err != nil {
		return nil, err
	}
	if h == nil {
		return nil, fmt.Errorf("%w: %s's hello has no site section", ErrNotSite, name)
	}
	if h.Name != name {
		return nil, fmt.Errorf("%w: this certificate belongs to site %q, not %q", ErrNotSite, name, h.Name)
	}
	path, above := c.cfg.Above()
	if err := checkCycle(c.cfg.HubID, above, h); err != nil {
		return nil, err
	}
	if len(above)+1 > siteproto.MaxDepth {
		return nil, fmt.Errorf("site: %s would be deeper than %d hubs below the root", name, siteproto.MaxDepth)
	}
	full := name
	if path != "" {
		full = name + "." + path
	}
	if err := siteproto.ValidPath(full); err != nil {
		return nil, fmt.Errorf("site: %s: %w", name, err)
	}
	return &siteproto.Welcome{Path: full, Ancestors: append([]string{c.cfg.HubID}, above...)}, nil
}

// checkCycle refuses a site whose subtree holds this hub or one above it.
func checkCycle(self string, above []string, h *siteproto.Hello) error {
	for _, id := range append([]string{self}, above...) {
		if h.HubID == id || slices.Contains(h.Subtree, id) {
			return fmt.Errorf("%w: site %s's subtree holds hub %s, which is this hub or above it", ErrCycle, h.Name, short(id))
		}
	}
	if !slices.Contains(h.Subtree, h.HubID) {
		return fmt.Errorf("site: %s's subtree does not hold its own hub ID", h.Name)
	}
	return nil
}

func short(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// Connected records conn as site name's live session (after Admit and the
// welcome), runs the OnConnect hooks, and returns the function to call when
// the session ends.
func (c *Children) Connected(
	ctx context.Context, conn *nodeconn.Conn, h *siteproto.Hello, w *siteproto.Welcome,
) (disconnected func()) {
	now := c.cfg.Now()
	if err := c.cfg.Store.UpdateSiteHello(ctx, conn.NodeID, h.HubID, w.Path, h.HostCAs, h.Subtree); err != nil {
		c.log.Error("record site hello", "site", conn.Name, "err", err)
	}
	c.mu.Lock()
	ch, ok := c.sites[conn.Name]
	if !ok || ch.NodeID != conn.NodeID {
		ch = &child{Child: Child{Name: conn.Name, NodeID: conn.NodeID}}
		c.sites[conn.Name] = ch
	}
	ch.HubID, ch.Path, ch.HostCAs, ch.subtree = h.HubID, w.Path, slices.Clone(h.HostCAs), slices.Clone(h.Subtree)
	gone := make(chan struct{})
	ch.conn, ch.gone, ch.Connected, ch.sessionStart, ch.Since = conn, gone, true, now, time.Time{}
	ch.staging, ch.inFull = nil, false
	view := c.viewLocked(ch)
	c.mu.Unlock()
	c.cfg.Changed()
	c.log.Info("site connected", "site", conn.Name, "path", w.Path, "hub_id", short(h.HubID))

	// ended records the session's end once, at the first of the watchdog's
	// verdict and the session's own end, and says when that was.
	ended := sync.OnceValue(func() time.Time {
		at := c.cfg.Now()
		c.mu.Lock()
		if ch.conn == conn {
			ch.conn, ch.Connected, ch.Since = nil, false, at
			ch.staging, ch.inFull = nil, false
		}
		c.mu.Unlock()
		close(gone)
		return at
	})
	hctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	c.hmu.Lock()
	hooks := slices.Clone(c.onConnect)
	c.hmu.Unlock()
	for _, f := range hooks {
		wg.Go(func() { f(hctx, view) })
	}
	wg.Go(func() { c.acceptStreams(hctx, conn) })
	if w.DeadPeerMillis > 0 {
		wg.Go(func() { c.watch(hctx, conn, time.Duration(w.DeadPeerMillis)*time.Millisecond, ended) })
	}
	return func() {
		cancel()
		// The session ends here (it would right after): streams a site
		// opened end with it, so waiting for their handlers cannot hang.
		conn.Session.Close()
		wg.Wait()
		at := ended()
		if err := c.cfg.Store.SetSiteDisconnected(context.Background(), conn.NodeID, at); err != nil &&
			!errors.Is(err, store.ErrNotFound) {
			c.log.Error("record site disconnect", "site", conn.Name, "err", err)
		}
		c.cfg.Changed()
		c.log.Info("site disconnected", "site", conn.Name)
	}
}

// watch closes conn's session once nothing at all arrived on it for
// deadPeer (a site that announced siteproto.CapSiteLiveness heartbeats
// several times within it, and its parent answers each beat, whose
// acknowledgements arrive too). A site hub killed without a goodbye, or
// whose link died, sends nothing more, and on QUIC nothing tells this hub
// so: without this its routes would wait out the nodes' dead-peer timeout.
// Counting every packet rather than control messages keeps a lossy link
// from flapping: a retransmission or an acknowledgement is as good a sign
// of life as a heartbeat held up behind a lost one.
func (c *Children) watch(ctx context.Context, conn *nodeconn.Conn, deadPeer time.Duration, ended func() time.Time) {
	tick := max(deadPeer/10, 10*time.Millisecond)
	t := time.NewTicker(tick)
	defer t.Stop()
	last, heardAt := conn.Session.Heard(), time.Now()
	var longest time.Duration // the margin the link left, for the log
	defer func() {
		c.log.Debug("site session's watchdog ended", "site", conn.Name, "longest_silence", longest.Round(tick),
			"dead_peer", deadPeer)
	}()
	for {
		select {
		case <-ctx.Done():
			return
		case <-conn.Session.Done():
			return
		case now := <-t.C:
			silent := now.Sub(heardAt)
			if h := conn.Session.Heard(); h != last {
				last, heardAt = h, now
				continue
			}
			longest = max(longest, silent)
			if silent >= deadPeer {
				// Recorded before the close, so that the routes the
				// close fails find the site down, since now.
				ended()
				c.log.Warn("nothing heard from the site; closing its session", "site", conn.Name,
					"silent_for", silent.Round(time.Millisecond))
				conn.Session.Close()
				return
			}
		}
	}
}

// acceptStreams serves the streams a site opens until its session ends.
func (c *Children) acceptStreams(ctx context.Context, conn *nodeconn.Conn) {
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		st, err := conn.Session.AcceptStream(ctx)
		if err != nil {
			return
		}
		wg.Go(func() { c.serveStream(ctx, conn, st) })
	}
}

// serveStream reads a site's stream header and route request and hands
// the stream on, or refuses it with a reason (audited). A site back after
// its uplink flapped re-attaches this hub's route streams to it
// (tunnel.ServiceResume).
func (c *Children) serveStream(ctx context.Context, conn *nodeconn.Conn, st tunnel.Stream) {
	refuse := func(why string) {
		c.cfg.Audit(store.AuditEvent{At: c.cfg.Now(), Kind: "stream", Node: conn.Name,
			Remote: conn.Session.RemoteAddr().String(), Result: "refused", Detail: "site stream: " + why})
		_ = tunnel.WriteReply(st, tunnel.Reply{OK: false, Reason: why})
		st.Close()
	}
	_ = st.SetReadDeadline(time.Now().Add(routeReadTimeout))
	h, err := tunnel.ReadHeader(st)
	if err != nil {
		refuse("bad stream header")
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	if h.Service == tunnel.ServiceResume && conn.Resumable() {
		// The site is back after its uplink flapped: one of the route
		// streams this hub opened to it re-attaches.
		conn.AcceptResume(ctx, st)
		return
	}
	c.hmu.Lock()
	f := c.onStreams
	c.hmu.Unlock()
	if f == nil {
		refuse("this hub serves no streams from its sites")
		return
	}
	_ = st.SetReadDeadline(time.Now().Add(routeReadTimeout))
	if h.Service != tunnel.ServiceRoute {
		refuse("a site may open only route streams, not " + h.String())
		return
	}
	req, err := siteproto.ReadRouteRequest(st)
	if err != nil {
		refuse("bad route request: " + err.Error())
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	site, ok := c.Get(conn.Name)
	if !ok {
		refuse("site " + conn.Name + " is no longer known here")
		return
	}
	f(ctx, site, st, req)
}

// routeReadTimeout bounds reading a stream's header and route request.
const routeReadTimeout = 15 * time.Second

// Dispatch handles one control message from conn's session. handled is
// false when conn is not a connected site or the message is not a site
// message (the caller's own handling applies); an error means the site
// broke the protocol and its session must close (already audited).
func (c *Children) Dispatch(ctx context.Context, conn *nodeconn.Conn, m *control.Message) (handled bool, err error) {
	c.mu.Lock()
	ch, ok := c.sites[conn.Name]
	ok = ok && ch.conn == conn
	c.mu.Unlock()
	if !ok {
		return false, nil
	}
	switch m.Type {
	case siteproto.TypeStatus:
		return true, c.status(ctx, ch, m.SiteStatus)
	case siteproto.TypeNodes:
		if err := c.inventory(ctx, ch, m.SiteNodes); err != nil {
			c.cfg.Audit(store.AuditEvent{At: c.cfg.Now(), Kind: "site", Node: conn.Name,
				Remote: conn.Session.RemoteAddr().String(), Result: "refused", Detail: "site session closed: " + err.Error()})
			return true, err
		}
		return true, nil
	}
	c.hmu.Lock()
	h := c.handlers[m.Type]
	c.hmu.Unlock()
	if h == nil {
		return false, nil
	}
	site, _ := c.Get(conn.Name)
	h(ctx, site, m)
	return true, nil
}

// status stores a site's heartbeat; a Seq at or below the last one stored
// is a late duplicate and changes nothing.
func (c *Children) status(ctx context.Context, ch *child, st *siteproto.Status) error {
	now := c.cfg.Now()
	c.mu.Lock()
	dup := st.Seq <= ch.seq
	c.mu.Unlock()
	if dup {
		c.log.Debug("site status dropped: not newer", "site", ch.Name, "seq", st.Seq)
		return nil
	}
	body, err := json.Marshal(st)
	if err != nil {
		return fmt.Errorf("site: encode status of %s: %w", ch.Name, err)
	}
	stored, err := c.cfg.Store.SetSiteStatus(ctx, ch.NodeID, st.Seq, body, now)
	if err != nil {
		c.log.Error("record site status", "site", ch.Name, "err", err)
		// Kept in memory all the same: the heartbeat arrived.
	} else if !stored {
		return nil // another replica stored a newer one
	}
	c.mu.Lock()
	if st.Seq > ch.seq {
		ch.seq, ch.Status, ch.LastHeartbeat = st.Seq, st, now
	}
	c.mu.Unlock()
	c.cfg.Changed()
	return nil
}

// validHubID: 64 lower-case hex digits.
func validHubID(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}
