package site

import (
	"context"
	"crypto"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// Timeouts of one uplink attempt (as the agent's).
const (
	dialTimeout    = 20 * time.Second
	openCtlTimeout = 10 * time.Second
	welcomeTimeout = 15 * time.Second
	sendTimeout    = 10 * time.Second
	routeTimeout   = 15 * time.Second
	renewAnswer    = 30 * time.Second
	// inventoryPage bounds the entries of one site_nodes message so it
	// stays well under control.MaxFrame.
	inventoryPage = 1000
)

// ErrRefused: the parent refuses this site for good (removed, revoked, a
// cycle); reconnecting cannot help.
var ErrRefused = errors.New("site: the parent hub refused this site")

// ErrNoStreams: the parent does not take route streams from its sites.
var ErrNoStreams = errors.New("site: no route streams to the parent")

// UplinkConfig configures the site's side.
type UplinkConfig struct {
	// Dir holds the parent identity (JoinParent). Required.
	Dir string
	// HubID is this hub's ID (see HubID). Required.
	HubID string
	// HostCAs are this hub's SSH host CA keys (authorized_keys format).
	HostCAs []string
	// Subtree returns the hub IDs below this hub (its own sites'
	// subtrees, Children.Subtree); nil means none. This hub's ID is added.
	Subtree func() []string
	// StatusInterval is how often the status goes up (and at most how
	// late a change is reported); default DefaultStatusInterval.
	StatusInterval time.Duration
	// Status builds the site's status (health, node counts, sub-sites);
	// Seq, At and QueuedSince are set here, and the AddStatus hooks fill
	// the rest. Required.
	Status func(ctx context.Context) (*control.SiteStatus, error)
	// Inventory lists the site's nodes and its sub-sites' nodes, named
	// relative to this site. Required.
	Inventory func(ctx context.Context) ([]control.SiteNode, error)
	// AgentVersion is put in the hello.
	AgentVersion string
	Transport    tunnel.Transport
	Tunnel       *tunnel.Config
	BackoffMin   time.Duration // default 500ms
	BackoffMax   time.Duration // default 30s
	Logger       *slog.Logger
}

// CheckAndSetDefaults validates c and fills defaults.
func (c *UplinkConfig) CheckAndSetDefaults() error {
	switch {
	case c.Dir == "":
		return errors.New("site: UplinkConfig.Dir is required")
	case !validHubID(c.HubID):
		return fmt.Errorf("site: UplinkConfig.HubID %q is not a hub ID", c.HubID)
	case c.Status == nil || c.Inventory == nil:
		return errors.New("site: UplinkConfig.Status and Inventory are required")
	}
	if c.Subtree == nil {
		c.Subtree = func() []string { return nil }
	}
	if c.StatusInterval <= 0 {
		c.StatusInterval = DefaultStatusInterval
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 500 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 30 * time.Second
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Uplink keeps a site hub's one session with its parent: hello as a site,
// heartbeats, certificate renewal, the status heartbeat and inventory up,
// control messages and route streams down. Nothing of the site's own
// serving waits on it: a site works alone while its uplink is down.
type Uplink struct {
	cfg  UplinkConfig
	log  *slog.Logger
	id   *identity
	seqs *seqs

	hmu       sync.Mutex // guards the hooks
	handlers  map[control.Type]func(ctx context.Context, m *control.Message)
	onConnect []func(ctx context.Context)
	addStatus []func(*control.SiteStatus)
	routes    func(ctx context.Context, st tunnel.Stream, req *control.RouteRequest)

	mu          sync.Mutex // guards the following fields
	sess        *uplinkSession
	downSince   time.Time // when the uplink went down (zero before its first session)
	started     time.Time // when this Uplink was made
	parentCaps  []string
	lastErr     error
	kick        chan struct{}
	fatal       error
	connectedAt time.Time
}

// NewUplink loads the parent identity from cfg.Dir (JoinParent made it).
func NewUplink(cfg UplinkConfig) (*Uplink, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	id, err := loadIdentity(cfg.Dir)
	if err != nil {
		return nil, err
	}
	sq, err := loadSeqs(cfg.Dir)
	if err != nil {
		return nil, err
	}
	return &Uplink{cfg: cfg, log: cfg.Logger.With("component", "uplink", "site", id.cfg.Name), id: id, seqs: sq,
		handlers: map[control.Type]func(context.Context, *control.Message){}, started: time.Now(), kick: make(chan struct{}, 1)}, nil
}

// Name is this site's name at its parent.
func (u *Uplink) Name() string { return u.id.snapshot().Name }

// Connected reports whether the uplink session is up now.
func (u *Uplink) Connected() bool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.sess != nil
}

// DownSince is when the uplink went down, or when the hub started if it
// has not been up since (zero while it is up).
func (u *Uplink) DownSince() time.Time {
	u.mu.Lock()
	defer u.mu.Unlock()
	switch {
	case u.sess != nil:
		return time.Time{}
	case u.downSince.IsZero():
		return u.started
	}
	return u.downSince
}

// Path is this site's full name as the root names it ("berlin.region"),
// from the parent's last welcome (kept across restarts); before the first
// welcome it is the site's name.
func (u *Uplink) Path() string {
	c := u.id.snapshot()
	if c.Path == "" {
		return c.Name
	}
	return c.Path
}

// Ancestors are the hub IDs above this site, parent first, from the
// parent's last welcome (nil before the first).
func (u *Uplink) Ancestors() []string { return u.id.snapshot().Ancestors }

// ParentHubID is the parent's hub ID (the pin of its join string).
func (u *Uplink) ParentHubID() string { return HubID(u.id.id.CA) }

// ParentCapabilities are the HubCap* constants of the parent's last
// welcome (HubCapSiteStreams: it takes ServiceRoute streams from sites).
func (u *Uplink) ParentCapabilities() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return slices.Clone(u.parentCaps)
}

// Send writes m to the parent: ErrUplinkDown when the uplink is down.
func (u *Uplink) Send(m *control.Message) error {
	u.mu.Lock()
	s := u.sess
	u.mu.Unlock()
	if s == nil {
		return ErrUplinkDown
	}
	if err := s.send(m); err != nil {
		return fmt.Errorf("%w: send %s: %v", ErrUplinkDown, m.Type, err)
	}
	return nil
}

// Handle registers h for control messages of type t from the parent. It
// is called on the uplink's reader, in order, so it must not block for long.
// Messages without a handler are logged and ignored.
func (u *Uplink) Handle(t control.Type, h func(ctx context.Context, m *control.Message)) {
	u.hmu.Lock()
	defer u.hmu.Unlock()
	u.handlers[t] = h
}

// OnConnect registers f, called in its own goroutine each time the uplink
// is welcomed (ctx ends with that session).
func (u *Uplink) OnConnect(f func(ctx context.Context)) {
	u.hmu.Lock()
	defer u.hmu.Unlock()
	u.onConnect = append(u.onConnect, f)
}

// AddStatus registers f, called with every status before it goes up, to
// fill the parts other owners know (missions). It must not block.
func (u *Uplink) AddStatus(f func(*control.SiteStatus)) {
	u.hmu.Lock()
	defer u.hmu.Unlock()
	u.addStatus = append(u.addStatus, f)
}

// ServeRoutes registers f for the tunnel.ServiceRoute streams the parent
// opens: f owns st, answers with a tunnel.Reply and carries the bytes.
// Without f such streams are refused with a reply saying so.
func (u *Uplink) ServeRoutes(f func(ctx context.Context, st tunnel.Stream, req *control.RouteRequest)) {
	u.hmu.Lock()
	defer u.hmu.Unlock()
	u.routes = f
}

// Changed asks for a status and inventory check now rather than at the
// next tick (a node of the site connected, a sub-site reported).
func (u *Uplink) Changed() {
	select {
	case u.kick <- struct{}{}:
	default:
	}
}

// OpenRoute opens a tunnel.ServiceRoute stream to the parent, writes the
// header and req, and reads the parent's reply: the stream is ready for
// bytes when err is nil. ErrUplinkDown when the uplink is down.
func (u *Uplink) OpenRoute(ctx context.Context, req *control.RouteRequest) (tunnel.Stream, error) {
	u.mu.Lock()
	s, caps := u.sess, u.parentCaps
	u.mu.Unlock()
	if s == nil {
		return nil, ErrUplinkDown
	}
	if !slices.Contains(caps, control.HubCapSiteStreams) {
		return nil, fmt.Errorf("%w: the parent hub takes no streams from its sites (its welcome does not list %q)", ErrNoStreams, control.HubCapSiteStreams)
	}
	ctx, cancel := context.WithTimeout(ctx, routeTimeout)
	defer cancel()
	st, err := s.tun.OpenStream(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: open route stream: %v", ErrUplinkDown, err)
	}
	deadline, _ := ctx.Deadline()
	_ = st.SetDeadline(deadline)
	if err := tunnel.WriteHeader(st, tunnel.Header{Service: tunnel.ServiceRoute}); err != nil {
		st.Close()
		return nil, fmt.Errorf("site: route to %s: send header: %w", req.Target, err)
	}
	if err := control.WriteRouteRequest(st, req); err != nil {
		st.Close()
		return nil, fmt.Errorf("site: route to %s: %w", req.Target, err)
	}
	rep, err := tunnel.ReadReply(st)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("site: route to %s: read the parent's answer: %w", req.Target, err)
	}
	_ = st.SetDeadline(time.Time{})
	if !rep.OK {
		st.Close()
		return nil, fmt.Errorf("site: the parent refused the route to %s: %s", req.Target, rep.Reason)
	}
	return st, nil
}

