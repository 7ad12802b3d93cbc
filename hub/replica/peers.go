// Package replica lets several hub processes ("replicas") share one store
// and act as one hub: they present one identity (identity.go), record which
// replica holds each node's tunnel (presence, leased), forward a stream
// for a node held elsewhere over an mTLS peer link to the holder (a
// peerRoute, one of hub/access's routes), pass changes to each other and
// elect the leader that runs the fleet's singletons (replication.go).
//
// A peer link is a tunnel session (TLS+yamux, package tunnel) between two
// replicas, authenticated on both ends by replica certificates from the
// shared CA (pki.KindReplica): no node or operator certificate is
// accepted, and a replica accepts only the peer it meant to dial. Links
// are dialed on first use, kept alive by the tunnel's keepalives, and
// redialed after they end; a holder they cannot reach fails its streams at
// once (access.ReplicaGoneError).
package replica

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// DefaultLeaseTTL is how long a replica's leases (its own and its nodes'
// presence) last without a heartbeat. A replica heartbeats every third of
// it, so a replica that dies stops counting as a node's holder at most
// DefaultLeaseTTL after its last heartbeat.
const DefaultLeaseTTL = 15 * time.Second

// requestTimeout bounds reading a peer request and waiting for the
// holder's answer.
const requestTimeout = 15 * time.Second

// Peer links run between the replicas' own machines, not over edge links,
// so they are dialed over TLS+TCP and keep themselves alive tightly: a
// replica whose process dies has its links reset by its machine, and the
// replica forwarding a stream to it knows at once; one whose machine falls
// silent is found dead within peerDeadAfter, or peerHandshake for a new
// link. A dial that failed is not tried again for peerRedialAfter: the
// streams of a job fanned out to the nodes of a dead replica fail together
// instead of dialing it one after another.
const (
	peerKeepAlive   = time.Second
	peerDeadAfter   = 4 * time.Second
	peerHandshake   = 5 * time.Second
	peerRedialAfter = time.Second
)

// HoldFunc opens a stream to service h on a node whose tunnel is on this
// replica. It refuses a node held elsewhere or nowhere: the holder
// forwards nothing further.
type HoldFunc func(ctx context.Context, nodeID string, h tunnel.Header) (tunnel.Stream, error)

// Config configures Peers.
type Config struct {
	// ID names this replica (a DNS label); it must stay the same across
	// restarts of one replica and differ between replicas.
	ID string
	// Store is the shared store.
	Store store.ReplicaStore
	// CA is the shared hub CA: it issues this replica's peer certificate
	// and is the only root a peer's certificate may chain to.
	CA *ca.CA
	// Listen is the peer listener's address (UDP and TCP), e.g. ":7444".
	Listen string
	// Advertise is the address other replicas dial; "" means Listen's
	// address, with this machine's host name for a wildcard host.
	Advertise string
	// Hold serves streams other replicas forward to this one. Required.
	Hold HoldFunc
	// Tunnel tunes peer links; nil means tunnel defaults.
	Tunnel *tunnel.Config
	// LeaseTTL defaults to DefaultLeaseTTL.
	LeaseTTL time.Duration
	// Poke asks the QUIC agents of a replica found dead to reconnect now
	// (the hub's tunnel.Listener.Poke); nil pokes none, and they notice
	// at their dead-peer timeout.
	Poke func(targets []tunnel.PokeTarget) int
	// Registerer receives the tether_peer_* metrics; nil registers none.
	Registerer prometheus.Registerer
	Logger     *slog.Logger
}

