package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// yamuxMaxWrite splits large writes into frames of at most this size. yamux
// sends a whole send window (up to StreamWindow, 4 MiB) as one frame, and
// every frame, keepalive pings included, waits behind the frames queued
// before it with ConnectionWriteTimeout as its limit; on a slow edge link a
// 4 MiB frame would make pings time out and kill a healthy session. 64 KiB
// keeps a frame under a second down to ~0.5 Mbit/s.
const yamuxMaxWrite = 64 << 10

// yamuxSession is a Session over yamux inside TLS over TCP. The agent is the
// yamux client, the hub the server; both may open streams.
//
// yamux lacks three things QUIC has, which this type adds: a limit on
// concurrent streams (semaphores of MaxStreams per direction, a slot held
// from open/accept until the stream's Close), context-aware OpenStream, and a
// full Close for streams (see yamuxStream.Close).
type yamuxSession struct {
	mux  *yamux.Session
	tls  *tls.Conn
	conn *hookConn

	openSem   chan struct{} // one slot per stream we opened
	acceptSem chan struct{} // one slot per stream the peer opened

	keepAlive time.Duration // silence after which a keepalive ping is sent (dialing side)
	idle      time.Duration // silence after which the peer is dead (listening side)
	log       *slog.Logger

	mu     sync.Mutex     // guards the following
	closed bool           // Close was called; spawn no more goroutines
	wg     sync.WaitGroup // open helpers and stream drainers, waited by Close
	ping   *time.Timer    // next keepalive ping, or the listening side's silence watch

	timerFired atomic.Uint32 // how often ping fired (tests: a session that hears its peer is never woken)
}

var _ Session = (*yamuxSession)(nil)

// newYamuxSession starts yamux on an already-handshaken TLS connection; the
// session owns tc from here on.
func newYamuxSession(tc *tls.Conn, cfg *Config, server bool, log *slog.Logger) (*yamuxSession, error) {
	hc := newHookConn(tc)
	ycfg := cfg.yamuxConfig(log)
	var (
		mux *yamux.Session
		err error
	)
	if server {
		mux, err = yamux.Server(hc, ycfg)
	} else {
		mux, err = yamux.Client(hc, ycfg)
	}
	if err != nil {
		_ = tc.Close()
		return nil, fmt.Errorf("tunnel: start yamux: %w", err)
	}
	s := &yamuxSession{
		mux:       mux,
		tls:       tc,
		conn:      hc,
		openSem:   make(chan struct{}, cfg.MaxStreams),
		acceptSem: make(chan struct{}, cfg.MaxStreams),
		keepAlive: cfg.keepAliveAfter(),
		idle:      cfg.IdleTimeout,
		log:       log,
	}
	if server {
		s.ping = time.AfterFunc(s.idle, s.watchSilence)
		hc.keepAlive(s.ping, s.idle)
	} else {
		s.ping = time.AfterFunc(s.keepAlive, s.sendPing)
		hc.keepAlive(s.ping, s.keepAlive)
	}
	return s, nil
}

// watchSilence is the listening side's keepalive (the hub's, with one
// session per agent): it sends nothing. The dialing side pings once it has
// heard nothing for keepAliveAfter, so a live peer speaks at least that
// often, and one unheard for IdleTimeout is dead: the session is closed,
// which a peer whose direction of a half-open link still works hears at
// once. An idle session then costs the hub one ping and its answer per
// interval, and no timer firing at all (reads push it, as for sendPing).
func (s *yamuxSession) watchSilence() {
	if !s.silentFor(s.idle) {
		return
	}
	s.mu.Unlock()
	s.log.Debug("tunnel peer silent for the dead-peer timeout; closing session", "silent_for", s.idle)
	_ = s.mux.Close()
}

// silentFor starts both keepalive timers' work: it counts the firing and
// reports whether the peer has been silent for d, holding s.mu. Otherwise
// (the session is closed, or the peer was heard since) it re-arms the timer
// for the rest of d if the session lives, and returns false with s.mu
// released.
func (s *yamuxSession) silentFor(d time.Duration) bool {
	s.timerFired.Add(1)
	s.mu.Lock()
	if s.closed || s.mux.IsClosed() {
		s.mu.Unlock()
		return false
	}
	if quiet := s.conn.sinceRead(); quiet < d {
		s.ping.Reset(d - quiet)
		s.mu.Unlock()
		return false
	}
	return true
}

