package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"github.com/quic-go/quic-go"
	"io"
	"net"
	"testing"
	"time"
)

func listenWith(t *testing.T, addr string, lc ListenConfig) *Listener {
	t.Helper()
	if lc.TunnelTLS == nil {
		lc.TunnelTLS = tunnelServerTLS()
	}
	l, err := Listen(t.Context(), addr, lc)
	if err != nil {
		t.Fatalf("Listen: %v", err)
	}
	t.Cleanup(func() { _ = l.Close() })
	return l
}

// TestSessionResumption checks that a second dial resumes the TLS session
// (no certificates exchanged, peer certificate still known to the hub), also
// against a new Listener with the same StatelessResetKey: a restarted hub.
func TestSessionResumption(t *testing.T) {
	key := [32]byte{1, 2, 3}
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			tc := clientTLS(true)
			tc.ClientSessionCache = tls.NewLRUClientSessionCache(4)
			dial := func(l *Listener) (resumed bool) {
				t.Helper()
				ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
				defer cancel()
				d := &Dialer{TLSConfig: tc, Transport: tr}
				agent, err := d.Dial(ctx, l.Addr().String())
				if err != nil {
					t.Fatalf("dial: %v", err)
				}
				defer agent.Close()
				hub, err := l.Accept(ctx)
				if err != nil {
					t.Fatalf("accept: %v", err)
				}
				defer hub.Close()
				// The ticket arrives after the handshake: let a stream
				// carry it before the session ends.
				// A round trip hub -> agent: the hub sends its ticket right
				// after the handshake, so by the time the agent reads the
				// hub's reply the ticket has arrived.
				a, h := openPair(t, agent, hub)
				_, _ = h.Write([]byte("x"))
				_, _ = a.Read(make([]byte, 1))
				cs := hub.ConnectionState()
				if len(cs.PeerCertificates) == 0 {
					t.Fatal("hub sees no peer certificate")
				}
				return cs.DidResume
			}
			l := listenWith(t, "127.0.0.1:0", ListenConfig{StatelessResetKey: &key})
			if dial(l) {
				t.Fatal("first session resumed, want a full handshake")
			}
			if !dial(l) {
				t.Fatal("second session did not resume")
			}
			addr := l.Addr().String()
			_ = l.Close()
			// The same address, as a restarted hub would have.
			l2 := listenWith(t, addr, ListenConfig{StatelessResetKey: &key})
			if !dial(l2) {
				t.Fatal("session after a restart with the same key did not resume")
			}
			l3 := listenWith(t, "127.0.0.1:0", ListenConfig{StatelessResetKey: &[32]byte{9}})
			if dial(l3) {
				t.Fatal("resumed against a hub with another key")
			}
		})
	}
}

// fullListener is a listener with one handshake slot, taken by a TCP
// connection that never handshakes (closed with the test; closing it early
// frees the slot).
func fullListener(t *testing.T) (*Listener, net.Conn) {
	t.Helper()
	l := listenWith(t, "127.0.0.1:0", ListenConfig{MaxHandshakes: 1, Config: &Config{HandshakeTimeout: 10 * time.Second}})
	raw, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { raw.Close() })
	time.Sleep(100 * time.Millisecond) // let the listener take the slot
	return l, raw
}

