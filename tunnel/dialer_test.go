package tunnel

import (
	"context"
	"errors"
	"net"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func TestAutoPrefersQUIC(t *testing.T) {
	l := startListener(t, nil)
	agent, hub := dialAccept(t, l, l.Addr().String(), TransportAuto, nil)
	if agent.Transport() != TransportQUIC || hub.Transport() != TransportQUIC {
		t.Fatalf("auto dial chose %v (hub sees %v), want quic", agent.Transport(), hub.Transport())
	}
}

// TestAutoFallsBackToTCP dials a port that answers on TCP (a proxy to a real
// listener) but not on UDP: either datagrams vanish, or nothing listens.
func TestAutoFallsBackToTCP(t *testing.T) {
	for _, udpMode := range []string{"black hole", "closed port"} {
		t.Run(udpMode, func(t *testing.T) {
			cfg := &Config{HandshakeTimeout: 5 * time.Second}
			l := startListener(t, cfg)
			proxy := newTCPProxy(t, l.Addr().String())
			if udpMode == "black hole" {
				hole, err := net.ListenPacket("udp", proxy.addr())
				if err != nil {
					t.Fatalf("bind UDP black hole: %v", err)
				}
				defer hole.Close()
				go func() {
					buf := make([]byte, 2048)
					for {
						if _, _, err := hole.ReadFrom(buf); err != nil {
							return
						}
					}
				}()
			}
			d := &Dialer{TLSConfig: clientTLS(true), Config: cfg, HeadStart: 100 * time.Millisecond}
			start := time.Now()
			agent, err := d.Dial(t.Context(), proxy.addr())
			if err != nil {
				t.Fatalf("auto dial: %v", err)
			}
			defer agent.Close()
			if agent.Transport() != TransportTCP {
				t.Fatalf("auto dial chose %v, want tcp", agent.Transport())
			}
			if took := time.Since(start); took > 4*time.Second {
				t.Errorf("fallback took %v, want well under the handshake timeout", took)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			hub, err := l.Accept(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer hub.Close()
			a, b := openPair(t, hub, agent)
			exchange(t, b, a, "over the fallback")
		})
	}
}

func TestAutoBothFail(t *testing.T) {
	// A port with nothing on TCP (refused) or UDP.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	d := &Dialer{TLSConfig: clientTLS(true), Config: &Config{HandshakeTimeout: time.Second}}
	start := time.Now()
	s, err := d.Dial(t.Context(), addr)
	if err == nil {
		s.Close()
		t.Fatal("dial succeeded")
	}
	msg := err.Error()
	if !strings.HasPrefix(msg, "tunnel: dial") || !strings.Contains(msg, "quic: ") || !strings.Contains(msg, "tcp: ") {
		t.Errorf("error %q should name both failures", msg)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("error %q should wrap the TCP failure (connection refused)", msg)
	}
	if took := time.Since(start); took > 3*time.Second {
		t.Errorf("dial took %v, want about HandshakeTimeout", took)
	}
}

// TestDialCancel: cancelling ctx ends every attempt promptly.
func TestDialCancel(t *testing.T) {
	// TCP accepts but never answers the TLS handshake; UDP swallows.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	hole, err := net.ListenPacket("udp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer hole.Close()

	for _, tr := range []Transport{TransportAuto, TransportQUIC, TransportTCP} {
		t.Run(tr.String(), func(t *testing.T) {
			ctx, cancel := context.WithCancel(t.Context())
			time.AfterFunc(200*time.Millisecond, cancel)
			d := &Dialer{TLSConfig: clientTLS(true), Transport: tr, HeadStart: 50 * time.Millisecond}
			start := time.Now()
			s, err := d.Dial(ctx, ln.Addr().String())
			if err == nil {
				s.Close()
				t.Fatal("dial succeeded")
			}
			if !errors.Is(err, context.Canceled) {
				t.Errorf("error %v, want context.Canceled", err)
			}
			if took := time.Since(start); took > 3*time.Second {
				t.Errorf("cancelled dial took %v", took)
			}
		})
	}
}

func TestDialErrors(t *testing.T) {
	tests := []struct {
		name string
		d    Dialer
		addr string
		want string
	}{
		{"no TLS config", Dialer{}, "127.0.0.1:1", "TLSConfig is required"},
		{"bad address", Dialer{TLSConfig: clientTLS(true)}, "127.0.0.1", "missing port"},
		{"unknown transport", Dialer{TLSConfig: clientTLS(true), Transport: 9}, "127.0.0.1:1", "unknown transport"},
		{
			"bad config",
			Dialer{TLSConfig: clientTLS(true), Config: &Config{IdleTimeout: time.Second}},
			"127.0.0.1:1",
			"IdleTimeout",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := tt.d.Dial(t.Context(), tt.addr)
			if err == nil || !strings.HasPrefix(err.Error(), "tunnel: ") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Dial error %v, want one mentioning %q", err, tt.want)
			}
		})
	}
}

// TestDialServerName: an empty ServerName is taken from the dialed host.
func TestDialServerName(t *testing.T) {
	l := startListener(t, nil)
	tlsConf := clientTLS(true)
	tlsConf.ServerName = ""
	d := &Dialer{TLSConfig: tlsConf, Transport: TransportTCP}
	port := strconv.Itoa(l.Addr().(*net.TCPAddr).Port)
	s, err := d.Dial(t.Context(), net.JoinHostPort("localhost", port))
	if err != nil {
		t.Fatalf("dial localhost: %v", err)
	}
	s.Close()
	if tlsConf.NextProtos != nil || tlsConf.MinVersion != 0 {
		t.Errorf("Dial modified the caller's tls.Config")
	}
}
