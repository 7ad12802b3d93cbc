package hub

import (
	"context"
	"errors"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/internal/faultproxy"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/resume"
)

// echoPort serves an echo on a loopback port for the test's life.
func echoPort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { defer conn.Close(); _, _ = io.Copy(conn, conn) }()
		}
	}()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// nodeBehindLink runs an agent for a new node that reaches the hub through a
// fault link, with short keepalives (a cut ends its session within a
// second) and an echo port it allows; it returns the link, the port and
// the node's live connection (nil while it has none).
func nodeBehindLink(t *testing.T, s *Server, id *edge.Identity, transport tunnel.Transport,
	tun *tunnel.Config) (*faultproxy.Link, uint16, func() *nodeconn.Conn) {
	t.Helper()
	link, err := faultproxy.NewLink("127.0.0.1:0", id.Config.Hubs[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	id.Config.Hubs = []string{link.Addr()}
	port := echoPort(t)
	runAgent(t, context.Background(), edge.Config{Identity: id, Transport: transport,
		AllowPorts: []uint16{port}, Tunnel: tun, BackoffMin: 100 * time.Millisecond, BackoffMax: 200 * time.Millisecond})
	name := id.Config.Name
	conn := func() *nodeconn.Conn { cn, _ := s.conns.Get(name); return cn }
	waitFor(t, "the node online", func() bool { return conn() != nil })
	return link, port, conn
}

// linkCutTunnel ends a session whose link is cut within a second.
var linkCutTunnel = &tunnel.Config{KeepAliveInterval: 200 * time.Millisecond, IdleTimeout: 800 * time.Millisecond}

// TestStreamOutlivesTheLink: a stream the hub opened to a node keeps
// working across a cut of the node's link that ends the tunnel session
// (the fault proxy resets TCP and rebinds UDP), on both transports: the
// agent reconnects and re-attaches it, and what was written during the cut
// arrives. On a hub that does not keep streams (--resume-window 0) the same
// cut ends the stream, as for agents without resumable streams.
func TestStreamOutlivesTheLink(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transport tunnel.Transport
		window    time.Duration
	}{
		{"quic", tunnel.TransportQUIC, 0},
		{"tcp", tunnel.TransportTCP, 0},
		{"tcp without resuming", tunnel.TransportTCP, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, c := testHubConfig(t, func(cfg *Config) { cfg.ResumeWindow, cfg.Tunnel = tc.window, linkCutTunnel })
			link, port, conn := nodeBehindLink(t, s, joinNode(t, c, "flappy"), tc.transport, linkCutTunnel)
			first := conn()
			st, err := first.Dial(context.Background(), tunnel.Header{Service: tunnel.ServiceTCP, Port: port})
			if err != nil {
				t.Fatal(err)
			}
			defer st.Close()
			echo(t, st, "before the cut")

			writeDuringCut(t, link, st, first.Session, "the session")
			if err := link.Up(); err != nil {
				t.Fatal(err)
			}
			got, err := readAfterCut(st, 10*time.Second)
			if tc.window < 0 {
				if err == nil {
					t.Fatal("a stream outlived its session on a hub that does not keep streams")
				}
				return
			}
			if err != nil || got != duringCut {
				t.Fatalf("echo of what was written during the cut: %q, %v", got, err)
			}
			if conn() == first {
				t.Fatal("the stream works, but over the old session")
			}
			echo(t, st, "after the cut")
		})
	}
}