// TestMaxHandshakes fills the handshake slots with a TCP connection that
// never handshakes: new attempts on both transports are refused at once,
// and succeed again once the slot is free.
func TestMaxHandshakes(t *testing.T) {
	l, raw := fullListener(t)
	for _, tr := range transports {
		ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
		start := time.Now()
		d := &Dialer{TLSConfig: clientTLS(true), Transport: tr}
		s, err := d.Dial(ctx, l.Addr().String())
		cancel()
		if err == nil {
			s.Close()
			t.Fatalf("%v dial succeeded while the only handshake slot was taken", tr)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("%v dial was refused only after %v, want at once", tr, took)
		}
	}
	raw.Close() // its handshake fails, which frees the slot
	for _, tr := range transports {
		var err error
		for range 50 {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			d := &Dialer{TLSConfig: clientTLS(true), Transport: tr}
			var s Session
			s, err = d.Dial(ctx, l.Addr().String())
			cancel()
			if err == nil {
				h, aerr := l.Accept(t.Context())
				if aerr != nil {
					t.Fatal(aerr)
				}
				h.Close()
				s.Close()
				break
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err != nil {
			t.Fatalf("%v dial after the slot was freed: %v", tr, err)
		}
	}
}

// TestTCPRefusalDoesNotWaitForTheAgent: a TCP connection refused at the
// handshake limit gets the busy record and the hub's close at once, not
// once the agent closes (a busy fleet's agents close late, and each
// waiting refusal held one of maxRefusing): a ClientHello already there is
// read first so the close is a clean FIN; one that comes later draws a
// reset, which reaches the agent only after the hint. AdmissionStats counts
// each as hinted.
func TestTCPRefusalDoesNotWaitForTheAgent(t *testing.T) {
	l, _ := fullListener(t)
	hello := func(n int) []byte { return append([]byte{0x16, 0x03, 0x01, byte(n >> 8), byte(n)}, make([]byte, n)...) }
	for _, tc := range []struct {
		name   string
		first  []byte        // sent on connecting
		later  []byte        // sent after pause
		pause  time.Duration // longer than refuseDrain: the hub has closed
		clean  bool          // the hub's close must be a FIN
		silent bool          // the agent sends nothing
	}{
		{name: "whole ClientHello", first: hello(256), clean: true},
		{name: "ClientHello in two writes", first: hello(2048)[:1000], later: hello(2048)[1000:], pause: 5 * refuseDrain},
		{name: "agent silent", silent: true, clean: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := l.AdmissionStats().RefusedTCPHinted
			c, err := net.Dial("tcp", l.Addr().String())
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			start := time.Now()
			if !tc.silent {
				if _, err := c.Write(tc.first); err != nil {
					t.Fatal(err)
				}
			}
			if tc.later != nil {
				time.Sleep(tc.pause)
				_, _ = c.Write(tc.later) // may meet the hub's reset
			}
			_ = c.SetReadDeadline(time.Now().Add(refuseDeadline + 3*time.Second))
			got := make([]byte, 5)
			if _, err := io.ReadFull(c, got); err != nil {
				t.Fatalf("read the refusal: %v (got %q)", err, got)
			}
			if [4]byte(got[:4]) != busyMagic || got[4] < 1 {
				t.Fatalf("refusal %q, want the busy record with a hint", got)
			}
			rest, err := io.ReadAll(c) // ends at the hub's close
			if len(rest) != 0 || (tc.clean && err != nil) {
				t.Fatalf("after the hint: %q, %v; want the hub's close (clean: %v)", rest, err, tc.clean)
			}
			if took := time.Since(start); took > tc.pause+refuseDeadline/2 {
				t.Errorf("the hub closed %v after the connect, want at once (the agent never closed)", took)
			}
			if n := l.AdmissionStats().RefusedTCPHinted; n != before+1 {
				t.Errorf("RefusedTCPHinted %d -> %d, want one more", before, n)
			}
		})
	}
}

// TestBusyRetryAfter: a dial refused at the handshake limit is a
// BusyError carrying the hub's retry hint, on every transport (also when
// the dial raced both) and on a UDP socket shared by many dials.
func TestBusyRetryAfter(t *testing.T) {
	l, _ := fullListener(t)
	shared, err := ListenUDP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	for _, tc := range []struct {
		tr       Transport
		udp      *UDPSocket
		wantHint bool
	}{{TransportTCP, nil, true}, {TransportQUIC, nil, true}, {TransportQUIC, shared, true}, {TransportAuto, nil, true}} {
		var err error
		// The listener takes the slot for raw asynchronously: poll until
		// the refusal shows.
		for range 100 {
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			var s Session
			s, err = (&Dialer{TLSConfig: clientTLS(true), Transport: tc.tr, UDP: tc.udp}).Dial(ctx, l.Addr().String())
			cancel()
			if err == nil {
				s.Close()
				h, _ := l.Accept(t.Context())
				if h != nil {
					h.Close()
				}
				time.Sleep(20 * time.Millisecond)
				continue
			}
			break
		}
		d, ok := RetryAfter(err)
		if !ok {
			t.Fatalf("%v: refused dial is not busy: %v", tc.tr, err)
		}
		if tc.wantHint && (d < time.Second || d > retryHintMax) {
			t.Errorf("%v: retry hint %v, want 1s..%v (err %v)", tc.tr, d, retryHintMax, err)
		}
		if !tc.wantHint && d != 0 {
			t.Errorf("%v: retry hint %v, want none", tc.tr, d)
		}
	}
	if _, ok := RetryAfter(errors.New("other")); ok {
		t.Error("a plain error counts as busy")
	}
}

// TestParseQUICBusy: only the exact hint datagram is a hint, and the hint
// is capped at retryHintMax.
func TestParseQUICBusy(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want time.Duration
		ok   bool
	}{
		{quicBusyRecord(7), 7 * time.Second, true},
		{quicBusyRecord(255), retryHintMax, true},
		{quicBusyRecord(0), 0, false},
		{quicBusyMagic[:], 0, false},
		{append(quicBusyRecord(3), 0), 0, false},
		{[]byte{0x00, 'T', 'B', 'S', 'X', 3}, 0, false},
		{nil, 0, false},
	} {
		d, ok := parseQUICBusy(tc.in)
		if d != tc.want || ok != tc.ok {
			t.Errorf("parseQUICBusy(%q) = %v, %v; want %v, %v", tc.in, d, ok, tc.want, tc.ok)
		}
	}
}