// CheckAndSetDefaults validates c and fills defaults.
func (c *Config) CheckAndSetDefaults() error {
	if err := pki.ValidateName(c.ID); err != nil {
		return fmt.Errorf("replica: --replica-id: %w", err)
	}
	if c.Store == nil || c.CA == nil || c.Hold == nil {
		return errors.New("replica: Store, CA and Hold are required")
	}
	if _, _, err := net.SplitHostPort(c.Listen); err != nil {
		return fmt.Errorf("replica: --peer-listen %q: %w (want HOST:PORT)", c.Listen, err)
	}
	if c.Advertise != "" {
		if _, _, err := net.SplitHostPort(c.Advertise); err != nil {
			return fmt.Errorf("replica: --peer-advertise %q: %w (want HOST:PORT)", c.Advertise, err)
		}
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = DefaultLeaseTTL
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Peers is this replica's side of the replica set: its lease, its nodes'
// presence, its peer listener and its links to other replicas.
type Peers struct {
	cfg   Config
	log   *slog.Logger
	cert  tls.Certificate
	roots *x509.CertPool
	m     *peerMetrics
	ln    *tunnel.Listener
	addr  string // advertised peer address

	ctx    context.Context // ends with Close; owns every goroutine below
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu      sync.Mutex // guards the following
	links   map[string]*link
	self    store.Replica
	started bool

	hubs atomic.Pointer[[]string] // Hubs, read from the store at every heartbeat
}

// link is the outgoing peer link to one replica.
type link struct {
	mu   sync.Mutex // held while dialing, so one dial per peer at a time
	sess tunnel.Session
	// poked: the peer's agents were poked for its current loss (guarded
	// by Peers.mu; cleared when a link is up again).
	poked bool
	// Guarded by Peers.mu: when the peer was found gone (its link ended
	// or a dial failed; zero while it answers), and the last dial's
	// failure.
	lost       time.Time
	failedAt   time.Time
	failedWith error
	failedAddr string    // the address of the failed dial
	failedRun  time.Time // and the start of the replica's run it was for
	told       bool      // the loss was logged
}

// New issues this replica's peer certificate and binds the peer listener.
// Nothing is served until Start.
func New(ctx context.Context, cfg Config) (*Peers, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	cert, err := cfg.CA.IssueReplica(cfg.ID, 90*24*time.Hour)
	if err != nil {
		return nil, fmt.Errorf("replica: peer certificate: %w", err)
	}
	p := &Peers{cfg: cfg, log: cfg.Logger, cert: cert, roots: cfg.CA.Pool(), links: map[string]*link{}}
	p.m = newPeerMetrics(cfg.Registerer)
	server := &tls.Config{
		Certificates:     []tls.Certificate{cert},
		ClientAuth:       tls.RequireAndVerifyClientCert,
		ClientCAs:        p.roots,
		VerifyConnection: func(cs tls.ConnectionState) error { _, err := checkPeer(cs, ""); return err },
	}
	p.ln, err = tunnel.Listen(ctx, cfg.Listen, tunnel.ListenConfig{
		TunnelTLS: server,
		Config:    cfg.Tunnel,
		Logger:    p.log.With("component", "peer-listener"),
	})
	if err != nil {
		p.m.unregister()
		return nil, fmt.Errorf("replica: --peer-listen %s: %w", cfg.Listen, err)
	}
	p.addr = advertiseAddr(p.ln.Addr(), cfg.Advertise)
	p.ctx, p.cancel = context.WithCancel(context.Background())
	return p, nil
}

func advertiseAddr(bound net.Addr, configured string) string {
	if configured != "" {
		return configured
	}
	host, port, _ := net.SplitHostPort(bound.String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		if h, err := os.Hostname(); err == nil {
			host = h
		}
	}
	return net.JoinHostPort(host, port)
}

// ID is this replica's ID.
func (p *Peers) ID() string { return p.cfg.ID }

// Addr is the peer listener's bound address.
func (p *Peers) Addr() net.Addr { return p.ln.Addr() }

// Start releases whatever an earlier run of this replica still claims (it
// holds no tunnel yet), records this replica with a fresh lease, and starts
// serving peers and heartbeating. self carries the addresses and version
// `tether replicas` shows. Close stops it all.
func (p *Peers) Start(ctx context.Context, self store.Replica) error {
	self.ID, self.PeerAddr = p.cfg.ID, p.addr
	if self.Started.IsZero() {
		self.Started = time.Now()
	}
	if err := p.cfg.Store.DeleteReplica(ctx, p.cfg.ID); err != nil {
		return fmt.Errorf("replica: release the previous run's presence: %w", err)
	}
	p.mu.Lock()
	p.self, p.started = self, true
	p.mu.Unlock()
	p.hubs.Store(&self.Hubs)
	if err := p.heartbeat(ctx); err != nil {
		return err
	}
	p.wg.Add(3)
	go func() { defer p.wg.Done(); p.heartbeats() }()
	go func() { defer p.wg.Done(); p.accept() }()
	go func() { defer p.wg.Done(); p.watch() }()
	p.log.Info("replica serving peers", "replica", p.cfg.ID, "peer_listen", p.ln.Addr().String(), "peer_advertise", p.addr)
	return nil
}

// Close stops serving peers, closes every link, and forgets this replica
// in the store, so its nodes' presence ends now rather than at the lease.
func (p *Peers) Close() {
	p.cancel()
	p.ln.Close()
	p.mu.Lock()
	for _, l := range p.links {
		if l.sess != nil {
			l.sess.Close()
		}
	}
	started := p.started
	p.mu.Unlock()
	p.wg.Wait()
	p.m.unregister()
	if started {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := p.cfg.Store.DeleteReplica(ctx, p.cfg.ID); err != nil {
			p.log.Warn("replica: forget this replica at shutdown (its leases expire instead)", "err", err)
		}
	}
}

func (p *Peers) heartbeats() {
	t := time.NewTicker(p.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
			if err := p.heartbeat(p.ctx); err != nil && p.ctx.Err() == nil {
				p.log.Warn("replica heartbeat failed; other replicas stop routing to this one when its lease ends",
					"err", err, "lease_ttl", p.cfg.LeaseTTL)
			}
		}
	}
}

func (p *Peers) heartbeat(ctx context.Context) error {
	p.mu.Lock()
	self := p.self
	self.Links = p.linkIDsLocked()
	p.mu.Unlock()
	self.LeaseUntil = time.Now().Add(p.cfg.LeaseTTL)
	ctx, cancel := context.WithTimeout(ctx, p.cfg.LeaseTTL/3)
	defer cancel()
	if err := p.cfg.Store.HeartbeatReplica(ctx, self); err != nil {
		return err
	}
	if _, err := p.LiveHubs(ctx); err != nil { // the welcome names the last list read meanwhile
		p.log.Debug("replica: the live replicas' agent addresses were not read", "err", err)
	}
	return nil
}

// Hubs are the addresses agents dial for the live replicas (what the
// welcome names): this replica's own first, then the others', each once,
// at most control.MaxWelcomeHubs; as read from the store at the last
// heartbeat.
func (p *Peers) Hubs() []string {
	if h := p.hubs.Load(); h != nil {
		return *h
	}
	return nil
}

// LiveHubs is Hubs read from the store now (join strings name them: a
// replica that started a moment ago is one).
func (p *Peers) LiveHubs(ctx context.Context) ([]string, error) {
	reps, err := p.cfg.Store.ListReplicas(ctx)
	if err != nil {
		return p.Hubs(), fmt.Errorf("replica: list the replicas for their agent addresses: %w", err)
	}
	p.mu.Lock()
	self := p.self
	p.mu.Unlock()
	hubs := liveHubs(self, reps, time.Now())
	p.hubs.Store(&hubs)
	return hubs, nil
}

// liveHubs is Hubs as of now: self's addresses, then those of the other
// replicas in reps whose lease runs, in the order of their IDs.
func liveHubs(self store.Replica, reps []store.Replica, now time.Time) []string {
	out := slices.Clone(self.Hubs)
	for _, r := range reps {
		if r.ID == self.ID || !r.LeaseUntil.After(now) {
			continue
		}
		for _, h := range r.Hubs {
			if !slices.Contains(out, h) {
				out = append(out, h)
			}
		}
	}
	if len(out) > control.MaxWelcomeHubs {
		out = out[:control.MaxWelcomeHubs]
	}
	return out
}

func (p *Peers) linkIDsLocked() []string {
	var ids []string
	for id, l := range p.links {
		if l.sess != nil {
			select {
			case <-l.sess.Done():
				continue
			default:
			}
			ids = append(ids, id)
		}
	}
	slices.Sort(ids)
	return ids
}

// Connected records that this replica holds node nodeID's tunnel now, with
// what other replicas need to know of the session. The returned claim goes
// back to Disconnected when the tunnel ends. A store failure is logged: the
// node is then reachable through this replica only.
func (p *Peers) Connected(ctx context.Context, nodeID string, session []byte) store.Presence {
	pr, err := p.cfg.Store.ClaimPresence(ctx, store.Presence{
		NodeID:     nodeID,
		ReplicaID:  p.cfg.ID,
		LeaseUntil: time.Now().Add(p.cfg.LeaseTTL),
		Session:    session,
	})
	if err != nil {
		p.log.Warn("replica: record presence; other replicas cannot reach this node until it reconnects", "node_id", nodeID,
			"err", err)
		return store.Presence{}
	}
	return pr
}

// Disconnected ends claim pr, unless a newer claim replaced it (the node
// reconnected, here or on another replica).
func (p *Peers) Disconnected(pr store.Presence) {
	if pr.Epoch == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := p.cfg.Store.ReleasePresence(ctx, pr)
	switch {
	case errors.Is(err, store.ErrStale):
		p.log.Debug("replica: presence already taken over", "node_id", pr.NodeID, "epoch", pr.Epoch)
	case err != nil:
		p.log.Warn("replica: release presence; it expires with its lease", "node_id", pr.NodeID, "err", err)
	}
}

// Held returns the live claim of another replica on node nodeID (ok false
// if none: the node is here, or nowhere).
func (p *Peers) Held(ctx context.Context, nodeID string) (store.Presence, bool) {
	pr, err := p.cfg.Store.GetPresence(ctx, nodeID)
	if err != nil || !pr.Live(time.Now()) || pr.ReplicaID == p.cfg.ID {
		return store.Presence{}, false
	}
	return pr, true
}

// Route implements access.Remote: the route to a node through the live
// replica that holds its tunnel, if that is another replica.
func (p *Peers) Route(ctx context.Context, n store.Node) (access.Route, bool, error) {
	nodeID := n.ID
	pr, err := p.cfg.Store.GetPresence(ctx, nodeID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, false, nil
	}
	if err != nil {
		return nil, false, err
	}
	now := time.Now()
	if !pr.Live(now) || pr.ReplicaID == p.cfg.ID {
		return nil, false, nil
	}
	reps, err := p.cfg.Store.ListReplicas(ctx)
	if err != nil {
		return nil, false, err
	}
	for _, r := range reps {
		if r.ID == pr.ReplicaID && r.LeaseUntil.After(now) && r.PeerAddr != "" {
			return peerRoute{p: p, replica: r.ID, addr: r.PeerAddr, started: r.Started, nodeID: nodeID,
				node: n.Name}, true, nil
		}
	}
	return nil, false, nil
}

// Links are the replicas this one has a live outgoing link to.
func (p *Peers) Links() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.linkIDsLocked()
}

