package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"slices"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/quic-go/quic-go"
)

const (
	// DefaultMaxHandshakes is ListenConfig.MaxHandshakes's default: enough
	// to keep every core of a hub busy with handshakes over links with a
	// long round trip, few enough that a reconnect storm of 100k agents
	// does not start handshakes the hub cannot finish in time.
	DefaultMaxHandshakes = 256
	// acceptQueue is how many handshaken sessions may wait for Accept; the
	// accept loops then never hold up quic-go's own short queue (32), whose
	// overflow refuses a connection after its whole handshake was paid for.
	acceptQueue = 256
	// quicAcceptors is how many goroutines take handshaken QUIC connections
	// from quic-go. With one, a hub saturated by a storm left it waiting for
	// a core long enough for quic-go's queue to fill: the overflow throws
	// away a whole handshake and sends its agent away without a retry hint
	// (seen in a 10,000-agent storm: an agent's session refused while it
	// waited for its welcome). With several, one is nearly always parked on
	// the queue and takes the next connection at once.
	quicAcceptors = 4
	// udpBindAttempts is how often Listen picks a new port when the TCP port
	// it got for ":0" is taken on UDP.
	udpBindAttempts = 8
)

// httpProtos are the ALPN protocols of the HTTP API on the shared port.
var httpProtos = []string{"h2", "http/1.1"}

// ListenConfig configures Listen.
type ListenConfig struct {
	// TunnelTLS is used for tunnel sessions: all of QUIC, and TCP
	// connections that offer ALPN "tether/1". ClientAuth must be
	// RequireAndVerifyClientCert (or RequireAnyClientCert with a
	// VerifyPeerCertificate callback): a session's identity is its peer
	// certificate. It is cloned; NextProtos is set to ALPN and MinVersion to
	// TLS 1.3. Required.
	TunnelTLS *tls.Config

	// HTTPTLS is used for TCP connections that do not offer "tether/1" (the
	// HTTP API and the join endpoint); they are delivered by HTTPListener.
	// Typically ClientAuth is VerifyClientCertIfGiven. It is cloned;
	// MinVersion is set to TLS 1.3, and NextProtos to "h2", "http/1.1" if
	// empty (a non-empty list is kept, e.g. to offer HTTP/1.1 only). Nil
	// refuses such connections.
	HTTPTLS *tls.Config

	// Config tunes the sessions; nil means DefaultConfig.
	Config *Config

	// Logger receives the listener's logs; failed handshakes and other
	// per-connection noise go to Debug. Nil discards.
	Logger *slog.Logger

	// StatelessResetKey, if set, lets a restarted hub answer packets of QUIC
	// connections it no longer knows with a stateless reset, so agents
	// notice a hub restart at their next packet instead of after their idle
	// timeout. It must stay the same across restarts (keep it in the data
	// dir) and secret.
	StatelessResetKey *[32]byte

	// MaxHandshakes bounds the connections (both transports, tunnel and
	// HTTP) that are handshaking or waiting for Accept. Beyond it a new
	// connection is refused at once, before any cryptography: a TCP
	// connection is closed, a QUIC one gets CONNECTION_REFUSED in answer to
	// its first packet. So a storm costs the hub only the handshakes it can
	// finish, and agents retry after their backoff (with jitter) instead of
	// timing out on a hub too busy to answer. Zero means
	// DefaultMaxHandshakes.
	MaxHandshakes int

	// PeersFile, if set, is where the listener writes down the address and
	// poke token of each QUIC session's agent (rewritten within 0.2 s
	// of a change): a listener that starts and finds the file of a run
	// that ended less than an idle timeout ago pokes those agents, so that
	// they reconnect at once instead of at their next keepalive (25 s at
	// the defaults), when it is first asked to Accept. Keep it in the data
	// dir: one per hub process.
	PeersFile string

	// Backlog, if set, bounds how many agents may be waiting to connect
	// (the hub: its enrolled nodes less those connected; negative:
	// unknown). Agents refused at MaxHandshakes are asked back in a queue
	// (see AdmissionStats); a QUIC refusal is counted per Initial packet,
	// and a busy agent's retransmissions count again, so the queue can run
	// ahead of the agents really waiting: it never counts more than
	// Backlog. It is called on every refusal, from quic-go's packet
	// handling too: it must return at once.
	Backlog func() int
}