// TestHintBeforeReaderRuns: a hint that reaches the dial's transport before
// the hint reader goroutine has run (a busy scheduler) is still taken. The
// reader is held back by a hook; the transport has started reading its
// socket (as a dial starts it), so quic-go sorts the hint as soon as it
// comes, and drops it unless watchHints already asked for non-QUIC packets.
func TestHintBeforeReaderRuns(t *testing.T) {
	release := make(chan struct{})
	testHookHintReader = func() { <-release }
	t.Cleanup(func() { testHookHintReader = nil })

	agent, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	hub, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Close()
	tr := &quic.Transport{Conn: agent}
	defer tr.Close()
	ctx, cancel := context.WithCancel(t.Context())
	hints := watchHints(ctx, tr, 2)
	defer func() { cancel(); close(release); <-hints.done }()

	// The agent's first packet starts its transport's socket reader, as a
	// dial's Initial does; the hub answers it with the hint.
	if _, err := tr.WriteTo([]byte{0x00, 'x'}, hub.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 16)
	_ = hub.SetReadDeadline(time.Now().Add(5 * time.Second))
	if _, _, err := hub.ReadFrom(buf); err != nil {
		t.Fatal(err)
	}
	if _, err := hub.WriteTo(quicBusyRecord(4), agent.LocalAddr()); err != nil {
		t.Fatal(err)
	}
	// Give quic-go's socket reader time to sort the hint while ours is
	// still held back.
	time.Sleep(200 * time.Millisecond)
	release <- struct{}{}
	d, ok := hints.take(hub.LocalAddr().(*net.UDPAddr), 2*time.Second)
	if !ok || d != 4*time.Second {
		t.Fatalf("hint %v, %v; want 4s, true (dropped before the reader ran)", d, ok)
	}
}

// TestHintBoxTakers: each waiting dial on a shared socket takes one hint
// from a burst; hints beyond room, from another address, or too old are not
// taken.
func TestHintBoxTakers(t *testing.T) {
	hub := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 4433}
	other := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 4433}
	b := &hintBox{room: 3, signal: make(chan struct{}, 1), done: make(chan struct{})}
	for range 5 {
		b.keep(quicBusyRecord(2), hub)
	}
	for i := range 4 {
		d, ok := b.take(hub, 0)
		if want := i < 3; ok != want || (ok && d != 2*time.Second) {
			t.Fatalf("take %d: %v, %v; want ok=%v (room 3)", i, d, ok, want)
		}
	}
	b.keep(quicBusyRecord(2), other)
	b.queue = append(b.queue, quicHint{from: hub.AddrPort(), d: time.Second, at: time.Now().Add(-2 * quicHintMaxAge)})
	if d, ok := b.take(hub, 0); ok {
		t.Fatalf("took %v: a foreign or stale hint", d)
	}

	const takers = 20
	b.room = takers
	got := make(chan bool, takers)
	for range takers {
		go func() {
			_, ok := b.take(hub, 5*time.Second)
			got <- ok
		}()
	}
	// Let the takers wait first, as refused dials do for the hint.
	time.Sleep(100 * time.Millisecond)
	for range takers {
		b.keep(quicBusyRecord(1), hub)
	}
	for i := range takers {
		if !<-got {
			t.Fatalf("taker %d of %d found no hint", i+1, takers)
		}
	}
	if n := len(b.queue); n != 0 {
		t.Errorf("%d hints left over after %d takes", n, takers)
	}
}