// Err is why the uplink is down (nil while up or before the first try).
func (u *Uplink) Err() error {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.fatal != nil {
		return u.fatal
	}
	return u.lastErr
}

// Run keeps the uplink up until ctx ends (nil), or the parent refuses this
// site for good (ErrRefused, ErrCycle): then it stops and says why. The
// status heartbeat runs beside it.
func (u *Uplink) Run(ctx context.Context) error {
	attempt := 0
	for {
		connected, err := u.runOnce(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if errors.Is(err, ErrRefused) || errors.Is(err, ErrCycle) {
			u.mu.Lock()
			u.fatal = err
			u.mu.Unlock()
			u.log.Error("uplink stopped; this hub keeps serving its own nodes and sites", "err", err)
			return err
		}
		if connected {
			attempt = 0
		}
		u.mu.Lock()
		u.lastErr = err
		u.mu.Unlock()
		wait := backoff(attempt, u.cfg.BackoffMin, u.cfg.BackoffMax)
		attempt++
		u.log.Warn("uplink to the parent hub down; retrying", "err", err, "in", wait.Round(time.Millisecond))
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// backoff is "full jitter" with the base as a floor, as the agent's.
func backoff(attempt int, base, max time.Duration) time.Duration {
	d := base
	for i := 0; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return base/2 + time.Duration(rand.Int64N(int64(d)))
}

// uplinkSession is one session with the parent.
type uplinkSession struct {
	u      *Uplink
	tun    tunnel.Session
	ctrl   tunnel.Stream
	log    *slog.Logger
	sendMu sync.Mutex
}

func (s *uplinkSession) send(m *control.Message) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	_ = s.ctrl.SetWriteDeadline(time.Now().Add(sendTimeout))
	return control.Write(s.ctrl, m)
}

// runOnce makes one session and serves it until it ends.
func (u *Uplink) runOnce(ctx context.Context) (connected bool, err error) {
	s, err := u.dial(ctx)
	if err != nil {
		return false, err
	}
	defer s.tun.Close()
	stop := context.AfterFunc(ctx, func() { s.tun.Close() })
	defer stop()
	octx, cancel := context.WithTimeout(ctx, openCtlTimeout)
	s.ctrl, err = s.tun.OpenStream(octx)
	cancel()
	if err != nil {
		return false, fmt.Errorf("open control stream: %w", err)
	}
	defer s.ctrl.Close()
	w, err := s.handshake()
	if err != nil {
		return false, err
	}
	if slices.Contains(w.Site.Ancestors, u.cfg.HubID) {
		return false, fmt.Errorf("%w: this hub (%s) is above its own parent; the tree would loop. Join a hub outside this hub's subtree", ErrCycle, short(u.cfg.HubID))
	}
	if err := u.id.setPlace(w.Site.Path, w.Site.Ancestors); err != nil {
		u.log.Error("record the parent's welcome", "err", err)
	}
	live := control.AgentLiveness(u.cfg.Tunnel, w)
	u.mu.Lock()
	queued := u.downSince
	u.sess, u.parentCaps, u.lastErr, u.connectedAt = s, slices.Clone(w.Capabilities), nil, time.Now()
	u.mu.Unlock()
	s.log.Info("uplink connected", "path", w.Site.Path)
	defer func() {
		u.mu.Lock()
		u.sess, u.downSince = nil, time.Now()
		u.mu.Unlock()
	}()
	return true, s.serve(ctx, live, queued)
}

// dial opens a tunnel to the first of the parent's addresses that answers.
func (u *Uplink) dial(ctx context.Context) (*uplinkSession, error) {
	cfg := u.id.snapshot()
	tc := pki.ClientTLSConfig(u.id.cert(), u.id.id.CA)
	d := &tunnel.Dialer{TLSConfig: tc, Config: u.cfg.Tunnel, Transport: u.cfg.Transport, Logger: u.log}
	var errs []error
	for _, addr := range cfg.Hubs {
		dctx, cancel := context.WithTimeout(ctx, dialTimeout)
		tun, err := d.Dial(dctx, addr)
		cancel()
		if err == nil {
			return &uplinkSession{u: u, tun: tun, log: u.log.With("parent", addr, "transport", tun.Transport().String())}, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	return nil, errors.Join(errs...)
}

// hello announces this hub as a site.
func (s *uplinkSession) hello() *control.Message {
	u := s.u
	subtree := append([]string{u.cfg.HubID}, u.cfg.Subtree()...)
	slices.Sort(subtree)
	subtree = slices.Compact(subtree)
	if len(subtree) > control.MaxSubtreeHubs {
		subtree = subtree[:control.MaxSubtreeHubs]
	}
	return &control.Message{Type: control.TypeHello, Hello: &control.Hello{
		ProtocolVersion: control.ProtocolVersion,
		Name:            u.id.snapshot().Name,
		AgentVersion:    u.cfg.AgentVersion,
		Facts:           edge.GatherFacts(),
		Capabilities:    []string{control.CapSite, control.CapHeartbeat},
		Site:            &control.SiteHello{Name: u.id.snapshot().Name, HubID: u.cfg.HubID, Subtree: subtree, HostCAs: u.cfg.HostCAs},
	}}
}

// handshake sends the hello and waits for the welcome. A fatal notice is
// ErrRefused; a welcome without a site section is a parent that takes no
// sites.
func (s *uplinkSession) handshake() (*control.Welcome, error) {
	if err := s.send(s.hello()); err != nil {
		return nil, err
	}
	_ = s.ctrl.SetReadDeadline(time.Now().Add(welcomeTimeout))
	msg, err := control.Read(s.ctrl)
	if err != nil {
		return nil, fmt.Errorf("waiting for welcome: %w", err)
	}
	switch {
	case msg.Type == control.TypeNotice && msg.Fatal:
		return nil, fmt.Errorf("%w: %s", ErrRefused, msg.Notice)
	case msg.Type == control.TypeNotice:
		return nil, fmt.Errorf("parent hub: %s", msg.Notice)
	case msg.Type != control.TypeWelcome:
		return nil, fmt.Errorf("parent hub sent %s instead of welcome", msg.Type)
	case msg.Welcome.Site == nil:
		return nil, errors.New("the parent hub does not take site hubs (its welcome has no site section); upgrade it")
	}
	_ = s.ctrl.SetReadDeadline(time.Time{})
	return msg.Welcome, nil
}

// serve runs a welcomed session: the parent's streams, heartbeats,
// renewal, the status heartbeat and inventory, and the control reader,
// until one ends. It returns only once everything it started has.
func (s *uplinkSession) serve(ctx context.Context, live control.Liveness, queuedSince time.Time) error {
	u := s.u
	var wg sync.WaitGroup
	defer wg.Wait()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	renewed := make(chan struct{}, 1)
	wg.Go(func() { s.acceptStreams(sctx, &wg); cancel() })
	wg.Go(func() { s.renewLoop(sctx, renewed) })
	wg.Go(func() { s.heartbeat(sctx, live.Every) })
	wg.Go(func() {
		if err := s.report(sctx, queuedSince); err != nil && sctx.Err() == nil {
			s.log.Warn("status report failed; closing the uplink", "err", err)
			s.tun.Close()
		}
	})
	u.hmu.Lock()
	hooks := slices.Clone(u.onConnect)
	u.hmu.Unlock()
	for _, f := range hooks {
		wg.Go(func() { f(sctx) })
	}
	err := s.readControl(sctx, live.Deadline, renewed)
	cancel()
	s.tun.Close()
	return err
}

func (s *uplinkSession) heartbeat(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.send(&control.Message{Type: control.TypeHeartbeat}); err != nil {
				s.tun.Close()
				return
			}
		}
	}
}

// renewLoop asks for a fresh certificate at two thirds of the current
// one's remaining life, as the agent does.
func (s *uplinkSession) renewLoop(ctx context.Context, renewed <-chan struct{}) {
	for {
		wait := max(time.Until(s.u.id.cert().Leaf.NotAfter)*2/3, time.Second)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		signer, ok := s.u.id.cert().PrivateKey.(crypto.Signer)
		if !ok {
			s.log.Error("renewal: the site key cannot sign")
			return
		}
		csr, err := pki.NewCSR(signer, s.u.id.snapshot().Name)
		if err != nil {
			s.log.Error("renewal CSR", "err", err)
			continue
		}
		if err := s.send(&control.Message{Type: control.TypeRenew, CSR: csr}); err != nil {
			return
		}
		t = time.NewTimer(renewAnswer)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-renewed:
			t.Stop()
		case <-t.C:
			s.log.Warn("no answer to certificate renewal; will retry")
		}
	}
}

// readControl handles the parent's control messages until the stream
// fails, the parent falls silent, or a fatal notice arrives (ErrRefused).
func (s *uplinkSession) readControl(ctx context.Context, silent time.Duration, renewed chan<- struct{}) error {
	u := s.u
	beats := false
	for {
		if beats {
			_ = s.ctrl.SetReadDeadline(time.Now().Add(silent))
		}
		msg, err := control.Read(s.ctrl)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("the parent hub closed the control stream")
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("no heartbeat from the parent hub for %s", silent)
			}
			return fmt.Errorf("control stream: %w", err)
		}
		switch msg.Type {
		case control.TypeHeartbeat:
			beats = true
		case control.TypeRenewed:
			leaf, err := u.id.renewed(msg.Cert)
			if err != nil {
				s.log.Error("renewed certificate rejected", "err", err)
				continue
			}
			s.log.Info("site certificate renewed", "valid_until", leaf.NotAfter.UTC().Format(time.RFC3339))
			select {
			case renewed <- struct{}{}:
			default:
			}
		case control.TypeNotice:
			s.log.Warn("parent hub notice", "notice", msg.Notice)
			if msg.Fatal {
				return fmt.Errorf("%w: %s", ErrRefused, msg.Notice)
			}
		case control.TypeAuthorizedKeys, control.TypeSSHTrust:
			// A node's access pushes: a site hub has no SSH server of
			// its own to apply them to.
		default:
			u.hmu.Lock()
			h := u.handlers[msg.Type]
			u.hmu.Unlock()
			if h == nil {
				s.log.Debug("control message from the parent without a handler", "type", msg.Type)
				continue
			}
			h(ctx, msg)
		}
	}
}

