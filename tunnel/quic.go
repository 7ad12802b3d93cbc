package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quic-go/quic-go"
)

// QUIC error codes this package sends.
const (
	// quicCodeClosed is the application error code of Session.Close and of
	// Stream.Close's STOP_SENDING: a normal end, not a failure.
	quicCodeClosed = 0
	// quicCodeDeadPeer closes a session whose peer was silent for the
	// dead-peer timeout (quicSession.watchPeer).
	quicCodeDeadPeer = 1
	// quicCodeHubRestarted closes a dialed session whose hub said, with the
	// session's own poke token, that it restarted (quicSession.poked).
	quicCodeHubRestarted = 2
)

// quicSession is a Session over one QUIC connection. quic-go does the
// multiplexing, flow control (stream and session windows), stream limits
// (MaxIncomingStreams) and keepalives; this type only adapts the API.
type quicSession struct {
	conn *quic.Conn
	// acks: Heard marks the peer's acknowledgements, not its packets
	// (Dialer.AckLiveness).
	acks bool
	// watch is the dialing side's dead-peer rule (nil on the hub).
	watch *peerWatch
	// token authenticates the hub's poke after a restart (pokeToken).
	token     [pokeTokenLen]byte
	tokenOnce sync.Once
}

var (
	_ Session = (*quicSession)(nil)
	_ Prober  = (*quicSession)(nil)
)

func newQUICSession(conn *quic.Conn) *quicSession {
	return &quicSession{conn: conn}
}

// Prober is implemented by the QUIC sessions Dial returns. Their dead-peer
// rule needs probes that only the session's owner can send: QUIC gives an
// application no way to send a PING of its own, and quic-go's keepalive
// sends one PING per silence, counted from the last packet received, with
// only the loss timer's backed-off retransmissions after it. On a lossy
// link with a long round trip that left one attempt before the dead-peer
// close (measured: 2% of sessions through 300 ms and 5% loss each way died
// within seconds of starting, see TestQUICProbesKeepLossySessions). So once
// the peer has acknowledged nothing for longer than its keepalive's answer
// takes, the session asks for a probe every half sample interval until it
// hears the peer again or closes, and the owner sends something the peer
// acknowledges (Tether's agent: a heartbeat, which is also large enough to
// draw a restarted hub's stateless reset, as a PING is not).
type Prober interface {
	// Probes starts asking for probes once the peer has acknowledged
	// nothing for pingAfter (when the keepalive goes out:
	// Config.PingAfter, given the peer's idle timeout) and a little more
	// for its answer. A Probe waits on the channel (one at most; none is
	// queued behind it) until the owner takes it.
	Probes(pingAfter time.Duration) <-chan Probe
}

// Probe asks the owner of a session (Prober) to send the peer something it
// acknowledges.
type Probe struct {
	// Silent is how long the peer has acknowledged nothing, at least.
	Silent time.Duration
	// Heard is the session's Heard mark all that time: the peer is heard
	// again once Heard differs.
	Heard uint64
}

