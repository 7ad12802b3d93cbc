package tunnel

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"
)

func TestListenSharesPort(t *testing.T) {
	l := startListener(t, nil)
	tcpPort := l.Addr().(*net.TCPAddr).Port
	udpPort := l.udp.LocalAddr().(*net.UDPAddr).Port
	if tcpPort == 0 || tcpPort != udpPort {
		t.Fatalf("TCP port %d, UDP port %d: want the same non-zero port", tcpPort, udpPort)
	}
}

func TestListenErrors(t *testing.T) {
	noClientAuth := tunnelServerTLS()
	noClientAuth.ClientAuth = tls.VerifyClientCertIfGiven
	httpWithTunnelALPN := httpServerTLS()
	httpWithTunnelALPN.NextProtos = []string{"h2", ALPN}

	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: net.IPv4(127, 0, 0, 1)})
	if err != nil {
		t.Fatal(err)
	}
	defer udp.Close()
	tcp, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer tcp.Close()

	tests := []struct {
		name string
		addr string
		lc   ListenConfig
		want string
	}{
		{"no tunnel TLS", "127.0.0.1:0", ListenConfig{}, "TunnelTLS is required"},
		{"client cert not required", "127.0.0.1:0", ListenConfig{TunnelTLS: noClientAuth}, "need a client certificate"},
		{
			"HTTP claims tunnel ALPN",
			"127.0.0.1:0",
			ListenConfig{TunnelTLS: tunnelServerTLS(), HTTPTLS: httpWithTunnelALPN},
			"must not contain",
		},
		{
			"bad config",
			"127.0.0.1:0",
			ListenConfig{TunnelTLS: tunnelServerTLS(), Config: &Config{MaxStreams: -1}},
			"MaxStreams",
		},
		{"bad address", "127.0.0.1", ListenConfig{TunnelTLS: tunnelServerTLS()}, "missing port"},
		{"UDP port taken", udp.LocalAddr().String(), ListenConfig{TunnelTLS: tunnelServerTLS()}, "listen udp"},
		{"TCP port taken", tcp.Addr().String(), ListenConfig{TunnelTLS: tunnelServerTLS()}, "listen tcp"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l, err := Listen(t.Context(), tt.addr, tt.lc)
			if err == nil {
				l.Close()
				t.Fatal("Listen succeeded")
			}
			if !strings.HasPrefix(err.Error(), "tunnel: ") || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Listen error %q, want it to mention %q", err, tt.want)
			}
			// The caller prefixes its flag and address; the error names
			// the address once, where the system's error does.
			if n := strings.Count(err.Error(), tt.addr); n > 1 || strings.Count(err.Error(), tt.want) > 1 {
				t.Fatalf("Listen error %q repeats itself", err)
			}
		})
	}
}

// TestClientWithoutCertRejected: a tunnel needs a node certificate on both
// transports.
func TestClientWithoutCertRejected(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			l := startListener(t, &Config{HandshakeTimeout: 3 * time.Second})
			d := &Dialer{TLSConfig: clientTLS(false), Transport: tr}
			s, err := d.Dial(t.Context(), l.Addr().String())
			if err == nil {
				// TLS 1.3 lets a client finish before the server has
				// checked its certificate; the session must die at once.
				defer s.Close()
				waitClosed(t, s.Done(), 5*time.Second, "session without client certificate")
			} else {
				t.Logf("dial refused: %v", err)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 500*time.Millisecond)
			defer cancel()
			if s, err := l.Accept(ctx); err == nil {
				s.Close()
				t.Fatal("listener accepted a session without client certificate")
			}
		})
	}
}

