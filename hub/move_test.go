package hub

import (
	"context"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/internal/faultproxy"
	"github.com/tether-dev/tether/tunnel"
)

// TestMoveFromTCPToQUIC: an agent that fell back to TCP because UDP was
// blocked (the fault proxy drops every datagram) re-probes QUIC and, once
// UDP gets through, moves to it: a TCP stream opened before the move keeps
// working, new streams go over QUIC and the node stays registered
// throughout. The stream moves with the agent (resumable streams): the TCP
// session ends at once. On a hub that does not keep streams across
// reconnects (--resume-window 0), the TCP session drains instead: it ends
// once its last stream has.
func TestMoveFromTCPToQUIC(t *testing.T) {
	t.Run("streams move", func(t *testing.T) { testMove(t, true) })
	t.Run("streams drain", func(t *testing.T) { testMove(t, false) })
}

func testMove(t *testing.T, resumable bool) {
	s, c := testHubConfig(t, func(cfg *Config) {
		if !resumable {
			cfg.ResumeWindow = -1
		}
	})
	id := joinNode(t, c, "mover")
	link, err := faultproxy.NewLink("127.0.0.1:0", id.Config.Hubs[0])
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = link.Close() })
	if err := link.UDP.SetFaults(faultproxy.Both, faultproxy.Faults{Loss: 1}); err != nil {
		t.Fatal(err)
	}
	id.Config.Hubs = []string{link.Addr()}

	port := echoPort(t)

	var mu sync.Mutex
	var why []string
	runAgent(t, context.Background(), edge.Config{
		Identity: id, Transport: tunnel.TransportAuto, AllowPorts: []uint16{port},
		ReprobeMin: 200 * time.Millisecond, ReprobeMax: 400 * time.Millisecond,
		OnStatus: func(st edge.Status) {
			mu.Lock()
			why = append(why, st.Transport+" ("+st.TransportWhy+")")
			mu.Unlock()
		},
	})

	conn := func() *nodeconn.Conn {
		cn, _ := s.conns.Get("mover")
		return cn
	}
	on := func(tr tunnel.Transport) func() bool {
		return func() bool { cn := conn(); return cn != nil && cn.Session.Transport() == tr }
	}
	waitFor(t, "the agent on its tcp fallback", on(tunnel.TransportTCP))
	waitFor(t, "tether nodes to show the fallback", func() bool {
		nodes, err := c.ListNodes(context.Background())
		return err == nil && len(nodes) == 1 && nodes[0].Transport == "tcp (udp blocked, re-probing)"
	})
	tcpConn := conn()
	roundTrip := func(st tunnel.Stream, msg string) {
		t.Helper()
		_ = st.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := st.Write([]byte(msg)); err != nil {
			t.Fatalf("write %q: %v", msg, err)
		}
		got := make([]byte, len(msg))
		if _, err := io.ReadFull(st, got); err != nil || string(got) != msg {
			t.Fatalf("echo of %q: %q, %v", msg, got, err)
		}
	}
	old, err := tcpConn.Dial(context.Background(), tunnel.Header{Service: tunnel.ServiceTCP, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	defer old.Close()
	roundTrip(old, "before the move")

	if err := link.UDP.SetFaults(faultproxy.Both, faultproxy.Faults{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the agent moved to quic", on(tunnel.TransportQUIC))
	tcpDone := func() bool {
		select {
		case <-tcpConn.Session.Done():
			return true
		default:
			return false
		}
	}
	if resumable {
		waitFor(t, "the tcp session to end, its stream carried over", tcpDone)
	} else if tcpDone() {
		t.Fatal("the tcp session ended with a stream still open on it")
	}
	// The stream lives on well past the hub's grace for closing a
	// replaced session (a second): the old session drains, not closes.
	for until := time.Now().Add(3 * time.Second); time.Now().Before(until); time.Sleep(100 * time.Millisecond) {
		roundTrip(old, "after the move, same stream")
	}

	st, err := conn().Dial(context.Background(), tunnel.Header{Service: tunnel.ServiceTCP, Port: port})
	if err != nil {
		t.Fatal(err)
	}
	roundTrip(st, "a new stream")
	st.Close()
	if cn := conn(); cn == tcpConn || cn.Session.Transport() != tunnel.TransportQUIC {
		t.Fatal("new streams do not go over the quic session")
	}

	old.Close()
	waitFor(t, "the drained tcp session to end", tcpDone)
	if conn() == nil {
		t.Fatal("the node is no longer registered after its old session ended")
	}
	waitFor(t, "tether nodes to show the move", func() bool {
		nodes, err := c.ListNodes(context.Background())
		return err == nil && len(nodes) == 1 && strings.HasPrefix(nodes[0].Transport, "quic (moved from tcp ")
	})
	mu.Lock()
	defer mu.Unlock()
	joined := strings.Join(why, "; ")
	if !strings.Contains(joined, "tcp (udp blocked, re-probing)") || !strings.Contains(joined, "quic (moved from tcp ") {
		t.Errorf("status transport and why: %s", joined)
	}
}