// Probes implements Prober.
func (s *quicSession) Probes(pingAfter time.Duration) <-chan Probe {
	w := s.watch
	if w == nil {
		return nil // an accepted session: the hub probes nobody
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	// A peer with a shorter idle timeout makes the keepalive come sooner
	// (Config.PingAfter), and the samples with it: a fifth of it apart at
	// most, so the probes still come before QUIC's idle timeout.
	w.rule.every = min(w.rule.every, max(pingAfter/5, 10*time.Millisecond))
	w.rule.probeAfter = probeAfter(pingAfter, w.rule.every)
	return w.probes
}

// watchPeer is the dialing side's dead-peer rule (peerRule), sampled from a
// timer (no goroutine) every quarter keepalive interval. quic-go's idle
// timeout ends a session whose peer stays silent, but silently: on a
// half-open link whose other direction works, the hub, which sends no
// keepalives of its own and still hears ours, would hold the session until
// ours stopped and its own idle timeout ran out, twice the dead-peer
// timeout. So the session is closed explicitly first, once nothing was
// heard for silentClose, and the CONNECTION_CLOSE reaches a peer that can
// still hear. Before that, it asks for probes (Prober).
func (s *quicSession) watchPeer(cfg *Config) {
	now := time.Now()
	w := &peerWatch{
		s:      s,
		rule:   peerRule{every: cfg.KeepAliveInterval / 4, silent: cfg.silentClose(), last: s.Heard(), heardAt: now},
		probes: make(chan Probe, 1),
	}
	s.watch = w
	w.mu.Lock() // the first check waits for t
	w.t = time.AfterFunc(w.rule.every, w.check)
	w.mu.Unlock()
	context.AfterFunc(s.conn.Context(), func() {
		w.mu.Lock()
		w.t.Stop()
		w.mu.Unlock()
	})
}

// peerWatch runs one session's peerRule.
type peerWatch struct {
	s      *quicSession
	probes chan Probe

	mu   sync.Mutex
	t    *time.Timer
	rule peerRule
}

func (w *peerWatch) check() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.s.conn.Context().Err() != nil {
		return
	}
	now := time.Now()
	switch w.rule.sample(w.s.Heard(), now) {
	case peerDead:
		_ = w.s.conn.CloseWithError(quicCodeDeadPeer, fmt.Sprintf("nothing heard from the peer for %v", w.rule.silent))
		return
	case peerProbe:
		select {
		case w.probes <- Probe{Silent: w.rule.silentFor(now), Heard: w.rule.last}:
		default: // the owner has not taken the last one yet
		}
		// While the silence lasts the samples, and the probes, come twice
		// as often: more tries before the close, each with its own answer.
		w.t.Reset(w.rule.every / 2)
		return
	}
	w.t.Reset(w.rule.every)
}

// peerRule decides, from samples of a session's Heard mark taken every
// `every` (half that while it asks for probes), when the peer is due a
// probe and when it is dead. A change in the mark came at most `every`
// before the sample that saw it (heardAt), so the silence is counted from
// heardAt: at most `every` short.
type peerRule struct {
	every time.Duration // how often the mark is sampled
	// silent is the silence that closes the session: the close comes at a
	// silence between silent-every and silent.
	silent time.Duration
	// probeAfter is the silence from which every sample asks for a probe
	// (watchPeer then samples twice as often); 0: none (Probes not called).
	probeAfter time.Duration

	last    uint64    // the mark at the last sample
	heardAt time.Time // the sample at which last was first seen
}

// Verdicts of peerRule.sample.
const (
	peerAlive = iota
	peerProbe
	peerDead
)

func (r *peerRule) sample(heard uint64, now time.Time) int {
	if heard != r.last {
		r.last, r.heardAt = heard, now
		return peerAlive
	}
	switch silent := r.silentFor(now); {
	case silent >= r.silent-r.every:
		return peerDead
	case r.probeAfter > 0 && silent >= r.probeAfter:
		return peerProbe
	}
	return peerAlive
}

func (r *peerRule) silentFor(now time.Time) time.Duration { return now.Sub(r.heardAt) }

// probeAfter is the silence after which a session sampled every `every`
// asks for probes, given that its keepalive goes out after pingAfter: a
// tenth of pingAfter later for the keepalive's answer, but at least one
// sample (at the defaults the sample, 5 s, is the larger). Earlier would
// send a probe beside every keepalive of an idle session, doubling what it
// costs on a link metered by the byte; later leaves the probes less of the
// dead-peer timeout (silentClose) to get an answer in.
func probeAfter(pingAfter, every time.Duration) time.Duration {
	return pingAfter + max(pingAfter/10, every)
}

// poked ends a dialed session whose hub proved, with the session's poke
// token, that it no longer holds it: the hub restarted, or a replica that
// survived it pokes its agents (see quicPokeMagic). Only the hub knows the
// token besides this end (and its replicas, from the presence it
// recorded), so the session is closed at once, and the agent reconnects
// now instead of at its dead-peer timeout.
func (s *quicSession) poked() {
	_ = s.conn.CloseWithError(quicCodeHubRestarted, "the hub no longer holds this session (it restarted or died)")
}