// Listener accepts tunnel sessions on one address: QUIC on UDP and TLS on
// TCP, on the same port. TCP connections negotiating HTTP go to
// HTTPListener. Close stops everything the Listener started, including the
// sessions it accepted.
type Listener struct {
	cfg      *Config
	log      *slog.Logger
	tcp      net.Listener
	udp      net.PacketConn
	qtr      *quic.Transport
	ql       *quic.Listener
	tcpTLS   *tls.Config // chooses tunnel or HTTP config per ClientHello
	sessions chan Session
	http     *httpListener

	ctx       context.Context // canceled by Close; aborts handshakes
	cancel    context.CancelFunc
	done      chan struct{} // closed by Close
	closeOnce sync.Once
	wg        sync.WaitGroup // accept loops and handshake goroutines
	handshake chan struct{}  // semaphore of ListenConfig.MaxHandshakes
	tickets   *ticketKeys    // nil without a StatelessResetKey
	refuse    *refuser       // answers refused TCP connections with a retry hint
	failed    *handshakeFailures
	peers     *quicPeers    // the QUIC sessions' agents, and those to poke
	accepting chan struct{} // closed by the first Accept: pokes may go
	firstOnce sync.Once

	mu   sync.Mutex                  // guards the following
	live map[trackedSession]struct{} // sessions not yet ended, closed by Close
}

// trackedSession is a session whose end can be observed without a goroutine.
type trackedSession interface {
	Session
	context() context.Context
}

