package tunnel

import (
	"context"
	"io"
	"net"
	"testing"
	"time"
)

// TestDialLocalIP checks that Dialer.LocalIP is the source address the hub
// sees, on both transports.
func TestDialLocalIP(t *testing.T) {
	src := net.IPv4(127, 0, 0, 2)
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			l := startListener(t, nil)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			d := &Dialer{TLSConfig: clientTLS(true), Transport: tr, LocalIP: src}
			agent, err := d.Dial(ctx, l.Addr().String())
			if err != nil {
				t.Fatalf("dial from %v: %v", src, err)
			}
			defer agent.Close()
			hub, err := l.Accept(ctx)
			if err != nil {
				t.Fatalf("accept: %v", err)
			}
			defer hub.Close()
			if got := addrIP(hub.RemoteAddr()); !got.Equal(src) {
				t.Errorf("hub sees the agent at %v, want source %v", hub.RemoteAddr(), src)
			}
		})
	}
}

// TestSharedUDPSocket dials several QUIC sessions over one UDPSocket: each
// carries its own streams, and closing the socket ends them all.
func TestSharedUDPSocket(t *testing.T) {
	l := startListener(t, nil)
	sock, err := ListenUDP("127.0.0.3:0")
	if err != nil {
		t.Fatal(err)
	}
	defer sock.Close()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	const n = 3
	var agents, hubs []Session
	for i := range n {
		d := &Dialer{TLSConfig: clientTLS(true), Transport: TransportQUIC, UDP: sock}
		a, err := d.Dial(ctx, l.Addr().String())
		if err != nil {
			t.Fatalf("dial %d on the shared socket: %v", i, err)
		}
		defer a.Close()
		h, err := l.Accept(ctx)
		if err != nil {
			t.Fatalf("accept %d: %v", i, err)
		}
		defer h.Close()
		if h.RemoteAddr().String() != sock.LocalAddr().String() {
			t.Errorf("session %d comes from %v, want the shared socket %v", i, h.RemoteAddr(), sock.LocalAddr())
		}
		agents, hubs = append(agents, a), append(hubs, h)
	}
	for i := range n {
		w, r := openPair(t, hubs[i], agents[i])
		msg := []byte{byte('a' + i)}
		if _, err := w.Write(msg); err != nil {
			t.Fatal(err)
		}
		_ = w.CloseWrite()
		got, err := io.ReadAll(r)
		if err != nil || string(got) != string(msg) {
			t.Fatalf("session %d: read %q, %v; want %q", i, got, err, msg)
		}
	}
	if err := sock.Close(); err != nil {
		t.Fatalf("close socket: %v", err)
	}
	for _, a := range agents {
		waitClosed(t, a.Done(), 5*time.Second, "agent session after closing its socket")
	}
}

func addrIP(a net.Addr) net.IP {
	switch a := a.(type) {
	case *net.TCPAddr:
		return a.IP
	case *net.UDPAddr:
		return a.IP
	}
	return nil
}