// TestResumeRefusedByAnotherHub: a stream whose node comes back to a hub
// that does not know it (a restarted hub, another replica) ends on the
// agent with the hub's reason; here the node's set is cleared as a removal
// would, and the agent's re-attach is refused.
func TestResumeRefusedByAnotherHub(t *testing.T) {
	s, c := testHubConfig(t, func(cfg *Config) { cfg.Tunnel = linkCutTunnel })
	link, port, conn := nodeBehindLink(t, s, joinNode(t, c, "forgotten"), tunnel.TransportTCP, linkCutTunnel)
	first := conn()
	st, err := first.Dial(context.Background(), tunnel.Header{Service: tunnel.ServiceTCP, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	echo(t, st, "before")
	if err := link.Down(); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the session to end", func() bool { return conn() == nil })
	// What a restarted hub would have: no stream of this node.
	s.conns.CloseNode(first.NodeID, "forgotten by the test")
	if err := link.Up(); err != nil {
		t.Fatal(err)
	}
	_ = st.SetReadDeadline(time.Now().Add(10 * time.Second))
	_, err = st.Read(make([]byte, 1))
	var ended *resume.EndedError
	if !errors.As(err, &ended) {
		t.Fatalf("read on the hub's side after the node's streams were dropped: %v", err)
	}
	waitFor(t, "the node back", func() bool { return conn() != nil })
}

func echo(t *testing.T, st tunnel.Stream, msg string) {
	t.Helper()
	_ = st.SetDeadline(time.Now().Add(10 * time.Second))
	defer st.SetDeadline(time.Time{})
	if _, err := st.Write([]byte(msg)); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	got := make([]byte, len(msg))
	if _, err := io.ReadFull(st, got); err != nil || string(got) != msg {
		t.Fatalf("echo of %q: %q, %v", msg, got, err)
	}
}

// TestServiceConnectOutlivesTheLink: a service tunnel's connection, which
// the consumer node's agent carries over a stream it opened itself, keeps
// working across a cut of the consumer's link that ends its tunnel session
// (both transports): the agent holds the consumer's local connection, and
// re-attaches the stream once it is back; what was written during the cut
// arrives. On a hub that does not keep streams (--resume-window 0) the same
// cut ends the connection.
func TestServiceConnectOutlivesTheLink(t *testing.T) {
	for _, tc := range []struct {
		name      string
		transport tunnel.Transport
		window    time.Duration
	}{
		{"quic", tunnel.TransportQUIC, 0},
		{"tcp", tunnel.TransportTCP, 0},
		{"tcp without resuming", tunnel.TransportTCP, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, c := testHubConfig(t, func(cfg *Config) { cfg.ResumeWindow, cfg.Tunnel = tc.window, linkCutTunnel })
			_, port, _ := nodeBehindLink(t, s, joinNode(t, c, "provider"), tunnel.TransportTCP, linkCutTunnel)
			link, _, conn := nodeBehindLink(t, s, joinNode(t, c, "consumer"), tc.transport, linkCutTunnel)
			ctx := context.Background()
			if _, err := c.ExposeService(ctx, apitype.ServiceExposeRequest{Name: "echo", Target: "provider",
				Port: port}); err != nil {
				t.Fatal(err)
			}
			local := freeLoopbackPort(t)
			if _, err := c.ConnectService(ctx, "echo", apitype.ServiceConnectRequest{Consumer: "consumer",
				LocalPort: local}); err != nil {
				t.Fatal(err)
			}
			addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(int(local)))
			var lc net.Conn
			waitFor(t, "the consumer's service listener", func() bool {
				var err error
				lc, err = net.DialTimeout("tcp", addr, time.Second)
				return err == nil
			})
			defer lc.Close()
			st := lc.(*net.TCPConn)
			echo(t, st, "before the cut")

			first := conn()
			writeDuringCut(t, link, st, first.Session, "the consumer's session")
			if err := link.Up(); err != nil {
				t.Fatal(err)
			}
			got, err := readAfterCut(st, 10*time.Second)
			if tc.window < 0 {
				if err == nil {
					t.Fatal("a service connection outlived its session on a hub that does not keep streams")
				}
				return
			}
			if err != nil || got != duringCut {
				t.Fatalf("echo of what was written during the cut: %q, %v", got, err)
			}
			waitFor(t, "the consumer back", func() bool { cn := conn(); return cn != nil && cn != first })
			echo(t, st, "after the cut")
		})
	}
}

// freeLoopbackPort is a TCP port on 127.0.0.1 that was free a moment ago.
func freeLoopbackPort(t *testing.T) uint16 {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return uint16(ln.Addr().(*net.TCPAddr).Port)
}

// duringCut is what the link-cut tests write while the link is down.
const duringCut = "during the cut"

// writeDuringCut takes link down, writes duringCut on st (kept until the
// far end is back) and waits for the session that carried st to end
// (sess, named what).
func writeDuringCut(t *testing.T, link *faultproxy.Link, st io.Writer, sess tunnel.Session, what string) {
	t.Helper()
	if err := link.Down(); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Write([]byte(duringCut)); err != nil {
		t.Fatalf("write during the cut: %v", err)
	}
	waitFor(t, what+" to end", func() bool {
		select {
		case <-sess.Done():
			return true
		default:
			return false
		}
	})
}

// readAfterCut reads the echo of duringCut on st within d.
func readAfterCut(st net.Conn, d time.Duration) (string, error) {
	_ = st.SetReadDeadline(time.Now().Add(d))
	got := make([]byte, len(duringCut))
	_, err := io.ReadFull(st, got)
	return string(got), err
}