// Listen binds addr on TCP, then the same port on UDP, and starts accepting.
// With port 0 the TCP port is chosen by the system and UDP binds to it (a
// new port is tried if that one is taken on UDP). ctx bounds only the
// binding; the Listener lives until Close.
func Listen(ctx context.Context, addr string, lc ListenConfig) (*Listener, error) {
	cfg, err := lc.Config.resolve()
	if err != nil {
		return nil, err
	}
	if lc.TunnelTLS == nil {
		return nil, errors.New("tunnel: listen: ListenConfig.TunnelTLS is required")
	}
	if ca := lc.TunnelTLS.ClientAuth; ca != tls.RequireAndVerifyClientCert && ca != tls.RequireAnyClientCert {
		return nil, fmt.Errorf(
			"tunnel: listen: TunnelTLS.ClientAuth is %v: tunnel sessions need a client certificate (RequireAndVerifyClientCert)",
			ca)
	}
	tunnelTLS := lc.TunnelTLS.Clone()
	tunnelTLS.MinVersion = tls.VersionTLS13
	tunnelTLS.NextProtos = []string{ALPN}

	var httpTLS *tls.Config
	if lc.HTTPTLS != nil {
		httpTLS = lc.HTTPTLS.Clone()
		httpTLS.MinVersion = tls.VersionTLS13
		if len(httpTLS.NextProtos) == 0 {
			httpTLS.NextProtos = slices.Clone(httpProtos)
		}
		if slices.Contains(httpTLS.NextProtos, ALPN) {
			return nil, fmt.Errorf("tunnel: listen: HTTPTLS.NextProtos must not contain %q", ALPN)
		}
	}

	maxHS := lc.MaxHandshakes
	if maxHS <= 0 {
		maxHS = DefaultMaxHandshakes
	}
	handshake := make(chan struct{}, maxHS)
	var tickets *ticketKeys
	if lc.StatelessResetKey != nil {
		// Session tickets that outlive a restart: after a hub restart the
		// whole fleet reconnects at once, and a resumed handshake skips the
		// signatures and certificate checks of a full one.
		tickets = newTicketKeys(*lc.StatelessResetKey, tunnelTLS)
	}

	tcpLn, udpConn, err := bindPair(ctx, addr)
	if err != nil {
		return nil, err
	}
	// One pacer hands out return slots to refused agents of both
	// transports; its WaitGroup is the Listener's, set below before any
	// TCP refusal can happen (QUIC hints start no goroutine).
	refuse := newRefuser(nil, maxHS)
	refuse.backlog = lc.Backlog
	qtr := &quic.Transport{Conn: udpConn}
	failed := &handshakeFailures{}
	qtr.ConnContext = quicAdmission(handshake, refuse.refusedRecently, func(addr net.Addr) { refuse.hintQUIC(qtr, addr) },
		failed)
	if lc.StatelessResetKey != nil {
		key := quic.StatelessResetKey(*lc.StatelessResetKey)
		qtr.StatelessResetKey = &key
	}
	// The hub pings nobody: agents ping it (keepAliveAfter) and its idle
	// timeout finds one that fell silent. Its keepalive timer per session
	// would only fire when the agent is already gone.
	qc := cfg.quicConfig()
	qc.KeepAlivePeriod = 0
	ql, err := qtr.Listen(tunnelTLS, qc)
	if err != nil {
		tickets.stop()
		_ = tcpLn.Close()
		_ = qtr.Close()
		_ = udpConn.Close()
		return nil, fmt.Errorf("tunnel: listen quic: %w", err)
	}

	lctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	l := &Listener{
		cfg:       cfg,
		log:       orDiscard(lc.Logger),
		tcp:       tcpLn,
		udp:       udpConn,
		qtr:       qtr,
		ql:        ql,
		sessions:  make(chan Session, acceptQueue),
		ctx:       lctx,
		cancel:    cancel,
		done:      make(chan struct{}),
		handshake: handshake,
		failed:    failed,
		tickets:   tickets,
		live:      make(map[trackedSession]struct{}),
		accepting: make(chan struct{}),
	}
	l.http = &httpListener{l: l, conns: make(chan net.Conn), done: make(chan struct{})}
	refuse.wg = &l.wg
	l.refuse = refuse
	l.tcpTLS = &tls.Config{
		MinVersion: tls.VersionTLS13,
		GetConfigForClient: func(hello *tls.ClientHelloInfo) (*tls.Config, error) {
			if slices.Contains(hello.SupportedProtos, ALPN) {
				return tunnelTLS, nil
			}
			if httpTLS == nil {
				return nil, errors.New("tunnel: HTTP is not served on this listener")
			}
			return httpTLS, nil
		},
	}
	l.peers = openQUICPeers(lc.PeersFile, cfg.IdleTimeout+peersTouchEvery, l.log)
	if lc.PeersFile != "" {
		l.wg.Go(func() { l.peers.keep(l.done) })
	}
	l.wg.Go(func() {
		l.peers.pokes(func(b []byte, to net.Addr) error {
			_, err := qtr.WriteTo(b, to)
			return err
		}, l.accepting, l.done)
	})
	l.wg.Go(l.acceptTCP)
	for range quicAcceptors {
		l.wg.Go(l.acceptQUIC)
	}
	l.log.Info("tunnel listener started", "addr", tcpLn.Addr().String())
	return l, nil
}

// bindPair listens on addr over TCP and binds the same IP and port over UDP.
func bindPair(ctx context.Context, addr string) (net.Listener, net.PacketConn, error) {
	// The net errors below already name the operation and the address
	// ("listen tcp 127.0.0.1:7443: bind: address already in use"); saying
	// them again only doubles the message.
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, nil, fmt.Errorf("tunnel: %w", err)
	}
	var lc net.ListenConfig
	attempts := 1
	if port == "0" || port == "" {
		attempts = udpBindAttempts
	}
	for i := 0; ; i++ {
		tcpLn, err := lc.Listen(ctx, "tcp", addr)
		if err != nil {
			return nil, nil, fmt.Errorf("tunnel: %w", err)
		}
		tcpAddr := tcpLn.Addr().(*net.TCPAddr)
		udpHost := host
		if tcpAddr.IP != nil {
			udpHost = tcpAddr.IP.String()
		}
		udpAddr := net.JoinHostPort(udpHost, strconv.Itoa(tcpAddr.Port))
		udpConn, err := lc.ListenPacket(ctx, "udp", udpAddr)
		if err == nil {
			return tcpLn, udpConn, nil
		}
		_ = tcpLn.Close()
		if i+1 >= attempts || !errors.Is(err, syscall.EADDRINUSE) {
			return nil, nil, fmt.Errorf("tunnel: %w", err)
		}
	}
}

