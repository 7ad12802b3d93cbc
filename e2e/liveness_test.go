package e2e

import (
	"strings"
	"syscall"
	"testing"
	"time"
)

// nudgeLog is what the agent logs (at debug) when it heartbeats a silent hub.
const nudgeLog = "hub silent past its keepalive"

// statelessReset is how quic-go words the end of a session by a stateless
// reset, as the agent logs it.
const statelessReset = "received a stateless reset"

// TestQUICAgentBackAfterHubKill: a QUIC agent whose liveness is the
// transport's comes back soon after its hub is killed -9 and restarted on
// the same address, not at its dead-peer timeout. Its keepalive PINGs are
// too small for the restarted hub to answer with a stateless reset; the
// heartbeat the agent sends once its keepalive went unanswered is not, and
// the reset ends the old session at once (a keepalive that also carries an
// acknowledgement is sometimes large enough itself). While the hub
// answers, the agent sends no heartbeat.
//
//   - alike: hub and agent at 1 s / 15 s. Without the heartbeat the agent
//     waited for its own silence limit (14.3 s).
//   - agent at the defaults under a hub at 10 s / 15 s: QUIC takes the hub's
//     shorter idle timeout, so the agent pings after 7.5 s, not 25 s; it
//     learns the hub's timeout from the welcome and heartbeats once that
//     ping goes unanswered, before QUIC's idle timeout (15 s) would end the
//     session silently.
//   - agent at the defaults under a hub at 1 s / 15 s: its 7.5 s pings come
//     later than that hub expects to hear it, so it heartbeats every second
//     (control.Liveness.AgentHeartbeats), and the first heartbeat after
//     the restart draws the reset.
func TestQUICAgentBackAfterHubKill(t *testing.T) {
	fast := []string{"--keepalive", "1s", "--dead-peer-timeout", "15s"}
	for _, tc := range []struct {
		name      string
		hubArgs   []string
		agentArgs []string
		within    time.Duration // from the restart
	}{
		{"alike", fast, fast, 8 * time.Second},
		{"agent at the defaults, hub at 10s", []string{"--keepalive", "10s", "--dead-peer-timeout", "15s"}, nil,
			12 * time.Second},
		{"agent at the defaults, hub at 1s", fast, nil, 5 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := startHubIn(t, "", 0, tc.hubArgs...)
			agent, _ := startAgent(t, h.token(), "q1",
				append([]string{"--transport", "quic", "--log-level", "debug"}, tc.agentArgs...)...)
			h.waitOnline("q1", "quic")
			time.Sleep(10 * time.Second) // idle: keepalives only, answered
			if strings.Contains(agent.Log(), nudgeLog) {
				t.Fatalf("q1 sent a heartbeat while its hub answered its keepalives:\n%s", agent.Tail(2000))
			}

			h.p.Stop(syscall.SIGKILL, stopWait)
			h.start()
			restarted := time.Now()
			// h.connects reads the restarted hub's own log.
			waitFor(t, "q1 connected to the restarted hub", 30*time.Second, func() bool { return h.connects("q1") > 0 })
			took := time.Since(restarted)
			t.Logf("q1 back %v after the restart", took.Round(100*time.Millisecond))
			// The old session must end by the restarted hub's stateless reset,
			// not by a timeout. Usually the heartbeat draws it; a keepalive
			// that carries an acknowledgement too is large enough on its own.
			if !strings.Contains(agent.Log(), statelessReset) {
				t.Errorf("q1's old session did not end by the restarted hub's stateless reset (it timed out):\n%s",
					agent.Tail(2000))
			}
			if took > tc.within {
				t.Errorf("q1 came back %v after its hub restarted, want within %v: the agent waited for a timeout "+
					"instead of drawing a stateless reset", took.Round(100*time.Millisecond), tc.within)
			}
		})
	}
}