// TestHTTPListener serves a real http.Server on the shared port, over HTTP/2
// and HTTP/1.1, with and without a client certificate, next to a tunnel.
func TestHTTPListener(t *testing.T) {
	l := startListener(t, nil)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		cn := "-"
		if len(r.TLS.PeerCertificates) > 0 {
			cn = r.TLS.PeerCertificates[0].Subject.CommonName
		}
		fmt.Fprintf(w, "%s %s %s", r.Proto, r.TLS.NegotiatedProtocol, cn)
	})}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l.HTTPListener()) }()
	defer func() {
		_ = srv.Close()
		if err := <-served; !errors.Is(err, http.ErrServerClosed) {
			t.Errorf("Serve: %v", err)
		}
	}()

	tests := []struct {
		name     string
		withCert bool
		protos   []string
		want     string
	}{
		{"h2 with node cert", true, []string{"h2", "http/1.1"}, "HTTP/2.0 h2 node-1"},
		{"http1 without cert", false, []string{"http/1.1"}, "HTTP/1.1 http/1.1 -"},
		{"no ALPN", false, nil, "HTTP/1.1  -"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tlsConf := clientTLS(tt.withCert)
			tlsConf.NextProtos = tt.protos
			tr := &http.Transport{TLSClientConfig: tlsConf, ForceAttemptHTTP2: len(tt.protos) == 2}
			defer tr.CloseIdleConnections()
			resp, err := (&http.Client{Transport: tr, Timeout: 10 * time.Second}).Get("https://" + l.Addr().String() + "/")
			if err != nil {
				t.Fatalf("GET: %v", err)
			}
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			if err != nil || string(body) != tt.want {
				t.Fatalf("body %q, %v; want %q", body, err, tt.want)
			}
		})
	}

	// The tunnel keeps working beside HTTP, on both transports.
	for _, tr := range transports {
		dialAccept(t, l, l.Addr().String(), tr, nil)
	}
}

// TestHandshakeTimeout: a client that never finishes its handshake (or
// speaks garbage) is dropped after HandshakeTimeout without holding up
// anyone else.
func TestHandshakeTimeout(t *testing.T) {
	l := startListener(t, &Config{HandshakeTimeout: 500 * time.Millisecond})
	silent, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	garbage, err := net.Dial("tcp", l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer garbage.Close()
	if _, err := garbage.Write([]byte("GET / HTTP/1.0\r\n\r\n")); err != nil {
		t.Fatal(err)
	}

	// While the silent client stalls, tunnels still come in.
	for _, tr := range transports {
		dialAccept(t, l, l.Addr().String(), tr, nil)
	}

	for name, c := range map[string]net.Conn{"silent": silent, "garbage": garbage} {
		_ = c.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err := io.Copy(io.Discard, c)
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			t.Errorf("%s client not dropped within 5s", name)
		}
	}
}

func TestListenerClose(t *testing.T) {
	l, err := Listen(t.Context(), "127.0.0.1:0", ListenConfig{TunnelTLS: tunnelServerTLS(), HTTPTLS: httpServerTLS()})
	if err != nil {
		t.Fatal(err)
	}
	var sessions []Session
	for _, tr := range transports {
		agent, hub := dialAccept(t, l, l.Addr().String(), tr, nil)
		sessions = append(sessions, agent, hub)
	}
	// A session that completed its handshake but was never accepted.
	d := &Dialer{TLSConfig: clientTLS(true), Transport: TransportTCP}
	pending, err := d.Dial(t.Context(), l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer pending.Close()
	sessions = append(sessions, pending)

	if err := l.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := l.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	for i, s := range sessions {
		waitClosed(t, s.Done(), 5*time.Second, fmt.Sprintf("session %d (%v) after listener Close", i, s.Transport()))
	}
	if _, err := l.Accept(t.Context()); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Accept after Close: %v, want net.ErrClosed", err)
	}
	if _, err := l.HTTPListener().Accept(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("HTTPListener Accept after Close: %v, want net.ErrClosed", err)
	}
	if _, err := net.Dial("tcp", l.Addr().String()); err == nil {
		t.Errorf("TCP port still open after Close")
	}
}

func TestAcceptContext(t *testing.T) {
	l := startListener(t, nil)
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if _, err := l.Accept(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Accept: %v, want context.DeadlineExceeded", err)
	}
}

// TestListenWildcard: an address without host listens on all interfaces,
// on both transports.
func TestListenWildcard(t *testing.T) {
	l, err := Listen(t.Context(), ":0", ListenConfig{TunnelTLS: tunnelServerTLS()})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(l.Addr().(*net.TCPAddr).Port))
	for _, tr := range transports {
		agent, hub := dialAccept(t, l, addr, tr, nil)
		openPair(t, hub, agent)
	}
}