func FuzzParseQUICBusy(f *testing.F) {
	f.Add(quicBusyRecord(9))
	f.Add([]byte{0xc0, 0, 0, 0, 1})
	f.Fuzz(func(t *testing.T, b []byte) {
		d, ok := parseQUICBusy(b)
		if ok && (d < time.Second || d > retryHintMax) {
			t.Fatalf("hint %v out of 1s..%v", d, retryHintMax)
		}
		if !ok && d != 0 {
			t.Fatalf("no hint but %v", d)
		}
	})
}

// TestRetryPacerUnmeasured: before the hub has measured how fast it admits
// (just started, under a whole fleet coming back), refused agents are
// queued on the assumed rate, two turns of each handshake slot a second,
// within the backlog of agents that may be waiting; not all asked back in
// the same second.
func TestRetryPacerUnmeasured(t *testing.T) {
	p := &newRefuser(nil, DefaultMaxHandshakes).pacer
	now := time.Unix(1000, 0)
	var last time.Duration
	for i := range 5120 {
		h := p.hint(now, -1)
		if h < last {
			t.Fatalf("hint %d (%v) below the one before (%v)", i, h, last)
		}
		last = h
	}
	if last != 10*time.Second {
		t.Fatalf("5,120th hint before any admission = %v, want 10 s at the assumed 512/s", last)
	}
	q := &newRefuser(nil, DefaultMaxHandshakes).pacer
	for range 5120 {
		last = q.hint(now, 1024)
	}
	if last != 2*time.Second {
		t.Fatalf("5,120th hint with 1,024 agents waiting = %v, want 2 s", last)
	}
	var zero retryPacer // no assumed rate: a second
	if h := zero.hint(now, -1); h != time.Second {
		t.Fatalf("hint of a pacer with no rate = %v, want 1 s", h)
	}
}

// TestRetryPacer: refused agents get successive return slots spaced by the
// measured admission rate, never under a second or over retryHintMax, and a
// queue that has drained starts again from now.
func TestRetryPacer(t *testing.T) {
	var p retryPacer
	t0 := time.Unix(1000, 0)
	for i := range 100 { // 100 admissions over 1 s: 100/s
		p.admitted(t0.Add(time.Duration(i) * 10 * time.Millisecond))
	}
	now := t0.Add(1001 * time.Millisecond)
	p.admitted(now)
	var hints []time.Duration
	for range 1000 {
		hints = append(hints, p.hint(now, -1))
	}
	if hints[0] != time.Second {
		t.Errorf("first hint %v, want the 1 s floor", hints[0])
	}
	for i := 1; i < len(hints); i++ {
		if hints[i] < hints[i-1] {
			t.Fatalf("hint %d (%v) below hint %d (%v)", i, hints[i], i-1, hints[i-1])
		}
	}
	if last := hints[len(hints)-1]; last < 9*time.Second || last > 11*time.Second {
		t.Errorf("1000th hint at ~100 admissions/s = %v, want ~10 s", last)
	}
	// The queue drains at the rate: 5 s on, half of it is left.
	if h := p.hint(now.Add(5*time.Second), -1); h < 4*time.Second || h > 6*time.Second {
		t.Errorf("hint 5 s into a 10 s queue = %v, want ~5 s", h)
	}
	for range 100000 {
		p.hint(now.Add(5*time.Second), -1)
	}
	if h := p.hint(now.Add(5*time.Second), -1); h != retryHintMax {
		t.Errorf("hint after a long queue %v, want the cap %v", h, retryHintMax)
	}
	// No more agents can be queued than may be waiting (the hub's nodes
	// not connected): 300 at 100/s drain in 3 s, whatever was counted.
	if h := p.hint(now.Add(5*time.Second), 300); h != 3*time.Second {
		t.Errorf("hint with 300 agents waiting at 100/s = %v, want 3 s", h)
	}
	if h := p.hint(now.Add(5*time.Second), 0); h != time.Second {
		t.Errorf("hint with none waiting = %v, want the 1 s floor", h)
	}
	if h := p.hint(now.Add(time.Hour), -1); h != time.Second {
		t.Errorf("hint once the queue has drained %v, want 1 s", h)
	}
}

