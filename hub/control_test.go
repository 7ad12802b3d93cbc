package hub

import (
	"context"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// TestHeartbeatAnswered: the hub heartbeats an agent that takes heartbeats
// once at the welcome and then once per heartbeat the agent sends (no timer
// of its own), and never heartbeats an agent without the capability.
func TestHeartbeatAnswered(t *testing.T) {
	_, c := testHub(t)
	for _, tc := range []struct {
		name  string
		caps  []string
		beats int // heartbeats the agent sends
		want  int // heartbeats the hub sends back in all
	}{
		{"takes heartbeats", []string{control.CapHeartbeat}, 3, 4},
		{"no capability", nil, 3, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			name := "hb-" + map[bool]string{true: "cap", false: "nocap"}[tc.caps != nil]
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
