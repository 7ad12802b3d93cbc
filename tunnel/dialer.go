package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/quic-go/quic-go"
)

// DefaultHeadStart is how long QUIC runs alone before TCP joins the race in
// TransportAuto mode: long enough for a QUIC handshake on most links, short
// enough that a network dropping UDP costs little.
const DefaultHeadStart = 300 * time.Millisecond

// Dialer opens sessions to a hub; the agent uses it. The zero value is not
// usable: TLSConfig is required.
type Dialer struct {
	// TLSConfig carries the client certificate, RootCAs (or a pinning
	// VerifyConnection) and ServerName (derived from the dialed host when
	// empty). It is cloned; the Dialer sets NextProtos to ALPN and
	// MinVersion to TLS 1.3. Required.
	TLSConfig *tls.Config

	// Config tunes the session; nil means DefaultConfig.
	Config *Config

	// Transport is TransportAuto (race QUIC against TCP), or TransportQUIC /
	// TransportTCP to use only that one.
	Transport Transport

	// HeadStart is how long QUIC runs alone in TransportAuto before TCP is
	// tried too (TCP starts at once if QUIC fails sooner). Zero means
	// DefaultHeadStart; negative means no head start.
	HeadStart time.Duration

	// Logger receives per-attempt Debug logs. Nil discards.
	Logger *slog.Logger

	// LocalIP, if set, is the source address of the dial (TCP, and QUIC
	// unless UDP is set): for a multi-homed agent, or to spread simulated
	// agents over many loopback addresses so their connections fit the port
	// space.
	LocalIP net.IP

	// UDP, if set, carries QUIC dials on this shared socket instead of a new
	// socket per dial (see UDPSocket). Closing the socket ends the session.
	UDP *UDPSocket

	// AckLiveness: on QUIC, only the hub's acknowledgements count as
	// hearing it (Session.Heard), so that a half-open link whose
	// agent-to-hub direction is lost is found within the dead-peer timeout
	// even while the hub retransmits data it had in flight. Set it only if
	// the session's owner sends something the hub acknowledges at least
	// every keepalive interval whenever the hub sends no acknowledgement
	// (Tether's agent: its heartbeats, or the probes the session asks for
	// once its keepalive went unanswered: Prober): quic-go's own keepalive
	// waits for silence, so a session that keeps receiving a trickle and
	// sends nothing of its own would be closed as dead.
	AckLiveness bool
}

// Dial opens a session to the hub at addr ("host:port"; UDP and TCP use the
// same port). ctx bounds the dial only; each attempt is also bounded by
// Config.HandshakeTimeout. In TransportAuto the first transport to complete
// wins and the other attempt is cancelled (and closed, if it completed too);
// if both fail the error names both failures and wraps both.
//
// A hub that refuses the client certificate makes a TCP dial fail with the
// TLS alert (Dial waits one round trip for it). On QUIC the refusal can
// arrive just after Dial returned (TLS 1.3 lets the client finish first):
// the session then ends at once, and Done closes.
func (d *Dialer) Dial(ctx context.Context, addr string) (Session, error) {
	cfg, err := d.Config.resolve()
	if err != nil {
		return nil, err
	}
	if d.TLSConfig == nil {
		return nil, errors.New("tunnel: dial: Dialer.TLSConfig is required")
	}
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("tunnel: dial %q: %w", addr, err)
	}
	tlsConf := d.TLSConfig.Clone()
	tlsConf.MinVersion = tls.VersionTLS13
	tlsConf.NextProtos = []string{ALPN}
	if tlsConf.ServerName == "" {
		tlsConf.ServerName = host
	}
	log := orDiscard(d.Logger).With("addr", addr)

	switch d.Transport {
	case TransportQUIC:
		s, err := d.dialQUIC(ctx, addr, tlsConf, cfg)
		if err != nil {
			return nil, fmt.Errorf("tunnel: dial %s over quic: %w", addr, err)
		}
		return s, nil
	case TransportTCP:
		s, err := d.dialTCP(ctx, addr, tlsConf, cfg, log)
		if err != nil {
			return nil, fmt.Errorf("tunnel: dial %s over tcp: %w", addr, err)
		}
		return s, nil
	case TransportAuto:
		headStart := d.HeadStart
		if headStart == 0 {
			headStart = DefaultHeadStart
		}
		return d.dialAuto(ctx, addr, tlsConf, cfg, max(headStart, 0), log)
	}
	return nil, fmt.Errorf("tunnel: dial: unknown transport %v", d.Transport)
}