// sendPing is the dialing side's keepalive: once nothing has been read from the peer for
// keepAliveAfter, a ping that must be answered within keepAliveWait (yamux's
// ConnectionWriteTimeout, which bounds Ping), or the session is closed, as
// yamux's own keepalive loop does. A session that hears from its peer anyway
// (heartbeats, streams) sends no pings: reads push the timer to
// keepAliveAfter past them (hookConn.Read), so it fires only after silence,
// and should it fire early it re-arms for keepAliveAfter past the last
// read: the peer's last word plus IdleTimeout still bounds when a dead peer
// is found. It runs from a timer, so an idle session holds no goroutine for
// it.
func (s *yamuxSession) sendPing() {
	if !s.silentFor(s.keepAlive) {
		return
	}
	s.wg.Add(1) // Close waits for a ping in flight
	s.mu.Unlock()
	defer s.wg.Done()
	if _, err := s.mux.Ping(); err != nil {
		if !s.mux.IsClosed() {
			s.log.Debug("tunnel keepalive failed; closing session", "err", err)
			_ = s.mux.Close()
		}
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.ping.Reset(s.keepAlive)
	}
}

// acquire takes a MaxStreams slot of sem and returns its (idempotent)
// release.
func (s *yamuxSession) acquire(ctx context.Context, sem chan struct{}) (func(), error) {
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	select {
	case sem <- struct{}{}:
		return sync.OnceFunc(func() { <-sem }), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-s.mux.CloseChan():
		return nil, ErrSessionClosed
	}
}

// spawn runs f in a goroutine that Close waits for, unless Close has begun.
func (s *yamuxSession) spawn(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return false
	}
	s.wg.Go(f)
	return true
}

// OpenStream takes a slot, then opens the yamux stream in a helper goroutine
// so that ctx is honoured even where yamux.OpenStream blocks (too many
// unacknowledged opens, a congested connection). A stream the helper opens
// after ctx gave up is closed again.
func (s *yamuxSession) OpenStream(ctx context.Context) (Stream, error) {
	release, err := s.acquire(ctx, s.openSem)
	if err != nil {
		return nil, fmt.Errorf("tunnel: open stream: %w", err)
	}
	type result struct {
		st  *yamux.Stream
		err error
	}
	results := make(chan result)
	abandoned := make(chan struct{})
	helper := func() {
		st, err := s.mux.OpenStream()
		select {
		case results <- result{st, err}:
		case <-abandoned:
			if st != nil {
				_ = st.Close()
			}
			release()
		}
	}
	if !s.spawn(helper) {
		release()
		return nil, fmt.Errorf("tunnel: open stream: %w", ErrSessionClosed)
	}
	select {
	case r := <-results:
		if r.err != nil {
			release()
			return nil, fmt.Errorf("tunnel: open stream: %w", s.sessionErr(r.err))
		}
		return s.newStream(r.st, release), nil
	case <-ctx.Done():
		close(abandoned)
		return nil, fmt.Errorf("tunnel: open stream: %w", ctx.Err())
	}
}

func (s *yamuxSession) AcceptStream(ctx context.Context) (Stream, error) {
	release, err := s.acquire(ctx, s.acceptSem)
	if err != nil {
		return nil, fmt.Errorf("tunnel: accept stream: %w", err)
	}
	st, err := s.mux.AcceptStreamWithContext(ctx)
	if err != nil {
		release()
		if ctx.Err() != nil && !s.mux.IsClosed() {
			return nil, fmt.Errorf("tunnel: accept stream: %w", ctx.Err())
		}
		return nil, fmt.Errorf("tunnel: accept stream: %w", s.sessionErr(err))
	}
	return s.newStream(st, release), nil
}

func (s *yamuxSession) newStream(st *yamux.Stream, release func()) *yamuxStream {
	return &yamuxStream{st: st, sess: s, release: release}
}

// sessionErr marks err with ErrSessionClosed once the session is over.
func (s *yamuxSession) sessionErr(err error) error {
	if s.mux.IsClosed() || errors.Is(err, yamux.ErrSessionShutdown) {
		return fmt.Errorf("%w: %w", ErrSessionClosed, err)
	}
	return err
}

func (s *yamuxSession) Transport() Transport { return TransportTCP }