// pokeToken is the session's poke token: keying material exported from
// its TLS session (RFC 8446 section 7.5), which only the two ends know.
func (s *quicSession) pokeToken() [pokeTokenLen]byte {
	s.tokenOnce.Do(func() {
		cs := s.conn.ConnectionState().TLS
		// Only fails before the handshake completes, which a session
		// never is: a zero token matches no poke (parseQUICPoke).
		b, err := cs.ExportKeyingMaterial(pokeTokenLabel, nil, pokeTokenLen)
		if err == nil {
			copy(s.token[:], b)
		}
	})
	return s.token
}

// OpenStream opens a stream with OpenStreamSync, which blocks while the peer's
// MaxIncomingStreams is reached. The peer only sees the stream once data is
// written on it.
func (s *quicSession) OpenStream(ctx context.Context) (Stream, error) {
	st, err := s.conn.OpenStreamSync(ctx)
	if err != nil {
		return nil, fmt.Errorf("tunnel: open stream: %w", s.sessionErr(ctx, err))
	}
	return &quicStream{st: st, conn: s.conn}, nil
}

func (s *quicSession) AcceptStream(ctx context.Context) (Stream, error) {
	st, err := s.conn.AcceptStream(ctx)
	if err != nil {
		return nil, fmt.Errorf("tunnel: accept stream: %w", s.sessionErr(ctx, err))
	}
	return &quicStream{st: st, conn: s.conn}, nil
}

// sessionErr marks err with ErrSessionClosed when the connection is gone, so
// callers can tell "session over" from "my ctx expired".
func (s *quicSession) sessionErr(ctx context.Context, err error) error {
	if ctx.Err() != nil && s.conn.Context().Err() == nil {
		return err
	}
	if s.conn.Context().Err() != nil || isConnectionErr(err) {
		return sessionClosed(err)
	}
	return err
}

func (s *quicSession) Transport() Transport { return TransportQUIC }

func (s *quicSession) ConnectionState() tls.ConnectionState {
	return s.conn.ConnectionState().TLS
}

func (s *quicSession) LocalAddr() net.Addr  { return s.conn.LocalAddr() }
func (s *quicSession) RemoteAddr() net.Addr { return s.conn.RemoteAddr() }

func (s *quicSession) Done() <-chan struct{} { return s.conn.Context().Done() }

// Heard (see Session.Heard) is the count of packets received. With
// Dialer.AckLiveness it moves with each RTT sample instead, that is each
// acknowledgement of something the session sent (RFC 9002 §5.1): on a
// half-open link whose dialer-to-peer direction is lost, a peer that had
// data in flight keeps retransmitting it until its own idle timeout, and
// counting those packets would put off watchPeer's close by as much.
func (s *quicSession) Heard() uint64 {
	st := s.conn.ConnectionStats()
	if !s.acks {
		return st.PacketsReceived
	}
	return rttMark(st)
}

// rttMark changes with every RTT sample: LatestRTT is the sample itself, and
// the smoothed RTT and its mean deviation, averages of nanosecond samples,
// move with it (all three staying put would take a sample equal to the
// average with no deviation at all).
func rttMark(st quic.ConnectionStats) uint64 {
	return uint64(st.LatestRTT) ^ uint64(st.SmoothedRTT)<<21 ^ uint64(st.MeanDeviation)<<42
}

// context is done when the session ends; the Listener uses it to forget the
// session.
func (s *quicSession) context() context.Context { return s.conn.Context() }

// Close closes the connection with code 0; quic-go makes it idempotent.
func (s *quicSession) Close() error {
	_ = s.conn.CloseWithError(quicCodeClosed, "")
	return nil
}

// quicStream adapts *quic.Stream to Stream. A quic.Stream's Close only ends
// the send direction (what we call CloseWrite); our Close also stops
// reading (STOP_SENDING), so it is a full close as on a TCP socket.
type quicStream struct {
	st       *quic.Stream
	conn     *quic.Conn
	closed   atomic.Bool
	wrClosed atomic.Bool
}

var _ Stream = (*quicStream)(nil)

func (s *quicStream) Read(b []byte) (int, error) {
	if s.closed.Load() {
		return 0, net.ErrClosed
	}
	n, err := s.st.Read(b)
	if err != nil && err != io.EOF {
		err = s.mapErr(err)
	}
	return n, err
}