// TestRetryPacerEstimate: the rate the queue drains at is the hub's
// capacity: the highest rate of the windows of the last rateMemory in which
// the hub refused someone (or that beat the estimate). It rises at once,
// shortening the hints of agents already queued; a dip does not lower it
// while a better full window is remembered; windows with no refusal, or
// that events seldom close, never lower it; once the good windows are
// forgotten, the full windows since set it.
func TestRetryPacerEstimate(t *testing.T) {
	at := time.Unix(1000, 0)
	// window admits n sessions evenly over one rateWindow, with a refusal
	// in it if full, and returns the estimate after it.
	window := func(p *retryPacer, n int, full bool) float64 {
		t.Helper()
		for i := range n {
			if full && i == n/2 {
				p.hint(at, -1)
			}
			p.admitted(at)
			at = at.Add(rateWindow / time.Duration(n))
		}
		p.admitted(at) // closes the window
		at = at.Add(time.Millisecond)
		return p.estimate()
	}
	perWindow := func(rate float64) int { return int(rate * rateWindow.Seconds()) }
	near := func(got, want float64) bool { return got > want*0.95 && got < want*1.1 }
	var p retryPacer
	p.admitted(at) // opens the first window
	if r := window(&p, perWindow(100), true); !near(r, 100) {
		t.Fatalf("estimate after a window at 100/s = %.0f/s, want ~100", r)
	}
	// 900 agents queued at 100/s: the last is asked back in ~9 s.
	var h time.Duration
	for range 900 {
		h = p.hint(at, -1)
	}
	if h < 8*time.Second || h > 10*time.Second {
		t.Fatalf("900th hint at 100/s = %v, want ~9 s", h)
	}
	if r := window(&p, perWindow(400), true); !near(r, 400) {
		t.Fatalf("estimate after a window at 400/s = %.0f/s, want ~400 at once", r)
	}
	if h := p.hint(at, -1); h < 1*time.Second || h > 3*time.Second {
		t.Errorf("hint behind ~700 queued agents at 400/s = %v, want ~2 s", h)
	}
	window(&p, perWindow(400), true) // the window of that refusal
	// Windows with no refusal, and a long one with a stray refusal, never
	// lower it, however long they go on.
	for range 2 * int(rateMemory/rateWindow) {
		if r := window(&p, perWindow(40), false); !near(r, 400) {
			t.Fatalf("windows with no refusal at 40/s: estimate %.0f, want 400 still", r)
		}
	}
	p.hint(at, -1)
	at = at.Add(10 * rateWindow)
	p.admitted(at)
	if r := p.estimate(); !near(r, 400) {
		t.Errorf("a window 10× as long with one refusal: estimate %.0f, want 400 still", r)
	}
	// A dip does not lower it while a better full window is remembered.
	if r := window(&p, perWindow(400), true); !near(r, 400) {
		t.Fatalf("estimate after another window at 400/s = %.0f/s", r)
	}
	if r := window(&p, perWindow(100), true); !near(r, 400) {
		t.Errorf("a full window at 100/s just after one at 400/s: estimate %.0f, want 400 still", r)
	}
	// Full windows at 200/s for longer than rateMemory: they set it.
	var r float64
	for range int(rateMemory/rateWindow) + 2 {
		r = window(&p, perWindow(200), true)
	}
	if !near(r, 200) {
		t.Errorf("full windows at 200/s for %v: estimate %.0f, want 200", rateMemory, r)
	}
}

