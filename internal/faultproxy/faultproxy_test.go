package faultproxy

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// tcpEcho is an echo server; Close stops it and its connections.
type tcpEcho struct {
	ln    net.Listener
	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func newTCPEcho(t *testing.T) *tcpEcho {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	e := &tcpEcho{ln: ln}
	e.wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			e.mu.Lock()
			e.conns = append(e.conns, c)
			e.mu.Unlock()
			e.wg.Go(func() { _, _ = io.Copy(c, c); c.Close() })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		e.mu.Lock()
		for _, c := range e.conns {
			c.Close()
		}
		e.mu.Unlock()
		e.wg.Wait()
	})
	return e
}

func (e *tcpEcho) addr() string { return e.ln.Addr().String() }

func newTCP(t *testing.T, upstream string) *TCP {
	t.Helper()
	p, err := NewTCP("127.0.0.1:0", upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func dialTCP(t *testing.T, addr string) net.Conn {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// roundTrip writes msg and reads it back, returning how long it took.
func roundTrip(t *testing.T, c net.Conn, msg []byte) time.Duration {
	t.Helper()
	start := time.Now()
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, msg) {
		t.Fatal("echo corrupted")
	}
	return time.Since(start)
}

func TestFaultsValidate(t *testing.T) {
	for _, tc := range []struct {
		f  Faults
		ok bool
	}{
		{Faults{}, true},
		{Faults{Latency: time.Second, Jitter: time.Second, Loss: 1}, true},
		{Faults{Latency: -1}, false},
		{Faults{Latency: time.Millisecond, Jitter: time.Second}, false},
		{Faults{Loss: 1.5}, false},
		{Faults{Bandwidth: -1}, false},
	} {
		if err := tc.f.Validate(); (err == nil) != tc.ok {
			t.Errorf("%+v: Validate = %v", tc.f, err)
		}
	}
}

func TestTCPLatency(t *testing.T) {
	e := newTCPEcho(t)
	p := newTCP(t, e.addr())
	c := dialTCP(t, p.Addr())
	if d := roundTrip(t, c, []byte("warm")); d > 150*time.Millisecond {
		t.Fatalf("round trip without faults took %s", d)
	}
	if err := p.SetFaults(Both, Faults{Latency: 100 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	// Toxics apply to live connections too.
	if d := roundTrip(t, c, []byte("slow")); d < 200*time.Millisecond || d > 2*time.Second {
		t.Fatalf("round trip with 100ms each way took %s", d)
	}
	if err := p.SetFaults(Both, Faults{}); err != nil {
		t.Fatal(err)
	}
	if d := roundTrip(t, c, []byte("fast")); d > 150*time.Millisecond {
		t.Fatalf("round trip after clearing faults took %s", d)
	}
}

// TestTCPLossIsDelayNotCorruption: every chunk "lost" is held back for the
// retransmit delay, and the byte stream stays intact.
func TestTCPLossIsDelayNotCorruption(t *testing.T) {
	e := newTCPEcho(t)
	p := newTCP(t, e.addr())
	if err := p.SetFaults(Upstream, Faults{Loss: 1, RetransmitDelay: 150 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	c := dialTCP(t, p.Addr())
	msg := make([]byte, 256<<10)
	rand.Read(msg)
	if d := roundTrip(t, c, msg); d < 150*time.Millisecond {
		t.Fatalf("fully lossy link delivered in %s", d)
	}
}

// TestTCPStallHoldsBytes: a stalled link forwards nothing and closes
// nothing; on Resume the held bytes arrive intact.
func TestTCPStallHoldsBytes(t *testing.T) {
	e := newTCPEcho(t)
	p := newTCP(t, e.addr())
	c := dialTCP(t, p.Addr())
	roundTrip(t, c, []byte("before"))
	if err := p.Stall(Both); err != nil {
		t.Fatal(err)
	}
	msg := []byte("held back")
	if _, err := c.Write(msg); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(400 * time.Millisecond))
	var ne net.Error
	if _, err := c.Read(make([]byte, 16)); !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("read through a stalled link: %v, want a timeout", err)
	}
	if err := p.Resume(); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, len(msg))
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, err := io.ReadFull(c, got); err != nil || !bytes.Equal(got, msg) {
		t.Fatalf("after resume: %q %v", got, err)
	}
}

// TestTCPFlap: Down stalls everything; Up resets every connection (their
// ends see EOF or a reset at once) and new connections work.
func TestTCPFlap(t *testing.T) {
	e := newTCPEcho(t)
	p := newTCP(t, e.addr())
	c := dialTCP(t, p.Addr())
	roundTrip(t, c, []byte("up"))
	if err := p.Stall(Both); err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("lost in the outage"))
	time.Sleep(100 * time.Millisecond)
	start := time.Now()
	if err := p.ResetConnections(); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	var ne net.Error
	if n, err := c.Read(make([]byte, 64)); err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("read after reset: %d bytes, %v; want EOF or reset", n, err)
	}
	if d := time.Since(start); d > 2*time.Second {
		t.Fatalf("reset took %s to reach the client", d)
	}
	c2 := dialTCP(t, p.Addr())
	roundTrip(t, c2, []byte("back"))
}

func TestTCPRefuse(t *testing.T) {
	e := newTCPEcho(t)
	p := newTCP(t, e.addr())
	p.Refuse()
	if c, err := net.DialTimeout("tcp", p.Addr(), time.Second); err == nil {
		c.Close()
		t.Fatal("connect to a refusing proxy succeeded")
	}
	if err := p.Accept(); err != nil {
		t.Fatal(err)
	}
	roundTrip(t, dialTCP(t, p.Addr()), []byte("again"))
}

// udpEcho echoes datagrams and records the source addresses it saw.
type udpEcho struct {
	conn *net.UDPConn
	mu   sync.Mutex
	srcs map[string]bool
	wg   sync.WaitGroup
}

func newUDPEcho(t *testing.T) *udpEcho {
	t.Helper()
	c, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	e := &udpEcho{conn: c, srcs: map[string]bool{}}
	e.wg.Go(func() {
		buf := make([]byte, 2048)
		for {
			n, from, err := c.ReadFromUDP(buf)
			if err != nil {
				return
			}
			e.mu.Lock()
			e.srcs[from.String()] = true
			e.mu.Unlock()
			_, _ = c.WriteToUDP(buf[:n], from)
		}
	})
	t.Cleanup(func() { c.Close(); e.wg.Wait() })
	return e
}

func (e *udpEcho) sources() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.srcs)
}

