package hub

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// TestHeartbeatAnswered: the hub heartbeats an agent that takes heartbeats
// once at the welcome and then once per heartbeat the agent sends (no timer
// of its own), and never heartbeats an agent without the capability, nor
// one whose liveness is the transport's. Every welcome offers the latter.
func TestHeartbeatAnswered(t *testing.T) {
	_, c := testHub(t)
	for i, tc := range []struct {
		name  string
		caps  []string
		beats int // heartbeats the agent sends
		want  int // heartbeats the hub sends back in all
	}{
		{"takes heartbeats", []string{control.CapHeartbeat}, 3, 4},
		{"no capability", nil, 3, 0},
		{"transport liveness", []string{control.CapHeartbeat, control.CapTransportLiveness}, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := fmt.Sprintf("hb-%d", i)
			id := joinNode(t, c, name)
			sess := dialAs(t, id, tunnel.TransportTCP)
			ctrl, err := sess.OpenStream(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			h := hello(name)
			h.Hello.Capabilities = tc.caps
			if err := control.Write(ctrl, h); err != nil {
				t.Fatal(err)
			}
			if m, err := control.Read(ctrl); err != nil || m.Type != control.TypeWelcome {
				t.Fatalf("welcome: %v %v", m, err)
			} else if !slices.Contains(m.Welcome.Capabilities, control.HubCapTransportLiveness) {
				t.Errorf("welcome capabilities %q lack %q", m.Welcome.Capabilities, control.HubCapTransportLiveness)
			}
			for range tc.beats {
				if err := control.Write(ctrl, &control.Message{Type: control.TypeHeartbeat}); err != nil {
					t.Fatal(err)
				}
			}
			// Access pushes arrive in between; only heartbeats count.
			got := 0
			_ = ctrl.SetReadDeadline(time.Now().Add(10 * time.Second))
			for got < tc.want {
				m, err := control.Read(ctrl)
				if err != nil {
					t.Fatalf("after %d heartbeats from the hub: %v", got, err)
				}
				if m.Type == control.TypeHeartbeat {
					got++
				}
			}
			if tc.want == 0 {
				// Nothing may come: read until the deadline passes.
				_ = ctrl.SetReadDeadline(time.Now().Add(500 * time.Millisecond))
				for {
					m, err := control.Read(ctrl)
					if err != nil {
						break
					}
					if m.Type == control.TypeHeartbeat {
						t.Fatal("hub heartbeat to an agent that does not take them")
					}
				}
			}
		})
	}
}

// TestTransportLivenessSession: on a hub with a 3 s dead-peer timeout, an
// agent whose liveness is the transport's sends nothing on its control
// stream and keeps its session for many timeouts, shown heard (the presence
// sweep follows its keepalives); an agent that promised heartbeats and
// sends none is closed within the timeout, as before. Both transports.
func TestTransportLivenessSession(t *testing.T) {
	cfg := &tunnel.Config{KeepAliveInterval: time.Second, IdleTimeout: 3 * time.Second}
	s, c := testHubConfig(t, func(c *Config) { c.Tunnel = cfg })
	for i, tr := range []tunnel.Transport{tunnel.TransportQUIC, tunnel.TransportTCP} {
		t.Run(tr.String(), func(t *testing.T) {
			t.Parallel()
			live, silent := fmt.Sprintf("live-%d", i), fmt.Sprintf("silent-%d", i)
			connect := func(name string, caps ...string) tunnel.Session {
				id := joinNode(t, c, name)
				d := &tunnel.Dialer{TLSConfig: pki.ClientTLSConfig(id.Cert, id.CA), Transport: tr, Config: cfg}
				sess, err := d.Dial(t.Context(), id.Config.Hubs[0])
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(func() { sess.Close() })
				ctrl, err := sess.OpenStream(t.Context())
				if err != nil {
					t.Fatal(err)
				}
				h := hello(name)
				h.Hello.Capabilities = caps
				if err := control.Write(ctrl, h); err != nil {
					t.Fatal(err)
				}
				go func() { // read (and drop) the welcome and the pushes
					for {
						if _, err := control.Read(ctrl); err != nil {
							return
						}
					}
				}()
				return sess
			}
			liveSess := connect(live, control.CapHeartbeat, control.CapTransportLiveness)
			silentSess := connect(silent, control.CapHeartbeat)

			waitDone(t, silentSess, "an agent that promised heartbeats sent none")
			var heard int64
			waitFor(t, live+" registered", func() bool {
				conn, ok := s.conns.Get(live)
				if ok {
					heard = conn.Heard.Load()
				}
				return ok
			})
			time.Sleep(3 * cfg.IdleTimeout)
			select {
			case <-liveSess.Done():
				t.Fatalf(
					"the hub closed a transport-liveness session with no heartbeats after %v; its dead-peer timeout is %v",
					3*cfg.IdleTimeout,
					cfg.IdleTimeout,
				)
			default:
			}
			conn, ok := s.conns.Get(live)
			if !ok || !conn.TransportLive {
				t.Fatalf("%s: registered %v, TransportLive %v", live, ok, ok && conn.TransportLive)
			}
			if got := time.Since(time.Unix(0, conn.Heard.Load())); conn.Heard.Load() <= heard || got > 2*time.Second {
				t.Errorf(
					"%s last heard %v ago (at connect: %d, now %d): the presence sweep does not follow its keepalives",
					live,
					got.Round(time.Millisecond),
					heard,
					conn.Heard.Load(),
				)
			}
		})
	}
}

// TestAgentOnLongerKeepaliveHeard: under a hub at 1 s keepalives, an agent
// left at the default settings (it would ping after 7.5 s on QUIC, 25 s on
// TCP) heartbeats at the hub's interval instead, so the hub hears it every
// second or so and the console does not call a live node stale between its
// pings (stale after two intervals). Counted, not timed: a window of 6 s
// must see at least 3 fresh marks; the agent's own keepalives would give at
// most one.
func TestAgentOnLongerKeepaliveHeard(t *testing.T) {
	s, c := testHubConfig(t, func(c *Config) {
		c.Tunnel = &tunnel.Config{KeepAliveInterval: time.Second, IdleTimeout: 15 * time.Second}
	})
	for i, tr := range []tunnel.Transport{tunnel.TransportQUIC, tunnel.TransportTCP} {
		t.Run(tr.String(), func(t *testing.T) {
			t.Parallel()
			name := fmt.Sprintf("slow-%d", i)
			runAgent(t, context.Background(), edge.Config{Identity: joinNode(t, c, name), Transport: tr})
			waitFor(t, name+" registered", func() bool { _, ok := s.conns.Get(name); return ok })
			time.Sleep(time.Second) // the admission's own traffic out of the window
			conn, _ := s.conns.Get(name)
			if !conn.TransportLive {
				t.Fatalf("%s: not a transport-liveness session", name)
			}
			marks, last := 0, conn.Heard.Load()
			for end := time.Now().Add(6 * time.Second); time.Now().Before(end); time.Sleep(100 * time.Millisecond) {
				if h := conn.Heard.Load(); h != last {
					marks, last = marks+1, h
				}
			}
			if marks < 3 {
				t.Errorf("%s: heard %d times in 6 s under a hub at 1 s keepalives; want at least 3", name, marks)
			}
		})
	}
}