// checkPeer accepts only a hub replica's certificate (and, when want is
// set, only that replica's).
func checkPeer(cs tls.ConnectionState, want string) (string, error) {
	if len(cs.PeerCertificates) == 0 {
		return "", errors.New("replica: peer sent no certificate")
	}
	leaf := cs.PeerCertificates[0]
	id, err := pki.IdentityOf(leaf)
	if err != nil || id.Kind != pki.KindReplica {
		return "", fmt.Errorf("replica: certificate %q is not a hub replica's", leaf.Subject.CommonName)
	}
	if want != "" && id.ID != want {
		return "", fmt.Errorf("replica: peer is replica %q, want %q (is the store's peer address stale?)", id.ID, want)
	}
	return id.ID, nil
}

// dial returns the live link to replica id, started at started and
// listening at addr (its store record), dialing it if there is none; unless
// a dial to that same run of the replica failed less than peerRedialAfter
// ago: then its error. A replica that restarted since (even on the same
// address) is dialed anew.
func (p *Peers) dial(ctx context.Context, id, addr string, started time.Time) (tunnel.Session, error) {
	p.mu.Lock()
	l := p.links[id]
	if l == nil {
		l = &link{}
		p.links[id] = l
	}
	p.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.sess != nil {
		select {
		case <-l.sess.Done():
		default:
			return l.sess, nil
		}
	}
	if p.ctx.Err() != nil {
		return nil, errors.New("replica: shutting down")
	}
	p.mu.Lock()
	failedAt, failedWith, failedAddr, failedRun := l.failedAt, l.failedWith, l.failedAddr, l.failedRun
	p.mu.Unlock()
	if time.Since(failedAt) < peerRedialAfter && failedAddr == addr && failedRun.Equal(started) {
		return nil, failedWith
	}
	d := tunnel.Dialer{
		Transport: tunnel.TransportTCP,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{p.cert},
			RootCAs:      p.roots,
			ServerName:   ca.ReplicaServerName,
			VerifyConnection: func(cs tls.ConnectionState) error {
				_, err := checkPeer(cs, id)
				return err
			},
		},
		Config: peerTunnel(p.cfg.Tunnel),
		Logger: p.log,
	}
	sess, err := d.Dial(ctx, addr)
	if err != nil {
		p.m.dialErrors.Inc()
		err = fmt.Errorf("replica: link to replica %s at %s: %w", id, addr, err)
		if ctx.Err() != nil { // the caller gave up: says nothing of the peer
			return nil, err
		}
		p.mu.Lock()
		l.failedAt, l.failedWith, l.failedAddr, l.failedRun = time.Now(), err, addr, started
		if l.lost.IsZero() {
			l.lost = l.failedAt
		}
		p.mu.Unlock()
		return nil, err
	}
	p.mu.Lock()
	l.sess, l.lost, l.failedAt, l.failedWith, l.told = sess, time.Time{}, time.Time{}, nil, false
	l.poked = false
	p.mu.Unlock()
	p.m.links.WithLabelValues("out").Inc()
	p.log.Info("peer link up", "peer", id, "addr", addr, "transport", sess.Transport().String())
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		select {
		case <-sess.Done():
			p.mu.Lock()
			if l.sess == sess && l.lost.IsZero() {
				l.lost = time.Now()
			}
			p.mu.Unlock()
			p.linkLost(id)
		case <-p.ctx.Done():
			sess.Close()
		}
		p.m.links.WithLabelValues("out").Dec()
		p.log.Info("peer link down", "peer", id)
	}()
	return sess, nil
}

