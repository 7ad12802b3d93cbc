package control

import (
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

func TestLiveness(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name string
		c    *tunnel.Config
		want Liveness
	}{
		{"defaults", nil, Liveness{Every: 20 * s, Deadline: 50 * s, HubIdle: 60 * s}},
		{"zero fields are defaults", &tunnel.Config{}, Liveness{Every: 20 * s, Deadline: 50 * s, HubIdle: 60 * s}},
		{
			"the earlier defaults",
			&tunnel.Config{KeepAliveInterval: 5 * s, IdleTimeout: 15 * s},
			Liveness{Every: 5 * s, Deadline: 12500 * time.Millisecond, HubIdle: 15 * s},
		},
		{
			"fast test links",
			&tunnel.Config{KeepAliveInterval: 200 * time.Millisecond, IdleTimeout: time.Second},
			Liveness{Every: s, Deadline: 2 * s, HubIdle: s},
		},
		{
			"whole seconds",
			&tunnel.Config{KeepAliveInterval: 2500 * time.Millisecond, IdleTimeout: 10 * s},
			Liveness{Every: 2 * s, Deadline: 9 * s, HubIdle: 10 * s},
		},
		{
			"two beats at least",
			&tunnel.Config{KeepAliveInterval: 10 * s, IdleTimeout: 12 * s},
			Liveness{Every: 10 * s, Deadline: 20 * s, HubIdle: 12 * s},
		},
	} {
		if got := LivenessOf(tc.c); got != tc.want {
			t.Errorf("%s: LivenessOf = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

func TestAgentLiveness(t *testing.T) {
	s := time.Second
	for _, tc := range []struct {
		name string
		c    *tunnel.Config
		w    *Welcome
		want Liveness
	}{
		{"hub's interval, own idle timeout", nil, &Welcome{HeartbeatSeconds: 20}, Liveness{Every: 20 * s, Deadline: 50 * s}},
		{
			"a hub on the earlier 5s interval",
			nil,
			&Welcome{HeartbeatSeconds: 5},
			Liveness{Every: 5 * s, Deadline: 57500 * time.Millisecond},
		},
		{
			"hub beats slower than our idle timeout",
			&tunnel.Config{IdleTimeout: 3 * s},
			&Welcome{HeartbeatSeconds: 5},
			Liveness{Every: 5 * s, Deadline: 10 * s},
		},
		{
			"no interval in the welcome",
			&tunnel.Config{IdleTimeout: s},
			&Welcome{},
			Liveness{Every: DefaultHeartbeat, Deadline: 2 * s},
		},
		{"no welcome", nil, nil, Liveness{Every: DefaultHeartbeat, Deadline: 60 * s}},
		{
			"a hub that takes transport liveness",
			nil,
			&Welcome{
				HeartbeatSeconds: 20,
				DeadPeerSeconds:  60,
				Capabilities:     []string{HubCapSSHEvents, HubCapTransportLiveness},
			},
			Liveness{Every: 20 * s, Deadline: 50 * s, Transport: true, HubIdle: 60 * s},
		},
		{
			"a hub that says its dead-peer timeout",
			nil,
			&Welcome{HeartbeatSeconds: 5, DeadPeerSeconds: 15},
			Liveness{Every: 5 * s, Deadline: 57500 * time.Millisecond, HubIdle: 15 * s},
		},
		{
			"a hub without it",
			nil,
			&Welcome{HeartbeatSeconds: 20, Capabilities: []string{HubCapSSHEvents}},
			Liveness{Every: 20 * s, Deadline: 50 * s},
		},
	} {
		if got := AgentLiveness(tc.c, tc.w); got != tc.want {
			t.Errorf("%s: AgentLiveness = %+v, want %+v", tc.name, got, tc.want)
		}
	}
}

// The hub's and the agent's sides of one session agree when configured
// alike: the agent gives the hub the same time the hub gives the agent.
func TestLivenessSidesAgree(t *testing.T) {
	for _, c := range []*tunnel.Config{
		nil,
		{KeepAliveInterval: time.Second, IdleTimeout: 3 * time.Second},
		{KeepAliveInterval: 7 * time.Second, IdleTimeout: 9 * time.Second},
	} {
		hub := LivenessOf(c)
		agent := AgentLiveness(c, hub.Welcome("id", "n1"))
		if hub != agent {
			t.Errorf("config %+v: hub %+v, agent %+v", c, hub, agent)
		}
	}
}

// TestAgentHeartbeats: an agent heartbeats when the hub does not take
// transport liveness, or when its own keepalive would leave the hub
// without a word for longer than a quarter past the hub's interval; on the
// hub's settings, or faster ones, it sends none.
func TestAgentHeartbeats(t *testing.T) {
	s := time.Second
	fast := &tunnel.Config{KeepAliveInterval: s, IdleTimeout: 15 * s}
	earlier := &tunnel.Config{KeepAliveInterval: 5 * s, IdleTimeout: 15 * s}
	quic, tcp := tunnel.TransportQUIC, tunnel.TransportTCP
	for _, tc := range []struct {
		name       string
		agent, hub *tunnel.Config
		t          tunnel.Transport
		transport  bool // the welcome lists transport liveness
		want       bool
	}{
		{"defaults, quic", nil, nil, quic, true, false},
		{"defaults, tcp", nil, nil, tcp, true, false},
		{"a hub without transport liveness", nil, nil, quic, false, true},
		{"default agent under a 1 s hub, quic (pings after 7.5 s)", nil, fast, quic, true, true},
		{"default agent under a 1 s hub, tcp (pings after 25 s)", nil, fast, tcp, true, true},
		{"agent on the hub's 1 s settings, quic", fast, fast, quic, true, false},
		{"agent on the hub's 1 s settings, tcp", fast, fast, tcp, true, false},
		{"default agent under the earlier 5 s hub", nil, earlier, quic, true, true},
		{"a faster agent under a default hub", earlier, nil, quic, true, false},
		{"a faster agent under a default hub, tcp", earlier, nil, tcp, true, false},
		// The welcome's interval is whole seconds: 2 s for a hub at 2.5 s,
		// which then expects an agent on its settings sooner than it pings.
		{
			"whole seconds",
			&tunnel.Config{KeepAliveInterval: 2500 * time.Millisecond, IdleTimeout: 10 * s},
			&tunnel.Config{KeepAliveInterval: 2500 * time.Millisecond, IdleTimeout: 10 * s},
			tcp,
			true,
			true,
		},
	} {
		w := LivenessOf(tc.hub).Welcome("id", "n1")
		if tc.transport {
			w.Capabilities = []string{HubCapTransportLiveness}
		}
		live := AgentLiveness(tc.agent, w)
		if got := live.AgentHeartbeats(tc.agent.PingAfter(tc.t, live.HubIdle)); got != tc.want {
			t.Errorf("%s: AgentHeartbeats = %v, want %v", tc.name, got, tc.want)
		}
	}
}