// Poke asks the agents of targets, QUIC sessions another hub held, to
// reconnect now: each gets a poke a second for three seconds from this
// listener's UDP socket, unless it is connected here already. A hub
// replica pokes the agents of a replica it found dead (their sessions die
// with it, but a QUIC agent would notice only at its dead-peer timeout).
// It reports how many targets it took; pokes go once the hub accepts.
func (l *Listener) Poke(targets []PokeTarget) int {
	return l.peers.enqueue(targets)
}

// Accept returns the next tunnel session from either transport, its TLS
// handshake complete and its client certificate verified. After Close it
// returns an error wrapping net.ErrClosed.
func (l *Listener) Accept(ctx context.Context) (Session, error) {
	// Closed wins over a session still queued (Close ends those).
	select {
	case <-l.done:
		return nil, fmt.Errorf("tunnel: accept: %w", net.ErrClosed)
	default:
	}
	// The hub serves its agents now: the previous run's may be poked.
	l.firstOnce.Do(func() { close(l.accepting) })
	select {
	case s := <-l.sessions:
		return s, nil
	case <-l.done:
		return nil, fmt.Errorf("tunnel: accept: %w", net.ErrClosed)
	case <-ctx.Done():
		return nil, fmt.Errorf("tunnel: accept: %w", ctx.Err())
	}
}

// Addr is the TCP address; the UDP socket has the same IP and port.
func (l *Listener) Addr() net.Addr { return l.tcp.Addr() }

// HTTPListener yields the TCP connections that negotiated HTTP (ALPN "h2",
// "http/1.1", or none) as already-handshaken *tls.Conn, for http.Server.Serve
// (which speaks HTTP/2 on them when its TLSConfig is nil). Closing it stops
// HTTP delivery only; Listener.Close closes it too.
func (l *Listener) HTTPListener() net.Listener { return l.http }

// Close stops accepting on both transports, aborts pending handshakes, ends
// every session this Listener produced (QUIC sessions share its UDP socket
// and cannot outlive it; TCP sessions are ended too so both behave alike)
// and waits for its goroutines. Connections already handed out by
// HTTPListener belong to the HTTP server. Close is idempotent.
func (l *Listener) Close() error {
	var err error
	l.closeOnce.Do(func() {
		close(l.done)
		l.cancel()
		l.tickets.stop()
		l.http.close()
		err = l.tcp.Close()
		_ = l.ql.Close() // stops accepting; established connections stay
		l.wg.Wait()
		// Close sessions before the QUIC transport: closing the transport
		// would drop QUIC connections without telling the peers, which
		// would then wait for their idle timeout.
		l.mu.Lock()
		live := make([]trackedSession, 0, len(l.live))
		for s := range l.live {
			live = append(live, s)
		}
		l.mu.Unlock()
		for _, s := range live {
			_ = s.Close()
		}
		_ = l.qtr.Close()
		if uerr := l.udp.Close(); err == nil {
			err = uerr
		}
		l.log.Info("tunnel listener closed", "addr", l.tcp.Addr().String())
	})
	if err != nil {
		return fmt.Errorf("tunnel: close listener: %w", err)
	}
	return nil
}

// track remembers s until it ends, so Close can end it.
func (l *Listener) track(s trackedSession) {
	l.mu.Lock()
	l.live[s] = struct{}{}
	l.mu.Unlock()
	context.AfterFunc(s.context(), func() {
		l.mu.Lock()
		delete(l.live, s)
		l.mu.Unlock()
	})
}