// dialAuto races QUIC against TCP, TCP starting after headStart or as soon
// as QUIC fails. It returns only after both attempts have finished, so
// nothing outlives it but the winning session.
func (d *Dialer) dialAuto(
	ctx context.Context, addr string, tlsConf *tls.Config, cfg *Config, headStart time.Duration, log *slog.Logger,
) (Session, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	type result struct {
		t   Transport
		s   Session
		err error
	}
	results := make(chan result, 2) // buffered: attempts never block on send
	pending := 1
	go func() {
		s, err := d.dialQUIC(ctx, addr, tlsConf, cfg)
		results <- result{TransportQUIC, s, err}
	}()
	tcpStarted := false
	startTCP := func() {
		tcpStarted = true
		pending++
		go func() {
			s, err := d.dialTCP(ctx, addr, tlsConf, cfg, log)
			results <- result{TransportTCP, s, err}
		}()
	}
	timer := time.NewTimer(headStart)
	defer timer.Stop()

	var quicErr, tcpErr error
	for pending > 0 {
		select {
		case <-timer.C:
			if !tcpStarted {
				log.Debug("tunnel quic head start over, racing tcp")
				startTCP()
			}
		case r := <-results:
			pending--
			if r.err == nil {
				cancel()
				for ; pending > 0; pending-- {
					if loser := <-results; loser.err == nil {
						_ = loser.s.Close()
					}
				}
				log.Debug("tunnel dialed", "transport", r.t.String())
				return r.s, nil
			}
			log.Debug("tunnel dial attempt failed", "transport", r.t.String(), "err", r.err)
			if r.t == TransportQUIC {
				quicErr = r.err
				if !tcpStarted {
					startTCP()
				}
			} else {
				tcpErr = r.err
			}
		}
	}
	return nil, fmt.Errorf("tunnel: dial %s: quic: %w; tcp: %w", addr, quicErr, tcpErr)
}

// dialQUIC opens a QUIC connection on the shared socket d.UDP, or on a UDP
// socket of its own that is closed with the connection. The socket's
// non-QUIC datagrams are read for the session's life: the hub's retry hint
// while dialing, its poke after a restart (quicPokeMagic) once dialed.
func (d *Dialer) dialQUIC(ctx context.Context, addr string, tlsConf *tls.Config, cfg *Config) (*quicSession, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.HandshakeTimeout)
	defer cancel()
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, err
	}
	if d.UDP != nil {
		conn, err := d.UDP.tr.Dial(ctx, ua, tlsConf, cfg.quicConfig())
		if err != nil {
			return nil, busyFromQUIC(err, d.UDP.hints, ua)
		}
		return d.quicSession(conn, cfg, d.UDP.hints), nil
	}
	// A transport of our own (not quic.DialAddr's) so that a refused dial
	// can read the hub's retry hint (see quicBusyMagic).
	local := &net.UDPAddr{IP: net.IPv4zero}
	if d.LocalIP != nil {
		local.IP = d.LocalIP
	}
	udp, err := net.ListenUDP("udp", local)
	if err != nil {
		return nil, err
	}
	tr := &quic.Transport{Conn: udp}
	// The reader outlives the dial's ctx: it reads pokes until the
	// connection ends.
	rctx, stopReader := context.WithCancel(context.WithoutCancel(ctx))
	hints := watchHints(rctx, tr, 2)
	conn, err := tr.Dial(ctx, ua, tlsConf, cfg.quicConfig())
	if err != nil {
		err = busyFromQUIC(err, hints, ua)
		stopReader()
		<-hints.done
		_ = tr.Close()
		_ = udp.Close()
		return nil, err
	}
	// The transport would outlive the connection: end both with it.
	context.AfterFunc(conn.Context(), func() {
		stopReader()
		<-hints.done
		_ = tr.Close()
		_ = udp.Close()
	})
	return d.quicSession(conn, cfg, hints), nil
}

// quicSession wraps a dialed connection: the dialing side's dead-peer rule
// (watchPeer) runs on it, on the peer's acknowledgements with AckLiveness,
// and the hub's poke after a restart, read from box, ends it.
func (d *Dialer) quicSession(conn *quic.Conn, cfg *Config, box *hintBox) *quicSession {
	s := newQUICSession(conn)
	s.acks = d.AckLiveness
	s.watchPeer(cfg)
	box.watch(s)
	return s
}

// dialTCP opens TLS over TCP and starts yamux. It then pings the hub once:
// in TLS 1.3 the client finishes its handshake before the server has checked
// the client certificate, so a rejected certificate only shows on the first
// read; the ping turns it into a dial error instead of a session that dies
// at once.
func (d *Dialer) dialTCP(
	ctx context.Context, addr string, tlsConf *tls.Config, cfg *Config, log *slog.Logger,
) (*yamuxSession, error) {
	ctx, cancel := context.WithTimeout(ctx, cfg.HandshakeTimeout)
	defer cancel()
	var nd net.Dialer
	if d.LocalIP != nil {
		nd.LocalAddr = &net.TCPAddr{IP: d.LocalIP}
	}
	raw, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	tc := tls.Client(raw, tlsConf)
	if err := tc.HandshakeContext(ctx); err != nil {
		_ = raw.Close()
		return nil, fmt.Errorf("tls handshake: %w", busyFromRecordHeader(err))
	}
	if p := tc.ConnectionState().NegotiatedProtocol; p != ALPN {
		_ = tc.Close()
		return nil, fmt.Errorf("hub negotiated ALPN %q, want %q", p, ALPN)
	}
	sess, err := newYamuxSession(tc, cfg, false, log.With("transport", "tcp"))
	if err != nil {
		return nil, err
	}
	stop := context.AfterFunc(ctx, func() { _ = sess.Close() })
	_, err = sess.mux.Ping()
	if !stop() {
		_ = sess.Close()
		return nil, fmt.Errorf("confirm session: %w", ctx.Err())
	}
	if err != nil {
		_ = sess.Close()
		if rerr := sess.conn.firstReadErr(); rerr != nil {
			err = rerr
		}
		return nil, fmt.Errorf("confirm session: %w", err)
	}
	return sess, nil
}