func newUDP(t *testing.T, upstream string) *UDP {
	t.Helper()
	p, err := NewUDP("127.0.0.1:0", upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func udpClient(t *testing.T, addr string) *net.UDPConn {
	t.Helper()
	ua, _ := net.ResolveUDPAddr("udp", addr)
	c, err := net.DialUDP("udp", nil, ua)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// udpPing sends one datagram and waits up to wait for its echo.
func udpPing(c *net.UDPConn, wait time.Duration) (time.Duration, bool) {
	start := time.Now()
	c.Write([]byte("ping"))
	_ = c.SetReadDeadline(time.Now().Add(wait))
	buf := make([]byte, 64)
	for {
		n, err := c.Read(buf)
		if err != nil {
			return 0, false
		}
		if string(buf[:n]) == "ping" {
			return time.Since(start), true
		}
	}
}

func TestUDPLatency(t *testing.T) {
	e := newUDPEcho(t)
	p := newUDP(t, e.conn.LocalAddr().String())
	c := udpClient(t, p.Addr())
	if _, ok := udpPing(c, 2*time.Second); !ok {
		t.Fatal("no echo through a perfect link")
	}
	if err := p.SetFaults(Both, Faults{Latency: 80 * time.Millisecond, Jitter: 10 * time.Millisecond}); err != nil {
		t.Fatal(err)
	}
	d, ok := udpPing(c, 2*time.Second)
	if !ok || d < 140*time.Millisecond || d > time.Second {
		t.Fatalf("round trip with 80±10ms each way: %s, %v", d, ok)
	}
}

// TestUDPLoss: with a fixed seed, 30% loss per direction drops about 30% of
// the datagrams each way.
func TestUDPLoss(t *testing.T) {
	e := newUDPEcho(t)
	p := newUDP(t, e.conn.LocalAddr().String())
	p.Seed(1)
	if err := p.SetFaults(Both, Faults{Loss: 0.3}); err != nil {
		t.Fatal(err)
	}
	c := udpClient(t, p.Addr())
	const n = 500
	for range n {
		c.Write([]byte("x"))
		time.Sleep(200 * time.Microsecond)
	}
	time.Sleep(200 * time.Millisecond)
	sent, dropped := p.Stats(Upstream)
	if sent+dropped != n || dropped < n*20/100 || dropped > n*40/100 {
		t.Fatalf("upstream: %d sent, %d dropped of %d at 30%% loss", sent, dropped, n)
	}
	dsent, ddropped := p.Stats(Downstream)
	if dsent+ddropped != sent || ddropped < sent*15/100 || ddropped > sent*45/100 {
		t.Fatalf("downstream: %d sent, %d dropped of %d at 30%% loss", dsent, ddropped, sent)
	}
}

func TestUDPBandwidth(t *testing.T) {
	e := newUDPEcho(t)
	p := newUDP(t, e.conn.LocalAddr().String())
	if err := p.SetFaults(Upstream, Faults{Bandwidth: 100 << 10}); err != nil { // 100 KiB/s
		t.Fatal(err)
	}
	c := udpClient(t, p.Addr())
	payload := make([]byte, 1000)
	start := time.Now()
	for range 50 { // 50 kB: about 0.5 s at 100 KiB/s
		c.Write(payload)
	}
	_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
	buf := make([]byte, 2048)
	for i := range 50 {
		if _, err := c.Read(buf); err != nil {
			t.Fatalf("echo %d: %v", i, err)
		}
	}
	if d := time.Since(start); d < 400*time.Millisecond {
		t.Fatalf("50 kB through a 100 KiB/s link in %s", d)
	}
}

// TestUDPStallAndRebind: a stall is silence; Up after Down gives the client
// a new source port towards the upstream (NAT rebinding).
func TestUDPStallAndRebind(t *testing.T) {
	e := newUDPEcho(t)
	p := newUDP(t, e.conn.LocalAddr().String())
	c := udpClient(t, p.Addr())
	if _, ok := udpPing(c, 2*time.Second); !ok {
		t.Fatal("no echo")
	}
	p.Stall(Downstream)
	if _, ok := udpPing(c, 300*time.Millisecond); ok {
		t.Fatal("echo through a stalled downstream")
	}
	p.Resume()
	if _, ok := udpPing(c, 2*time.Second); !ok {
		t.Fatal("no echo after resume")
	}
	if e.sources() != 1 {
		t.Fatalf("upstream saw %d sources before rebinding", e.sources())
	}
	p.Down()
	if _, ok := udpPing(c, 300*time.Millisecond); ok {
		t.Fatal("echo through a link that is down")
	}
	p.Up()
	if _, ok := udpPing(c, 2*time.Second); !ok {
		t.Fatal("no echo after up")
	}
	if e.sources() != 2 {
		t.Fatalf("upstream saw %d sources after Up, want a new one", e.sources())
	}
}

// TestLinkSharesPort: one port for TCP and UDP, as the hub's.
func TestLinkSharesPort(t *testing.T) {
	te := newTCPEcho(t)
	ue := newUDPEcho(t)
	// Both echoes behind one "hub" port: forward each protocol to its echo.
	l, err := newLink("127.0.0.1:0", te.addr(), ue.conn.LocalAddr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	if l.TCP.Addr() != l.UDP.Addr() {
		t.Fatalf("TCP on %s, UDP on %s", l.TCP.Addr(), l.UDP.Addr())
	}
	c := dialTCP(t, l.Addr())
	roundTrip(t, c, []byte("tcp"))
	u := udpClient(t, l.Addr())
	if _, ok := udpPing(u, 2*time.Second); !ok {
		t.Fatal("no udp echo")
	}
	if err := l.Flap(200 * time.Millisecond); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(3 * time.Second))
	if _, err := c.Read(make([]byte, 8)); err == nil {
		t.Fatal("TCP connection survived a flap")
	}
	roundTrip(t, dialTCP(t, l.Addr()), []byte("tcp again"))
	if _, ok := udpPing(u, 2*time.Second); !ok {
		t.Fatal("no udp echo after the flap")
	}
}