// lostSince is when replica id was found gone: its link ended or a dial to
// it failed, or now if neither was recorded yet. first is true once per
// loss, for the log.
func (p *Peers) lostSince(id string) (since time.Time, first bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.links[id]
	if l == nil {
		return time.Now(), true
	}
	if l.lost.IsZero() {
		l.lost = time.Now()
	}
	first, l.told = !l.told, true
	return l.lost, first
}

// peerTunnel is the hub's tunnel settings with the peer links' liveness.
// Only the dialing side's matter: the listener keeps the hub's, so a link
// from a replica of an earlier version, which pings less often, stays up.
func peerTunnel(c *tunnel.Config) *tunnel.Config {
	var pc tunnel.Config
	if c != nil {
		pc = *c
	}
	pc.KeepAliveInterval, pc.IdleTimeout, pc.HandshakeTimeout = peerKeepAlive, peerDeadAfter, peerHandshake
	return &pc
}

func (p *Peers) accept() {
	for {
		sess, err := p.ln.Accept(p.ctx)
		if err != nil {
			return
		}
		peer, err := checkPeer(sess.ConnectionState(), "")
		if err != nil { // the handshake checked it already; never serve one that slipped by
			sess.Close()
			continue
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.serveLink(sess, peer) }()
	}
}

// serveLink serves the streams a peer opens until the link ends.
func (p *Peers) serveLink(sess tunnel.Session, peer string) {
	p.m.links.WithLabelValues("in").Inc()
	defer p.m.links.WithLabelValues("in").Dec()
	defer sess.Close()
	log := p.log.With("peer", peer, "remote", sess.RemoteAddr().String())
	log.Debug("peer link accepted")
	for {
		st, err := sess.AcceptStream(p.ctx)
		if err != nil {
			return
		}
		p.wg.Add(1)
		go func() { defer p.wg.Done(); p.serveStream(st, log) }()
	}
}

