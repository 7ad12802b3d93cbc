package faultproxy

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"sync"
	"time"
)

const (
	maxDatagram = 64 << 10
	// queueLen bounds datagrams in flight per direction; beyond it they are
	// dropped, as a router's full queue would.
	queueLen = 4096
)

// UDP forwards datagrams between clients and one upstream address. Each
// client address gets its own upstream socket (a NAT mapping), so the
// upstream sees one source address per client.
type UDP struct {
	front    *net.UDPConn
	upstream *net.UDPAddr
	lines    [2]*delayLine // by dirIndex
	closed   chan struct{}
	wg       sync.WaitGroup

	mu      sync.Mutex // guards the following
	faults  [2]Faults
	stalled [2]bool
	down    bool
	flows   map[string]*flow // by client address
	rng     *rand.Rand
	drops   [2]int
	sent    [2]int
}

type flow struct {
	client *net.UDPAddr
	conn   *net.UDPConn // connected to upstream; its local port is the "NAT" port
}

// dirIndex maps Upstream to 0 and Downstream to 1.
func dirIndex(d Direction) int {
	if d == Downstream {
		return 1
	}
	return 0
}

// NewUDP starts a UDP proxy on listen (host:port, port 0 for any) to upstream.
func NewUDP(listen, upstream string) (*UDP, error) {
	la, err := net.ResolveUDPAddr("udp", listen)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: udp listen address %q: %w", listen, err)
	}
	ua, err := net.ResolveUDPAddr("udp", upstream)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: udp upstream %q: %w", upstream, err)
	}
	front, err := net.ListenUDP("udp", la)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: udp listen %s: %w", listen, err)
	}
	p := &UDP{front: front, upstream: ua, closed: make(chan struct{}), flows: map[string]*flow{},
		rng: rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 0x7e7e))}
	for i := range p.lines {
		p.lines[i] = &delayLine{q: make(chan datagram, queueLen), closed: p.closed}
		p.wg.Go(p.lines[i].run)
	}
	p.wg.Go(p.readClients)
	return p, nil
}

// Seed makes loss and jitter decisions reproducible.
func (p *UDP) Seed(seed uint64) {
	p.mu.Lock()
	p.rng = rand.New(rand.NewPCG(seed, 0x7e7e))
	p.mu.Unlock()
}

// Addr is the proxy's listen address.
func (p *UDP) Addr() string { return p.front.LocalAddr().String() }

// SetFaults applies f in dir.
func (p *UDP) SetFaults(dir Direction, f Faults) error {
	if err := f.Validate(); err != nil {
		return err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range []Direction{Upstream, Downstream} {
		if dir.has(d) {
			p.faults[dirIndex(d)] = f
		}
	}
	return nil
}

// Stall drops every datagram in dir (UDP has nothing to hold back) while
// flows stay mapped: the peers see silence, not an error.
func (p *UDP) Stall(dir Direction) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, d := range []Direction{Upstream, Downstream} {
		if dir.has(d) {
			p.stalled[dirIndex(d)] = true
		}
	}
}

// Resume ends a Stall.
func (p *UDP) Resume() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.stalled = [2]bool{}
}

// Down drops everything until Up.
func (p *UDP) Down() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = true
}

// Up ends Down and Stall and forgets every flow, so the next datagram of a
// client leaves from a new source port (a NAT rebinding after the link
// came back).
func (p *UDP) Up() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.down = false
	p.stalled = [2]bool{}
	p.forgetLocked()
}

// Rebind forgets every flow without taking the link down.
func (p *UDP) Rebind() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.forgetLocked()
}

func (p *UDP) forgetLocked() {
	for k, f := range p.flows {
		_ = f.conn.Close() // ends its reader
		delete(p.flows, k)
	}
}

// Stats reports datagrams dropped and forwarded per direction.
func (p *UDP) Stats(dir Direction) (sent, dropped int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := dirIndex(dir)
	return p.sent[i], p.drops[i]
}