// acceptStreams serves the streams the parent opens: route streams go to
// the ServeRoutes callback; anything else is refused.
func (s *uplinkSession) acceptStreams(ctx context.Context, wg *sync.WaitGroup) {
	for {
		st, err := s.tun.AcceptStream(ctx)
		if err != nil {
			return
		}
		wg.Go(func() { s.serveStream(ctx, st) })
	}
}

func (s *uplinkSession) serveStream(ctx context.Context, st tunnel.Stream) {
	_ = st.SetReadDeadline(time.Now().Add(routeTimeout))
	h, err := tunnel.ReadHeader(st)
	if err != nil {
		s.log.Info("bad stream header from the parent", "err", err)
		st.Close()
		return
	}
	if h.Service != tunnel.ServiceRoute {
		_ = tunnel.WriteReply(st, tunnel.Reply{OK: false, Reason: "a site hub serves only route streams from its parent, not " + h.String()})
		st.Close()
		return
	}
	req, err := control.ReadRouteRequest(st)
	if err != nil {
		_ = tunnel.WriteReply(st, tunnel.Reply{OK: false, Reason: "bad route request"})
		st.Close()
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	s.u.hmu.Lock()
	f := s.u.routes
	s.u.hmu.Unlock()
	if f == nil {
		_ = tunnel.WriteReply(st, tunnel.Reply{OK: false, Reason: "site " + s.u.Name() + " does not route streams to its nodes (this hub serves no routes)"})
		st.Close()
		return
	}
	f(ctx, st, req)
}

// report sends the status heartbeat and the inventory for one session: at
// once the latest status (saying since when it was queued) and a full
// inventory, then the status every interval and on change, and inventory
// changes as they happen.
func (s *uplinkSession) report(ctx context.Context, queuedSince time.Time) error {
	u := s.u
	inv, err := s.sendFullInventory(ctx)
	if err != nil {
		return err
	}
	last, err := s.sendStatus(ctx, queuedSince)
	if err != nil {
		return err
	}
	lastAt := time.Now()
	tick := time.NewTicker(max(u.cfg.StatusInterval/4, 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-u.kick:
		}
		if inv, err = s.sendInventoryChanges(ctx, inv); err != nil {
			return err
		}
		st, err := u.buildStatus(ctx, time.Time{})
		if err != nil {
			s.log.Warn("build site status", "err", err)
			continue
		}
		if time.Since(lastAt) < u.cfg.StatusInterval && sameStatus(st, last) {
			continue
		}
		if last, err = s.sendBuilt(st); err != nil {
			return err
		}
		lastAt = time.Now()
	}
}

func (s *uplinkSession) sendStatus(ctx context.Context, queuedSince time.Time) (*control.SiteStatus, error) {
	st, err := s.u.buildStatus(ctx, queuedSince)
	if err != nil {
		return nil, err
	}
	return s.sendBuilt(st)
}

func (s *uplinkSession) sendBuilt(st *control.SiteStatus) (*control.SiteStatus, error) {
	seq, err := s.u.seqs.take()
	if err != nil {
		return nil, err
	}
	st.Seq, st.At = seq, time.Now().UTC()
	if err := s.send(&control.Message{Type: control.TypeSiteStatus, SiteStatus: st}); err != nil {
		return nil, err
	}
	return st, nil
}

// buildStatus is the site's status now, hooks applied (Seq and At unset).
func (u *Uplink) buildStatus(ctx context.Context, queuedSince time.Time) (*control.SiteStatus, error) {
	st, err := u.cfg.Status(ctx)
	if err != nil {
		return nil, err
	}
	u.hmu.Lock()
	hooks := slices.Clone(u.addStatus)
	u.hmu.Unlock()
	for _, f := range hooks {
		f(st)
	}
	st.QueuedSince = queuedSince
	if err := (&control.Message{Type: control.TypeSiteStatus, SiteStatus: st}).Validate(); err != nil {
		return nil, fmt.Errorf("site status: %w", err)
	}
	return st, nil
}

// sameStatus compares two statuses without Seq, At and QueuedSince.
func sameStatus(a, b *control.SiteStatus) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := *a, *b
	x.Seq, x.At, x.QueuedSince = 0, time.Time{}, time.Time{}
	y.Seq, y.At, y.QueuedSince = 0, time.Time{}, time.Time{}
	bx, _ := json.Marshal(x)
	by, _ := json.Marshal(y)
	return string(bx) == string(by)
}