func (s *quicStream) Write(b []byte) (int, error) {
	if s.closed.Load() {
		return 0, net.ErrClosed
	}
	n, err := s.st.Write(b)
	if err != nil {
		if errors.Is(err, quic.ErrStreamClosed) && s.wrClosed.Load() && !s.closed.Load() {
			return n, errWriteAfterCloseWrite
		}
		err = s.mapErr(err)
	}
	return n, err
}

// mapErr turns errors of a locally closed stream into net.ErrClosed, and of
// an ended session into ErrSessionClosed, as net.Conn users expect.
func (s *quicStream) mapErr(err error) error {
	switch {
	case s.closed.Load():
		return net.ErrClosed
	case isConnectionErr(err) || (s.conn.Context().Err() != nil && !isTimeout(err)):
		return fmt.Errorf("tunnel: stream: %w", sessionClosed(err))
	}
	return err
}

// sessionClosed marks err, the end of the connection, with
// ErrSessionClosed. The peer's Session.Close says so, instead of quic-go's
// "Application error 0x0 (remote)".
func sessionClosed(err error) error {
	var app *quic.ApplicationError
	if errors.As(err, &app) && app.Remote && app.ErrorCode == quicCodeClosed {
		return fmt.Errorf("%w by the peer", ErrSessionClosed)
	}
	return fmt.Errorf("%w: %w", ErrSessionClosed, err)
}

// isConnectionErr reports whether err is quic-go's report that the whole
// connection ended. A stream learns this before the connection's context is
// cancelled, so the type, not the context, decides.
func isConnectionErr(err error) bool {
	var (
		idle      *quic.IdleTimeoutError
		handshake *quic.HandshakeTimeoutError
		app       *quic.ApplicationError
		transport *quic.TransportError
		reset     *quic.StatelessResetError
		version   *quic.VersionNegotiationError
	)
	return errors.As(err, &idle) || errors.As(err, &handshake) || errors.As(err, &app) ||
		errors.As(err, &transport) || errors.As(err, &reset) || errors.As(err, &version)
}

func (s *quicStream) CloseWrite() error {
	if s.closed.Load() {
		return net.ErrClosed
	}
	s.wrClosed.Store(true)
	if err := s.st.Close(); err != nil {
		return fmt.Errorf("tunnel: close write: %w", err)
	}
	return nil
}

// Close stops reading (the peer's further writes fail) and sends FIN after
// the data already written. A Write blocked in another goroutine is
// interrupted and returns net.ErrClosed.
func (s *quicStream) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	s.st.CancelRead(quicCodeClosed)
	// Unblock a concurrent Write; data it already queued is still sent.
	_ = s.st.SetWriteDeadline(time.Now())
	if s.wrClosed.Swap(true) {
		return nil
	}
	// Close fails only if the send side was reset; the stream is over
	// either way.
	_ = s.st.Close()
	return nil
}

func (s *quicStream) LocalAddr() net.Addr  { return s.conn.LocalAddr() }
func (s *quicStream) RemoteAddr() net.Addr { return s.conn.RemoteAddr() }

func (s *quicStream) SetDeadline(t time.Time) error {
	if s.closed.Load() {
		return net.ErrClosed
	}
	return s.st.SetDeadline(t)
}

func (s *quicStream) SetReadDeadline(t time.Time) error {
	if s.closed.Load() {
		return net.ErrClosed
	}
	return s.st.SetReadDeadline(t)
}

func (s *quicStream) SetWriteDeadline(t time.Time) error {
	if s.closed.Load() {
		return net.ErrClosed
	}
	return s.st.SetWriteDeadline(t)
}

// errWriteAfterCloseWrite is returned by Write after CloseWrite, on both
// transports.
var errWriteAfterCloseWrite = fmt.Errorf("tunnel: write after CloseWrite: %w", net.ErrClosed)

// isTimeout reports a deadline error, which must stay recognisable as one
// (os.ErrDeadlineExceeded) even while the session is ending.
func isTimeout(err error) bool {
	return errors.Is(err, os.ErrDeadlineExceeded)
}
