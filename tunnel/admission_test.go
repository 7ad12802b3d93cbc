package tunnel

import (
	"context"
	"crypto/tls"
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
