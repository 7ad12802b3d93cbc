package tunnel

import (
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/quic-go/quic-go"
)

// Defaults of Config. They suit edge links: dead peers are noticed within
// a minute, and one stream can fill a 4 MiB/RTT pipe.
//
// The keepalive is about the longest interval that still keeps the UDP NAT
// binding of a QUIC agent open: NATs are seen to drop idle UDP bindings
// after 30s (RFC 4787 section 4.3 asks for 2 minutes but records shorter
// timers; RFC 9000 section 10.1.2 finds a packet every 30s necessary), and
// the agent's heartbeat goes out every 20s, its transport keepalive at the
// latest after keepAliveAfter (25s). An idle session costs one heartbeat
// exchange per interval: at the earlier 5s, 10k idle agents cost the hub a
// fifth of a core. TCP mappings last hours (RFC 5382) and would allow
// longer, but one setting serves both transports. The dead-peer timeout is
// three intervals, as frp's (30s heartbeats, 90s timeout).
const (
	DefaultKeepAliveInterval = 20 * time.Second
	DefaultIdleTimeout       = 60 * time.Second
	DefaultHandshakeTimeout  = 10 * time.Second
	DefaultStreamWindow      = 4 << 20  // 4 MiB
	DefaultSessionWindow     = 16 << 20 // 16 MiB
	DefaultMaxStreams        = 256
)

// Limits that Config.Validate enforces.
const (
	// minStreamWindow is yamux's initial (and minimum) window.
	minStreamWindow = 256 << 10
	// maxStreamWindow keeps StreamWindow*MaxStreams meaningful as a memory
	// bound and the value inside yamux's uint32 arithmetic.
	maxStreamWindow = 1 << 30
	// maxMaxStreams bounds the per-session semaphores and yamux backlog.
	maxMaxStreams = 1 << 16
)

// Config tunes sessions on both transports. The zero value of a field means
// its default, and a nil *Config means defaults everywhere. Hub and agent
// should use the same values (keepalives and windows are per side).
//
// Memory: a session buffers at most StreamWindow bytes per stream it has
// open, and at most MaxStreams streams per direction are open, so received
// data held per session is bounded by roughly MaxStreams*StreamWindow per
// direction (in Tether only the hub opens streams, so one direction counts).
// QUIC further caps the whole session at SessionWindow; yamux has no
// session-level window, so on TCP MaxStreams*StreamWindow is the bound.
type Config struct {
	// KeepAliveInterval is how often an idle session's dialing side (the
	// agent) sends a keepalive, so NAT bindings stay open and a dead peer
	// is noticed. A keepalive is only sent when nothing was received from
	// the peer for a little more than this (see keepAliveAfter): traffic
	// stands in for it. The listening side (the hub) sends none: it answers
	// its peers' keepalives and ends a session whose peer fell silent for
	// IdleTimeout. Default 20s.
	KeepAliveInterval time.Duration

	// IdleTimeout bounds how long a dead peer goes unnoticed: the session
	// ends (Done closes) when nothing has been heard from the peer for this
	// long. QUIC: MaxIdleTimeout, and the dialing side closes explicitly
	// half a keepalive interval earlier, so a hub on a half-open link hears
	// of it (quicSession.watchPeer). yamux: the dialing side's ping, sent
	// once the peer has been silent for a little more than
	// KeepAliveInterval, must be answered within the rest of IdleTimeout
	// (yamux's ConnectionWriteTimeout, which also bounds each frame write);
	// the listening side closes a session silent for IdleTimeout. Must
	// exceed KeepAliveInterval. Default 60s.
	IdleTimeout time.Duration

	// HandshakeTimeout bounds TLS and QUIC handshakes, on the hub (so a
	// client that stalls mid-handshake costs at most this long) and on the
	// dialer. Default 10s.
	HandshakeTimeout time.Duration

	// StreamWindow is the receive window of one stream: how many bytes the
	// peer may send ahead of our reads. One stream's throughput is capped at
	// StreamWindow/RTT (yamux's own 256 KiB default would cap a 100 ms link
	// at 2.5 MiB/s). Min 256 KiB. Default 4 MiB.
	StreamWindow uint32

	// SessionWindow bounds the receive window of all streams of a session
	// together (QUIC MaxConnectionReceiveWindow). Ignored on TCP, where yamux
	// has no session-level window. Must be at least StreamWindow.
	// Default 16 MiB.
	SessionWindow uint64

	// MaxStreams is the most streams the peer may have open at once towards
	// us, and the most we open towards the peer. QUIC enforces it with
	// MaxIncomingStreams (so the peer's value limits our opens); on TCP this
	// package enforces it with semaphores in OpenStream/AcceptStream that a
	// stream's Close releases, and the yamux accept backlog is MaxStreams.
	// OpenStream blocks while the limit is reached. Default 256.
	MaxStreams int
}