func (s *yamuxSession) ConnectionState() tls.ConnectionState { return s.tls.ConnectionState() }

func (s *yamuxSession) LocalAddr() net.Addr  { return s.tls.LocalAddr() }
func (s *yamuxSession) RemoteAddr() net.Addr { return s.tls.RemoteAddr() }

func (s *yamuxSession) Done() <-chan struct{} { return s.mux.CloseChan() }

// Heard is the time of the last read with data (see Session.Heard).
func (s *yamuxSession) Heard() uint64 { return uint64(s.conn.lastRead.Load()) }

// context is done once the TLS connection is closed, which every way a yamux
// session ends goes through.
func (s *yamuxSession) context() context.Context { return s.conn.ctx }

// Close closes yamux (which closes the TLS connection and every stream) and
// waits for this session's helper goroutines.
func (s *yamuxSession) Close() error {
	_ = s.mux.Close()
	s.mu.Lock()
	s.closed = true
	s.ping.Stop()
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// hookConn is the connection under yamux. It cancels ctx when yamux closes
// it, so the session's end can be observed without a goroutine per session,
// and it keeps the first read error, which tells why a hub refused a dialer
// (a TLS alert such as "certificate required" arrives on the first read).
type hookConn struct {
	net.Conn
	ctx      context.Context
	cancel   context.CancelFunc
	readErr  atomic.Pointer[error]
	lastRead atomic.Int64 // monotonic nanoseconds since epoch of the last read with data

	// The session's keepalive timer, pushed to after (keepAliveAfter) past
	// a read at most every pushEvery (after/8), so that a session that
	// hears its peer every heartbeat interval never wakes the process for
	// its timer: a push costs a timer update, a firing a wake-up and a
	// goroutine, and at 10k idle sessions the firings (one per session per
	// heartbeat interval) were as many wake-ups as the heartbeats.
	ping      atomic.Pointer[time.Timer]
	after     time.Duration
	pushEvery time.Duration
	pushed    atomic.Int64 // lastRead when ping was last pushed
}

// keepAlive makes reads push t to after past them (see hookConn.ping).
func (c *hookConn) keepAlive(t *time.Timer, after time.Duration) {
	c.after, c.pushEvery = after, after/8
	c.pushed.Store(int64(time.Since(epoch) - c.pushEvery)) // the next read pushes
	c.ping.Store(t)
}

// epoch is the origin of hookConn.lastRead: time.Since on it is monotonic.
var epoch = time.Now()

func newHookConn(c net.Conn) *hookConn {
	ctx, cancel := context.WithCancel(context.Background())
	h := &hookConn{Conn: c, ctx: ctx, cancel: cancel}
	h.lastRead.Store(int64(time.Since(epoch)))
	return h
}

func (c *hookConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	if n > 0 {
		now := int64(time.Since(epoch))
		c.lastRead.Store(now)
		if t := c.ping.Load(); t != nil && now-c.pushed.Load() >= int64(c.pushEvery) && c.ctx.Err() == nil {
			c.pushed.Store(now)
			t.Reset(c.after)
		}
	}
	if err != nil {
		c.readErr.CompareAndSwap(nil, &err)
	}
	return n, err
}

// sinceRead is how long ago the peer was last heard.
func (c *hookConn) sinceRead() time.Duration {
	return time.Since(epoch) - time.Duration(c.lastRead.Load())
}

func (c *hookConn) Close() error {
	c.cancel() // first: closing TLS may wait for its close_notify write
	return c.Conn.Close()
}

// firstReadErr is the first error a read on the connection returned, or nil.
func (c *hookConn) firstReadErr() error {
	if p := c.readErr.Load(); p != nil {
		return *p
	}
	return nil
}

// yamuxStream adapts *yamux.Stream to Stream.
//
// yamux's Stream.Close only sends FIN, i.e. it is our CloseWrite; there is no
// way to stop the peer from sending. So our Close sends FIN, makes local
// reads and writes fail with net.ErrClosed, returns the MaxStreams slot, and
// hands the read side to a drainer goroutine that discards what the peer
// still sends until the peer closes its side (or the session ends). That
// keeps the peer's writes from blocking on a full window forever and frees
// the stream's buffer; the drainer is tied to the session's lifetime.
type yamuxStream struct {
	st      *yamux.Stream
	sess    *yamuxSession
	release func() // returns the MaxStreams slot; idempotent

	// readMu serialises reads so Close can hand the read side to the
	// drainer only after a blocked Read has left.
	readMu sync.Mutex

	closed   atomic.Bool // Close was called
	wrClosed atomic.Bool // FIN sent (CloseWrite or Close)
	readEOF  atomic.Bool // peer's FIN read
}

var _ Stream = (*yamuxStream)(nil)

func (s *yamuxStream) Read(b []byte) (int, error) {
	s.readMu.Lock()
	defer s.readMu.Unlock()
	if s.closed.Load() {
		return 0, net.ErrClosed
	}
	if s.readEOF.Load() {
		return 0, io.EOF
	}
	n, err := s.st.Read(b)
	switch {
	case err == nil:
		return n, nil
	case err == io.EOF:
		if s.closed.Load() {
			return n, net.ErrClosed
		}
		// yamux reports a session's end as EOF on every stream; a
		// stream cut short must not look like a clean end.
		if s.sess.mux.IsClosed() {
			return n, fmt.Errorf("tunnel: stream: %w: %w", ErrSessionClosed, io.ErrUnexpectedEOF)
		}
		s.readEOF.Store(true)
		if s.wrClosed.Load() {
			s.release()
		}
		return n, io.EOF
	}
	return n, s.mapErr(err)
}

// Write sends b in frames of at most yamuxMaxWrite bytes.
func (s *yamuxStream) Write(b []byte) (int, error) {
	if s.closed.Load() {
		return 0, net.ErrClosed
	}
	total := 0
	for len(b) > 0 {
		n, err := s.st.Write(b[:min(len(b), yamuxMaxWrite)])
		total += n
		if err != nil {
			return total, s.mapErr(err)
		}
		b = b[n:]
	}
	return total, nil
}

// mapErr translates yamux errors into what net.Conn users expect.
func (s *yamuxStream) mapErr(err error) error {
	switch {
	case s.closed.Load():
		return net.ErrClosed
	case err == yamux.ErrTimeout:
		return os.ErrDeadlineExceeded
	case s.sess.mux.IsClosed():
		return fmt.Errorf("tunnel: stream: %w: %w", ErrSessionClosed, err)
	case err == yamux.ErrStreamClosed && s.wrClosed.Load():
		return errWriteAfterCloseWrite
	}
	return err
}

func (s *yamuxStream) CloseWrite() error {
	if s.closed.Load() {
		return net.ErrClosed
	}
	if s.wrClosed.Swap(true) {
		return nil
	}
	_ = s.st.Close() // yamux's Close is a half-close: it sends FIN
	if s.readEOF.Load() {
		s.release()
	}
	return nil
}

func (s *yamuxStream) Close() error {
	if s.closed.Swap(true) {
		return nil
	}
	if !s.wrClosed.Swap(true) {
		_ = s.st.Close() // FIN; also wakes a Write blocked on the window
	}
	s.release()
	if !s.readEOF.Load() {
		_ = s.st.SetReadDeadline(time.Now()) // wake a blocked Read
		s.sess.spawn(s.drain)
	}
	return nil
}

// drain discards the peer's data after Close until the peer closes its side,
// resets the stream, or the session ends.
func (s *yamuxStream) drain() {
	s.readMu.Lock()
	defer s.readMu.Unlock()
	for {
		_ = s.st.SetReadDeadline(time.Time{})
		_, err := io.Copy(io.Discard, s.st)
		if err != yamux.ErrTimeout {
			return
		}
	}
}

func (s *yamuxStream) LocalAddr() net.Addr  { return s.sess.LocalAddr() }
func (s *yamuxStream) RemoteAddr() net.Addr { return s.sess.RemoteAddr() }

func (s *yamuxStream) SetDeadline(t time.Time) error {
	if s.closed.Load() {
		return net.ErrClosed
	}
	return s.st.SetDeadline(t)
}

func (s *yamuxStream) SetReadDeadline(t time.Time) error {
	if s.closed.Load() {
		return net.ErrClosed
	}
	return s.st.SetReadDeadline(t)
}

func (s *yamuxStream) SetWriteDeadline(t time.Time) error {
	if s.closed.Load() {
		return net.ErrClosed
	}
	return s.st.SetWriteDeadline(t)
}