// TestQUICRefusalsOfOneAttempt: the Initial packets of one refused QUIC
// attempt (its first flight, retransmissions) take one place in the retry
// queue and get one hint, however they interleave with other agents'; the
// same address refused again after sameAttempt is a new attempt.
func TestQUICRefusalsOfOneAttempt(t *testing.T) {
	pc, err := net.ListenPacket("udp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	tr := &quic.Transport{Conn: pc}
	defer tr.Close()
	r := newRefuser(nil, DefaultMaxHandshakes)
	a := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 9}
	b := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 2), Port: 9}
	for _, addr := range []*net.UDPAddr{a, b, a, b, a, a} {
		r.hintQUIC(tr, addr)
	}
	r.pacer.mu.Lock()
	queued := r.pacer.queued
	r.pacer.mu.Unlock()
	if queued < 1.5 || queued > 2.05 { // less what drained between them at the assumed rate
		t.Fatalf("queue after six refusals of two attempts = %.2f, want 2", queued)
	}
	if n := r.quic.Load(); n != 6 {
		t.Errorf("refusals counted %d, want 6 (each packet is answered)", n)
	}
	// A slot comes free: the rest of a refused attempt is still refused,
	// a new address is admitted.
	sem := make(chan struct{}, 1)
	admit := quicAdmission(sem, r.refusedRecently, func(addr net.Addr) { r.hintQUIC(tr, addr) }, &handshakeFailures{})
	if _, err := admit(t.Context(), &quic.ClientInfo{RemoteAddr: a}); !errors.Is(err, errBusy) {
		t.Fatalf("an Initial of a refused attempt with a slot free: %v, want refused", err)
	}
	c := &net.UDPAddr{IP: net.IPv4(127, 0, 0, 3), Port: 9}
	ctx, cancel := context.WithCancel(t.Context())
	if _, err := admit(ctx, &quic.ClientInfo{RemoteAddr: c}); err != nil {
		t.Fatalf("a new address with a slot free: %v", err)
	}
	cancel() // the handshake ends without a session: the slot comes back
	for deadline := time.Now().Add(2 * time.Second); len(sem) != 0; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the slot of a handshake that ended was not given back")
		}
	}
	time.Sleep(sameAttempt + 100*time.Millisecond)
	r.hintQUIC(tr, a)
	r.pacer.mu.Lock()
	queued = r.pacer.queued
	r.pacer.mu.Unlock()
	// The first two have drained at the assumed rate by now: a new attempt
	// is queued alone (a repeat of the old one would have left 2).
	if queued < 0.9 || queued > 1.1 {
		t.Fatalf("queue after a new attempt = %.2f, want 1", queued)
	}
	if len(r.qrecent) != 1 || len(r.qorder) != 1 {
		t.Errorf("remembered %d addresses (%d in order), want only the last attempt", len(r.qrecent), len(r.qorder))
	}
	time.Sleep(sameAttempt + 100*time.Millisecond)
	if _, err := admit(t.Context(), &quic.ClientInfo{RemoteAddr: a}); err != nil {
		t.Fatalf("a new attempt from a once-refused address, slot free: %v", err)
	}
}

// TestQUICDialTimeoutAfterHint: quic-go drops stateless refusals beyond a
// short queue, so a saturated hub may send its retry hint and no refusal.
// A dial that then times out is busy with that hint; one that times out
// with no hint from the hub (a dead or silent hub) is a plain timeout. The
// "hub" here is a UDP socket that answers every packet with the hint
// datagram only.
func TestQUICDialTimeoutAfterHint(t *testing.T) {
	for _, tc := range []struct {
		name string
		hint bool
	}{{"hint but no refusal", true}, {"silent hub", false}} {
		t.Run(tc.name, func(t *testing.T) {
			hub, err := net.ListenPacket("udp", "127.0.0.1:0")
			if err != nil {
				t.Fatal(err)
			}
			defer hub.Close()
			go func() {
				buf := make([]byte, 2048)
				for {
					_, from, err := hub.ReadFrom(buf)
					if err != nil {
						return
					}
					if tc.hint {
						_, _ = hub.WriteTo(quicBusyRecord(7), from)
					}
				}
			}()
			d := &Dialer{
				TLSConfig: clientTLS(true),
				Transport: TransportQUIC,
				Config:    &Config{HandshakeTimeout: 2 * time.Second},
			}
			start := time.Now()
			_, err = d.Dial(t.Context(), hub.LocalAddr().String())
			if err == nil {
				t.Fatal("dial to a socket that speaks no QUIC succeeded")
			}
			if took := time.Since(start); took > 5*time.Second {
				t.Errorf("dial took %v, want about the handshake timeout", took)
			}
			hint, busy := RetryAfter(err)
			switch {
			case tc.hint && (!busy || hint != 7*time.Second):
				t.Errorf("timed-out dial after a hint: RetryAfter = %v, %v (err %v); want 7s, busy", hint, busy, err)
			case !tc.hint && busy:
				t.Errorf("timed-out dial with no hint counts as busy (hint %v): %v", hint, err)
			}
		})
	}
}