// DefaultConfig returns a Config with every field set to its default.
func DefaultConfig() *Config {
	return &Config{
		KeepAliveInterval: DefaultKeepAliveInterval,
		IdleTimeout:       DefaultIdleTimeout,
		HandshakeTimeout:  DefaultHandshakeTimeout,
		StreamWindow:      DefaultStreamWindow,
		SessionWindow:     DefaultSessionWindow,
		MaxStreams:        DefaultMaxStreams,
	}
}

// Validate reports the first field that is out of range, after zero fields
// have taken their defaults. A nil Config is valid.
func (c *Config) Validate() error {
	_, err := c.resolve()
	return err
}

// resolve returns a copy with defaults filled in, validated.
func (c *Config) resolve() (*Config, error) {
	r := DefaultConfig()
	if c != nil {
		if c.KeepAliveInterval != 0 {
			r.KeepAliveInterval = c.KeepAliveInterval
		}
		if c.IdleTimeout != 0 {
			r.IdleTimeout = c.IdleTimeout
		}
		if c.HandshakeTimeout != 0 {
			r.HandshakeTimeout = c.HandshakeTimeout
		}
		if c.StreamWindow != 0 {
			r.StreamWindow = c.StreamWindow
		}
		if c.SessionWindow != 0 {
			r.SessionWindow = c.SessionWindow
		}
		if c.MaxStreams != 0 {
			r.MaxStreams = c.MaxStreams
		}
	}
	switch {
	case r.KeepAliveInterval < 0:
		return nil, fmt.Errorf("tunnel: config: KeepAliveInterval %v must be positive", r.KeepAliveInterval)
	case r.IdleTimeout <= r.KeepAliveInterval:
		return nil, fmt.Errorf("tunnel: config: IdleTimeout %v must be greater than KeepAliveInterval %v", r.IdleTimeout,
			r.KeepAliveInterval)
	case r.HandshakeTimeout < 0:
		return nil, fmt.Errorf("tunnel: config: HandshakeTimeout %v must be positive", r.HandshakeTimeout)
	case r.StreamWindow < minStreamWindow || r.StreamWindow > maxStreamWindow:
		return nil, fmt.Errorf("tunnel: config: StreamWindow %d must be between %d and %d", r.StreamWindow, minStreamWindow,
			maxStreamWindow)
	case r.SessionWindow < uint64(r.StreamWindow):
		return nil, fmt.Errorf("tunnel: config: SessionWindow %d must be at least StreamWindow %d", r.SessionWindow,
			r.StreamWindow)
	case r.MaxStreams < 1 || r.MaxStreams > maxMaxStreams:
		return nil, fmt.Errorf("tunnel: config: MaxStreams %d must be between 1 and %d", r.MaxStreams, maxMaxStreams)
	}
	return r, nil
}

// keepAliveAfter is how long a session may be silent (nothing received from
// the peer) before it sends a keepalive. A little more than
// KeepAliveInterval: a peer that speaks every KeepAliveInterval on its own
// (Tether's control-stream heartbeat, answered by the hub) then keeps the
// session alive alone, and an idle session costs one exchange per interval
// instead of three (heartbeat, and a ping and its answer each way). It
// leaves at least as long for the keepalive's answer as it adds, so a dead
// peer is still found within IdleTimeout: keepAliveAfter+keepAliveWait is
// IdleTimeout.
func (c *Config) keepAliveAfter() time.Duration {
	margin := min(c.KeepAliveInterval/4, (c.IdleTimeout-c.KeepAliveInterval)/2)
	return c.KeepAliveInterval + margin
}

// PingAfter is how long a dialed session of transport t stays silent
// before it sends a keepalive, given the peer's idle timeout (0: not
// known). On TCP that is keepAliveAfter (yamuxSession pings by its own
// settings alone). On QUIC, which takes the shorter idle timeout of the two
// sides, quic-go pings after the shorter of its KeepAlivePeriod
// (keepAliveAfter) and half that. An invalid Config counts as the
// defaults, as Dial refuses it anyway.
func (c *Config) PingAfter(t Transport, peerIdle time.Duration) time.Duration {
	r, err := c.resolve()
	if err != nil {
		r = DefaultConfig()
	}
	if t == TransportTCP {
		return r.keepAliveAfter()
	}
	idle := r.IdleTimeout
	if peerIdle > 0 {
		idle = min(idle, peerIdle)
	}
	return min(r.keepAliveAfter(), idle/2)
}

