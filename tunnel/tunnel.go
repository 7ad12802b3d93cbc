// Package tunnel carries Tether's multiplexed sessions between edge agents and
// the hub.
//
// An agent dials out to the hub (NAT and firewalls only have to allow outbound
// traffic); the hub keeps one Session per node and opens a Stream on it for
// every use (an operator's SSH jump, a provisioning job, a forwarded TCP port).
// Every stream the hub opens starts with a small versioned Header naming the
// service, answered by a Reply (see header.go).
//
// One hub port carries everything, so a firewall needs a single rule:
//
//   - UDP: QUIC (quic-go). Preferred: no head-of-line blocking between
//     streams, connection-level flow control, survives NAT rebinding.
//   - TCP: TLS 1.3. ALPN "tether/1" selects a tunnel (yamux inside TLS);
//     "h2"/"http/1.1" (or no ALPN) selects the HTTP API, which the Listener
//     hands to an http.Server through HTTPListener. TCP exists for networks
//     that block or mangle UDP.
//
// Both transports present the same Session and Stream contract, so callers
// never care which one a node uses. Dialer races QUIC against TCP (QUIC with a
// head start) so that a network that silently drops UDP costs one head start,
// not a timeout.
//
// The package imports no other Tether package.
package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
)

// ALPN is the TLS application protocol of tunnel sessions, on QUIC and on TCP.
// On TCP it is what tells a tunnel from an HTTP API connection on the shared
// port.
const ALPN = "tether/1"

// ErrSessionClosed is wrapped by the errors of Session.OpenStream,
// Session.AcceptStream and stream I/O once the session has ended (closed
// locally, closed by the peer, or dead-peer timeout). Callers branch on it to
// drop the node's session and wait for the agent to reconnect.
var ErrSessionClosed = errors.New("tunnel: session closed")

// Transport names the carrier of a session. It is typed so flags and config
// files can name it ("auto", "quic", "tcp").
type Transport int

const (
	// TransportAuto races QUIC against TCP when dialing (QUIC first, TCP after
	// Dialer.HeadStart). A Session never reports TransportAuto.
	TransportAuto Transport = iota
	// TransportQUIC is QUIC over UDP.
	TransportQUIC
	// TransportTCP is yamux inside TLS 1.3 over TCP.
	TransportTCP
)

// String returns "auto", "quic" or "tcp" (the words ParseTransport accepts).
func (t Transport) String() string {
	switch t {
	case TransportAuto:
		return "auto"
	case TransportQUIC:
		return "quic"
	case TransportTCP:
		return "tcp"
	}
	return fmt.Sprintf("transport(%d)", int(t))
}

// ParseTransport parses "auto", "quic" or "tcp", the forms Transport.String
// prints. Anything else is an error naming the accepted values.
func ParseTransport(s string) (Transport, error) {
	switch s {
	case "auto":
		return TransportAuto, nil
	case "quic":
		return TransportQUIC, nil
	case "tcp":
		return TransportTCP, nil
	}
	return 0, fmt.Errorf("tunnel: unknown transport %q: want auto, quic or tcp", s)
}

// MarshalText implements encoding.TextMarshaler so a Transport can sit in a
// JSON or YAML config as its name.
func (t Transport) MarshalText() ([]byte, error) {
	switch t {
	case TransportAuto, TransportQUIC, TransportTCP:
		return []byte(t.String()), nil
	}
	return nil, fmt.Errorf("tunnel: cannot marshal unknown transport %d", int(t))
}

// UnmarshalText implements encoding.TextUnmarshaler with ParseTransport.
func (t *Transport) UnmarshalText(b []byte) error {
	v, err := ParseTransport(string(b))
	if err != nil {
		return err
	}
	*t = v
	return nil
}

// Stream is one bidirectional byte stream in a session.
//
// It behaves like a TCP connection on both transports: Close is a full close
// (no more reads or writes; blocked calls return net.ErrClosed), CloseWrite is
// a half-close (the peer reads io.EOF once it has read everything written so
// far; this side can still read). Deadlines work as for net.Conn.
//
// One difference remains and callers must not depend on it: after the peer
// has fully closed a stream, writes on QUIC fail (the peer sent STOP_SENDING),
// while on TCP (yamux has no read-side abort) they succeed and the peer
// discards the data. A stream ends when both sides have closed it, so every
// Stream must be closed.
type Stream interface {
	net.Conn
	// CloseWrite half-closes the stream: the peer reads io.EOF after the data
	// written so far, and this side can still read.
	CloseWrite() error
}

// Session is one multiplexed tunnel between an agent and the hub. All methods
// are safe for concurrent use.
type Session interface {
	// OpenStream opens a new stream to the peer, blocking while the session's
	// stream limit (Config.MaxStreams) is reached or until ctx is done.
	//
	// On QUIC the peer's AcceptStream only returns the stream once data has
	// been written on it (QUIC sends no frame for an empty new stream). The
	// hub always writes the Header right away, so this never shows; other
	// callers must write first too.
	OpenStream(ctx context.Context) (Stream, error)
	// AcceptStream returns the next stream opened by the peer, blocking until
	// one arrives, the session ends (error wraps ErrSessionClosed) or ctx is
	// done.
	AcceptStream(ctx context.Context) (Stream, error)
	// Transport is TransportQUIC or TransportTCP.
	Transport() Transport
	// ConnectionState is the TLS state of the session; PeerCertificates is
	// how the hub learns which node (mTLS identity) it talks to.
	ConnectionState() tls.ConnectionState
	// LocalAddr is this side's address (UDP for QUIC, TCP for TCP).
	LocalAddr() net.Addr
	// RemoteAddr is the peer's address.
	RemoteAddr() net.Addr
	// Done is closed when the session has ended for any reason: Close, the
	// peer closing, the peer found dead by keepalives (Config.IdleTimeout),
	// or the Listener that accepted it being closed.
	Done() <-chan struct{}
	// Heard is a mark that moves whenever anything arrives from the peer
	// (keepalives included) and only then: two readings that differ say
	// the peer was heard in between. A QUIC session dialed with
	// Dialer.AckLiveness counts only what shows the peer hears it too, its
	// acknowledgements. It costs a few atomic loads, so a sweep over every
	// session may call it.
	Heard() uint64
	// Close ends the session and all its streams at once (data not yet sent
	// is dropped: close streams first for a graceful end). It is idempotent.
	Close() error
}