// Close stops the proxy and waits for its goroutines.
func (p *UDP) Close() {
	select {
	case <-p.closed:
		return
	default:
	}
	close(p.closed)
	_ = p.front.Close()
	p.mu.Lock()
	p.forgetLocked()
	p.mu.Unlock()
	p.wg.Wait()
}

// decide returns whether to forward a datagram in direction i and its
// delay.
func (p *UDP) decide(i int) (bool, time.Duration, Faults) {
	p.mu.Lock()
	defer p.mu.Unlock()
	f := p.faults[i]
	if p.down || p.stalled[i] || (f.Loss > 0 && p.rng.Float64() < f.Loss) {
		p.drops[i]++
		return false, 0, f
	}
	p.sent[i]++
	d := f.Latency
	if f.Jitter > 0 {
		d += time.Duration(p.rng.Int64N(int64(2*f.Jitter))) - f.Jitter
	}
	return true, d, f
}

func (p *UDP) readClients() {
	buf := make([]byte, maxDatagram)
	for {
		n, from, err := p.front.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		f, err := p.flowFor(from)
		if err != nil {
			continue
		}
		ok, delay, faults := p.decide(0)
		if !ok {
			continue
		}
		data := append([]byte(nil), buf[:n]...)
		conn := f.conn
		p.lines[0].push(datagram{due: time.Now().Add(delay), data: data, bandwidth: faults.Bandwidth,
			send: func(b []byte) { _, _ = conn.Write(b) }})
	}
}

// flowFor returns the client's flow, creating it (and its upstream socket
// and reader) on its first datagram.
func (p *UDP) flowFor(client *net.UDPAddr) (*flow, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	select {
	case <-p.closed:
		return nil, net.ErrClosed
	default:
	}
	if f, ok := p.flows[client.String()]; ok {
		return f, nil
	}
	conn, err := net.DialUDP("udp", nil, p.upstream)
	if err != nil {
		return nil, err
	}
	f := &flow{client: client, conn: conn}
	p.flows[client.String()] = f
	p.wg.Go(func() { p.readUpstream(f) })
	return f, nil
}

func (p *UDP) readUpstream(f *flow) {
	buf := make([]byte, maxDatagram)
	for {
		n, err := f.conn.Read(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			// ICMP port unreachable and the like: the upstream is not
			// there (yet); keep the flow.
			select {
			case <-p.closed:
				return
			default:
			}
			continue
		}
		ok, delay, faults := p.decide(1)
		if !ok {
			continue
		}
		data := append([]byte(nil), buf[:n]...)
		client := f.client
		p.lines[1].push(datagram{due: time.Now().Add(delay), data: data, bandwidth: faults.Bandwidth,
			send: func(b []byte) { _, _ = p.front.WriteToUDP(b, client) }})
	}
}

type datagram struct {
	due       time.Time
	data      []byte
	bandwidth int64
	send      func([]byte)
}

// delayLine sends datagrams in arrival order, each no earlier than its due
// time and, with a bandwidth cap, no earlier than the previous one's
// serialization allows.
type delayLine struct {
	q      chan datagram
	closed chan struct{}
}

func (l *delayLine) push(d datagram) {
	select {
	case l.q <- d:
	default: // queue full: dropped
	}
}

func (l *delayLine) run() {
	var free time.Time // when the "wire" is free again (bandwidth)
	t := time.NewTimer(time.Hour)
	t.Stop()
	for {
		var d datagram
		select {
		case <-l.closed:
			return
		case d = <-l.q:
		}
		at := d.due
		if d.bandwidth > 0 {
			at = later(at, free)
			free = at.Add(time.Duration(int64(len(d.data)) * int64(time.Second) / d.bandwidth))
		}
		if wait := time.Until(at); wait > 0 {
			t.Reset(wait)
			select {
			case <-l.closed:
				t.Stop()
				return
			case <-t.C:
			}
		}
		d.send(d.data)
	}
}

func later(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