// silentClose is how long the dialing side lets a QUIC peer stay silent
// before it closes the session explicitly (quicSession.watchPeer): half a
// keepalive interval short of IdleTimeout, as the control-stream watchdog
// (so quic-go's silent idle close never comes first), but never before a
// keepalive had half its wait to be answered.
func (c *Config) silentClose() time.Duration {
	return max(c.IdleTimeout-c.KeepAliveInterval/2, c.keepAliveAfter()+c.keepAliveWait()/2)
}

// keepAliveWait is how long a keepalive may go unanswered before the peer is
// dead: the rest of IdleTimeout.
func (c *Config) keepAliveWait() time.Duration { return c.IdleTimeout - c.keepAliveAfter() }

// quicConfig maps a resolved Config onto quic-go's.
func (c *Config) quicConfig() *quic.Config {
	return &quic.Config{
		// quic-go aborts a handshake after twice HandshakeIdleTimeout, so
		// half of ours bounds the whole handshake by HandshakeTimeout.
		HandshakeIdleTimeout: c.HandshakeTimeout / 2,
		MaxIdleTimeout:       c.IdleTimeout,
		// quic-go pings once nothing was received for this long (or half
		// the idle timeout, if less); the idle timeout itself finds a dead
		// peer.
		KeepAlivePeriod:                c.keepAliveAfter(),
		InitialStreamReceiveWindow:     uint64(c.StreamWindow),
		MaxStreamReceiveWindow:         uint64(c.StreamWindow),
		InitialConnectionReceiveWindow: c.SessionWindow,
		MaxConnectionReceiveWindow:     c.SessionWindow,
		MaxIncomingStreams:             int64(c.MaxStreams),
		MaxIncomingUniStreams:          -1, // Tether uses bidirectional streams only
		Tracer:                         quicTracer,
	}
}

// quicTracer, nil but in tests, traces every QUIC connection (qlog), to
// see what was sent, acknowledged and lost around a silence.
var quicTracer = quic.Config{}.Tracer

// yamuxConfig maps a resolved Config onto yamux's.
func (c *Config) yamuxConfig(log *slog.Logger) *yamux.Config {
	return &yamux.Config{
		// Streams beyond the backlog are reset by yamux; the backlog only
		// fills when the peer exceeds MaxStreams or we stop accepting.
		AcceptBacklog: c.MaxStreams,
		// Keepalives are sent by yamuxSession from a timer instead of
		// yamux's loop, which would park a goroutine (and its stack) per
		// session for as long as the session lives: at 100k idle agents
		// that is the hub's largest cost after the sessions themselves.
		EnableKeepAlive:   false,
		KeepAliveInterval: c.KeepAliveInterval,
		// Bounds the wait for a ping's answer (and each frame write): a
		// ping sent after keepAliveAfter of silence and unanswered for this
		// long ends the session IdleTimeout after the peer's last word.
		ConnectionWriteTimeout: c.keepAliveWait(),
		MaxStreamWindowSize:    c.StreamWindow,
		// StreamOpenTimeout closes the whole session when the peer is slow
		// to accept a stream (for instance because its MaxStreams is
		// reached), which QUIC never does; dead peers are the keepalive's
		// job, so it stays off.
		StreamOpenTimeout: 0,
		// StreamCloseTimeout would reset a half-closed stream (CloseWrite)
		// whose peer keeps sending for longer than the timeout, breaking
		// half-close semantics; full closes are handled in yamuxStream.Close.
		StreamCloseTimeout: 0,
		Logger:             yamuxLogger{log},
	}
}

// yamuxLogger sends yamux's printf logs (keepalive failures, resets) to slog
// at Debug: they describe one peer's trouble, not the hub's.
type yamuxLogger struct{ log *slog.Logger }

func (l yamuxLogger) Print(v ...any) { l.log.Debug(strings.TrimSpace(fmt.Sprint(v...))) }
func (l yamuxLogger) Printf(format string, v ...any) {
	l.log.Debug(strings.TrimSpace(fmt.Sprintf(format, v...)))
}
func (l yamuxLogger) Println(v ...any) { l.log.Debug(strings.TrimSpace(fmt.Sprint(v...))) }

// orDiscard returns l, or a logger that drops everything when l is nil.
func orDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