// deliver hands s to Accept, or closes it if the Listener closes first.
func (l *Listener) deliver(s trackedSession) {
	l.refuse.pacer.admitted(time.Now())
	l.track(s)
	select {
	case l.sessions <- s:
	case <-l.done:
		_ = s.Close()
	}
}

// acceptQUIC accepts QUIC connections; quic-go completes (and bounds, with
// HandshakeIdleTimeout) their handshakes before returning them.
func (l *Listener) acceptQUIC() {
	for {
		conn, err := l.ql.Accept(l.ctx)
		if err != nil {
			if l.ctx.Err() == nil {
				l.log.Error("tunnel quic accept stopped", "err", err)
			}
			return
		}
		admitted(conn.Context())
		l.log.Debug("tunnel session accepted", "transport", "quic", "remote", conn.RemoteAddr().String())
		s := newQUICSession(conn)
		l.peers.add(s)
		context.AfterFunc(conn.Context(), func() { l.peers.remove(s) })
		l.deliver(s)
	}
}

// acceptTCP accepts TCP connections and hands each to its own handshake
// goroutine, so a slow client never holds up the loop.
func (l *Listener) acceptTCP() {
	var backoff time.Duration
	for {
		raw, err := l.tcp.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) || l.ctx.Err() != nil {
				return
			}
			// Out of file descriptors and the like: back off as
			// net/http does rather than spin.
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			l.log.Warn("tunnel tcp accept failed", "err", err, "retry_in", backoff)
			select {
			case <-time.After(backoff):
				continue
			case <-l.done:
				return
			}
		}
		backoff = 0
		select {
		case l.handshake <- struct{}{}:
		default:
			l.log.Debug("tunnel handshakes at their limit, refusing connection", "remote", raw.RemoteAddr().String())
			l.refuse.refuse(raw)
			continue
		}
		l.wg.Go(func() {
			defer func() { <-l.handshake }()
			l.serveTCP(raw)
		})
	}
}

// serveTCP runs the TLS handshake (bounded by HandshakeTimeout) and routes
// the connection by its negotiated ALPN.
func (l *Listener) serveTCP(raw net.Conn) {
	log := l.log.With("remote", raw.RemoteAddr().String())
	start := time.Now()
	_ = raw.SetDeadline(start.Add(l.cfg.HandshakeTimeout))
	ctx, cancel := context.WithTimeout(l.ctx, l.cfg.HandshakeTimeout)
	tc := tls.Server(raw, l.tcpTLS)
	err := tc.HandshakeContext(ctx)
	cancel()
	if err != nil {
		l.failed.add(time.Since(start))
		log.Debug("tunnel tls handshake failed", "err", err)
		_ = raw.Close()
		return
	}
	_ = raw.SetDeadline(time.Time{})

	if tc.ConnectionState().NegotiatedProtocol != ALPN {
		l.http.deliver(tc)
		return
	}
	sess, err := newYamuxSession(tc, l.cfg, true, log.With("transport", "tcp"))
	if err != nil {
		log.Debug("tunnel start session failed", "err", err)
		return
	}
	log.Debug("tunnel session accepted", "transport", "tcp")
	l.deliver(sess)
}

// httpListener is the net.Listener of HTTPListener.
type httpListener struct {
	l         *Listener
	conns     chan net.Conn
	done      chan struct{}
	closeOnce sync.Once
}

func (h *httpListener) Accept() (net.Conn, error) {
	select {
	case c := <-h.conns:
		return c, nil
	case <-h.done:
		return nil, fmt.Errorf("tunnel: accept http: %w", net.ErrClosed)
	}
}

// deliver hands c to Accept, or closes it once the listener is closed.
func (h *httpListener) deliver(c *tls.Conn) {
	select {
	case h.conns <- c:
	case <-h.done:
		_ = c.Close()
	}
}

// Close stops HTTP delivery; the tunnel Listener keeps running.
func (h *httpListener) Close() error {
	h.close()
	return nil
}

func (h *httpListener) close() { h.closeOnce.Do(func() { close(h.done) }) }

func (h *httpListener) Addr() net.Addr { return h.l.Addr() }
