package site

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// Timeouts of the site's own exchanges; the connection's are the shared
// uplink client's (uplink.DialTimeout and the rest).
const (
	routeTimeout = 15 * time.Second // opening a route stream and its reply
	// inventoryPage bounds the entries of one site_nodes message so it
	// stays well under control.MaxFrame.
	inventoryPage = 1000
)

// resumeSiteBudget bounds the bytes the site keeps unacknowledged for all
// the parent's streams together (each keeps at most resume's Buffer): what
// its nodes' output can have in flight towards a parent it cannot reach,
// before their writes wait.
const resumeSiteBudget = 64 << 20

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
	Status func(ctx context.Context) (*siteproto.Status, error)
	// Inventory lists the site's nodes and its sub-sites' nodes, named
	// relative to this site. Required.
	Inventory func(ctx context.Context) ([]siteproto.Node, error)
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
//
// The parent's route streams outlive the uplink's session when the parent
// keeps them too (its welcome lists control.HubCapResume): the site holds
// them (uplink.Held) with the route on below, and re-attaches them on its
// next session, so a jump or a job through the site survives a flap of its
// uplink shorter than the parent's resume window.
type Uplink struct {
	cfg  UplinkConfig
	log  *slog.Logger
	id   *identity
	seqs *seqs
	held *uplink.Held

	hmu       sync.Mutex // guards the hooks
	handlers  map[control.Type]func(ctx context.Context, m *control.Message)
	onConnect []func(ctx context.Context)
	addStatus []func(*siteproto.Status)
	routes    func(ctx context.Context, st tunnel.Stream, req *siteproto.RouteRequest)

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
		held:     uplink.NewHeld(resumeSiteBudget),
		handlers: map[control.Type]func(context.Context, *control.Message){}, started: time.Now(),
		kick: make(chan struct{}, 1)}, nil
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
func (u *Uplink) AddStatus(f func(*siteproto.Status)) {
	u.hmu.Lock()
	defer u.hmu.Unlock()
	u.addStatus = append(u.addStatus, f)
}

// ServeRoutes registers f for the tunnel.ServiceRoute streams the parent
// opens: f owns st, answers with a tunnel.Reply and carries the bytes on
// resume.Answered(st) (a stream that outlives the uplink's session is a
// resume.Pending until answered). Without f such streams are refused with
// a reply saying so.
func (u *Uplink) ServeRoutes(f func(ctx context.Context, st tunnel.Stream, req *siteproto.RouteRequest)) {
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
func (u *Uplink) OpenRoute(ctx context.Context, req *siteproto.RouteRequest) (tunnel.Stream, error) {
	u.mu.Lock()
	s, caps := u.sess, u.parentCaps
	u.mu.Unlock()
	if s == nil {
		return nil, ErrUplinkDown
	}
	if !slices.Contains(caps, siteproto.HubCapSiteStreams) {
		return nil, fmt.Errorf(
			"%w: the parent hub takes no streams from its sites (its welcome does not list %q)",
			ErrNoStreams, siteproto.HubCapSiteStreams)
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
	if err := siteproto.WriteRouteRequest(st, req); err != nil {
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
	defer u.held.Run(ctx, "site "+u.Name()+" is stopping")()
	r := uplink.Retry{
		BackoffMin: u.cfg.BackoffMin, BackoffMax: u.cfg.BackoffMax,
		Stop: func(err error) error {
			if errors.Is(err, ErrRefused) || errors.Is(err, ErrCycle) {
				u.mu.Lock()
				u.fatal = err
				u.mu.Unlock()
				u.log.Error("uplink stopped; this hub keeps serving its own nodes and sites", "err", err)
				return err
			}
			return nil
		},
		Waiting: func(err error, wait time.Duration) {
			u.mu.Lock()
			u.lastErr = err
			u.mu.Unlock()
			u.log.Warn("uplink to the parent hub down; retrying", "err", err, "in", wait.Round(time.Millisecond))
		},
	}
	return r.Run(ctx, u.runOnce)
}
