package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
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

// TestMaxHandshakes fills the handshake slots with a TCP connection that
// never handshakes: new attempts on both transports are refused at once,
// and succeed again once the slot is free.
func TestMaxHandshakes(t *testing.T) {
	l := listenWith(t, "127.0.0.1:0", ListenConfig{MaxHandshakes: 1, Config: &Config{HandshakeTimeout: 10 * time.Second}})
	raw, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	time.Sleep(100 * time.Millisecond) // let the listener take the slot
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

// TestBusyRetryAfter: a dial refused at the handshake limit is a
// BusyError carrying the hub's retry hint, on every transport (also when
// the dial raced both) and on a UDP socket shared by many dials.
func TestBusyRetryAfter(t *testing.T) {
	l := listenWith(t, "127.0.0.1:0", ListenConfig{MaxHandshakes: 1, Config: &Config{HandshakeTimeout: 10 * time.Second}})
	shared, err := ListenUDP("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer shared.Close()
	raw, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
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
// (just started), every refused agent is asked back in a second, not
// queued on a guessed rate.
func TestRetryPacerUnmeasured(t *testing.T) {
	var p retryPacer
	now := time.Unix(1000, 0)
	for i := range 5000 {
		if h := p.hint(now); h != time.Second {
			t.Fatalf("hint %d before any admission = %v, want 1s", i, h)
		}
	}
	p.admitted(now) // first admission: the rate window opens, still no rate
	if h := p.hint(now.Add(500 * time.Millisecond)); h != time.Second {
		t.Fatalf("hint within the first window = %v, want 1s", h)
	}
}

// TestRetryPacer: refused agents get successive return slots spaced by the
// measured admission rate, never under a second or over retryHintMax, and a
// queue that has passed starts again from now.
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
		hints = append(hints, p.hint(now))
	}
	if hints[0] != time.Second {
		t.Errorf("first hint %v, want the 1 s floor", hints[0])
	}
	for i := 1; i < len(hints); i++ {
		if hints[i] < hints[i-1] {
			t.Fatalf("hint %d (%v) below hint %d (%v)", i, hints[i], i-1, hints[i-1])
		}
	}
	if last := hints[len(hints)-1]; last < 8*time.Second || last > 12*time.Second {
		t.Errorf("1000th hint at ~100 admissions/s = %v, want ~10 s", last)
	}
	for range 100000 {
		p.hint(now)
	}
	if h := p.hint(now); h != retryHintMax {
		t.Errorf("hint after a long queue %v, want the cap %v", h, retryHintMax)
	}
	if h := p.hint(now.Add(time.Hour)); h != time.Second {
		t.Errorf("hint once the queue has passed %v, want 1 s", h)
	}
}