// serveStream answers one forwarded stream. A malformed request closes the
// stream and nothing else.
func (p *Peers) serveStream(st tunnel.Stream, log *slog.Logger) {
	_ = st.SetDeadline(time.Now().Add(requestTimeout))
	req, err := ReadRequest(st)
	if err != nil {
		p.m.streams.WithLabelValues("in", "malformed").Inc()
		log.Warn("peer stream refused: malformed request", "err", err)
		st.Close()
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, requestTimeout)
	ns, err := p.cfg.Hold(ctx, req.NodeID, req.Header)
	cancel()
	if err != nil {
		p.m.streams.WithLabelValues("in", "refused").Inc()
		_ = tunnel.WriteReply(st, tunnel.Reply{Reason: reason(err)})
		st.Close()
		return
	}
	if err := tunnel.WriteReply(st, tunnel.Reply{OK: true}); err != nil {
		p.m.streams.WithLabelValues("in", "error").Inc()
		st.Close()
		ns.Close()
		return
	}
	_ = st.SetDeadline(time.Time{})
	p.m.streams.WithLabelValues("in", "ok").Inc()
	tunnel.Pipe(st, ns, func(fromPeer bool, n int) {
		if fromPeer {
			p.m.bytes.WithLabelValues("from_peer").Add(float64(n))
		} else {
			p.m.bytes.WithLabelValues("to_peer").Add(float64(n))
		}
	})
}

// reason makes err fit a tunnel.Reply's reason: printable UTF-8, bounded.
func reason(err error) string {
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) || r == utf8.RuneError {
			return ' '
		}
		return r
	}, err.Error())
	for len(s) > tunnel.MaxReasonLen {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}
