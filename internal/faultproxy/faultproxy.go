// Package faultproxy injects network faults between an agent and a hub in
// tests: latency, jitter, loss, bandwidth limits, stalls (a peer that stops
// forwarding without closing) and flaps (the link goes down and comes back,
// dropping every connection). This kernel has no tc netem, so the faults are
// applied by proxies on loopback:
//
//   - TCP goes through github.com/Shopify/toxiproxy/v2, used as a library;
//   - UDP (QUIC) goes through a small datagram proxy of our own.
//
// A Link puts both on the same port, which is what a Tether agent dials (QUIC
// on UDP and TLS on TCP share the hub's port).
package faultproxy

import (
	"errors"
	"fmt"
	"net"
	"time"
)

// Direction selects which way faults apply.
type Direction int

const (
	// Both directions.
	Both Direction = iota
	// Upstream is client to server (agent to hub).
	Upstream
	// Downstream is server to client (hub to agent).
	Downstream
)

func (d Direction) String() string {
	switch d {
	case Upstream:
		return "upstream"
	case Downstream:
		return "downstream"
	}
	return "both"
}

func (d Direction) has(x Direction) bool { return d == Both || d == x }

// Faults describe an unreliable link, per direction. The zero value is a
// perfect link.
type Faults struct {
	// Latency is the one-way delay (half the round trip added).
	Latency time.Duration
	// Jitter varies Latency uniformly by +/- Jitter.
	Jitter time.Duration
	// Loss is the probability (0..1) that a datagram is dropped (UDP) or
	// that a chunk of a TCP stream needs a retransmission: TCP never loses
	// bytes, so a loss shows as the chunk (and everything behind it) held
	// back for RetransmitDelay.
	Loss float64
	// RetransmitDelay is how long a lost TCP chunk is held back; default
	// max(200ms, 2*Latency), Linux's minimum RTO or two one-way delays.
	RetransmitDelay time.Duration
	// Bandwidth caps the rate in bytes per second; 0 means unlimited.
	Bandwidth int64
}

// Validate reports a field out of range.
func (f Faults) Validate() error {
	switch {
	case f.Latency < 0 || f.Jitter < 0 || f.RetransmitDelay < 0:
		return errors.New("faultproxy: latency, jitter and retransmit delay must not be negative")
	case f.Jitter > f.Latency:
		return fmt.Errorf("faultproxy: jitter %s exceeds latency %s", f.Jitter, f.Latency)
	case f.Loss < 0 || f.Loss > 1:
		return fmt.Errorf("faultproxy: loss %v outside 0..1", f.Loss)
	case f.Bandwidth < 0:
		return errors.New("faultproxy: bandwidth must not be negative")
	}
	return nil
}

func (f Faults) retransmitDelay() time.Duration {
	if f.RetransmitDelay > 0 {
		return f.RetransmitDelay
	}
	return max(200*time.Millisecond, 2*f.Latency)
}

// Link is a TCP and a UDP proxy on the same address, in front of one
// upstream address that serves both (a hub's --listen).
type Link struct {
	TCP *TCP
	UDP *UDP
}

// NewLink starts both proxies on host:port (port 0 picks one free for both
// protocols) forwarding to upstream.
func NewLink(listen, upstream string) (*Link, error) { return newLink(listen, upstream, upstream) }

func newLink(listen, tcpUpstream, udpUpstream string) (*Link, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: listen address %q: %w", listen, err)
	}
	attempts := 1
	if port == "0" {
		attempts = 20
	}
	var lastErr error
	for range attempts {
		u, err := NewUDP(listen, udpUpstream)
		if err != nil {
			return nil, err
		}
		_, p, _ := net.SplitHostPort(u.Addr())
		t, err := NewTCP(net.JoinHostPort(host, p), tcpUpstream)
		if err == nil {
			return &Link{TCP: t, UDP: u}, nil
		}
		u.Close()
		lastErr = err
	}
	return nil, fmt.Errorf("faultproxy: no port free for both TCP and UDP on %s: %w", host, lastErr)
}

// Addr is the address agents dial (TCP and UDP).
func (l *Link) Addr() string { return l.UDP.Addr() }

// SetFaults applies f to both protocols in the given direction(s).
func (l *Link) SetFaults(dir Direction, f Faults) error {
	if err := l.TCP.SetFaults(dir, f); err != nil {
		return err
	}
	return l.UDP.SetFaults(dir, f)
}

// Stall stops forwarding in dir on both protocols without closing anything:
// a half-open link (one direction) or a stalled peer (both).
func (l *Link) Stall(dir Direction) error {
	if err := l.TCP.Stall(dir); err != nil {
		return err
	}
	l.UDP.Stall(dir)
	return nil
}

// Resume ends a Stall.
func (l *Link) Resume() error {
	l.UDP.Resume()
	return l.TCP.Resume()
}

// Down takes the link down: nothing is forwarded, connections stay open
// (packets are lost as on a dead line) until Up.
func (l *Link) Down() error {
	l.UDP.Down()
	return l.TCP.Stall(Both)
}

// Up brings the link back the way a flapping edge link comes back: the
// NAT state is gone, so every TCP connection is reset and UDP flows get a
// new source port (their peers see a NAT rebinding).
func (l *Link) Up() error {
	if err := l.TCP.ResetConnections(); err != nil {
		return err
	}
	l.UDP.Up()
	return nil
}

// Flap is Down, a pause of down, then Up.
func (l *Link) Flap(down time.Duration) error {
	if err := l.Down(); err != nil {
		return err
	}
	time.Sleep(down)
	return l.Up()
}

// Close stops both proxies and closes every connection through them.
func (l *Link) Close() error {
	l.UDP.Close()
	l.TCP.Close()
	return nil
}