// invKey is what an inventory entry is compared by (LastSeen moves on its
// own and is sent with the next real change).
type invKey struct {
	ID, Transport   string
	Online, Revoked bool
	Labels          string
}

func keyOf(n control.SiteNode) invKey {
	l, _ := json.Marshal(n.Labels)
	return invKey{ID: n.ID, Transport: n.Transport, Online: n.Online, Revoked: n.Revoked, Labels: string(l)}
}

// sendFullInventory sends the whole inventory in pages, Full first and Done
// last, and returns what was sent.
func (s *uplinkSession) sendFullInventory(ctx context.Context) (map[string]invKey, error) {
	nodes, err := s.u.cfg.Inventory(ctx)
	if err != nil {
		return nil, fmt.Errorf("site inventory: %w", err)
	}
	sent := make(map[string]invKey, len(nodes))
	for i := 0; i == 0 || i < len(nodes); i += inventoryPage {
		page := nodes[i:min(i+inventoryPage, len(nodes))]
		m := &control.SiteNodes{Full: i == 0, Done: i+inventoryPage >= len(nodes), Nodes: page}
		if err := s.send(&control.Message{Type: control.TypeSiteNodes, SiteNodes: m}); err != nil {
			return nil, err
		}
	}
	for _, n := range nodes {
		sent[n.Name] = keyOf(n)
	}
	return sent, nil
}

// sendInventoryChanges sends what changed since sent, and returns the new
// state.
func (s *uplinkSession) sendInventoryChanges(ctx context.Context, sent map[string]invKey) (map[string]invKey, error) {
	nodes, err := s.u.cfg.Inventory(ctx)
	if err != nil {
		s.log.Warn("site inventory", "err", err)
		return sent, nil
	}
	now := make(map[string]invKey, len(nodes))
	var up []control.SiteNode
	for _, n := range nodes {
		k := keyOf(n)
		now[n.Name] = k
		if old, ok := sent[n.Name]; !ok || old != k {
			up = append(up, n)
		}
	}
	var removed []string
	for name := range sent {
		if _, ok := now[name]; !ok {
			removed = append(removed, name)
		}
	}
	slices.Sort(removed)
	for len(up) > 0 || len(removed) > 0 {
		m := &control.SiteNodes{}
		n := min(len(up), inventoryPage)
		m.Nodes, up = up[:n], up[n:]
		r := min(len(removed), inventoryPage-n)
		m.Removed, removed = removed[:r], removed[r:]
		if err := s.send(&control.Message{Type: control.TypeSiteNodes, SiteNodes: m}); err != nil {
			return nil, err
		}
	}
	return maps.Clone(now), nil
}
