package e2e

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strconv"
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

// pokedLog is how the agent's session ends when its restarted hub pokes it.
const pokedLog = "the hub no longer holds this session (it restarted or died)"

// TestQUICAgentBackAfterHubKill: a QUIC agent at the default settings is
// back within 3 s of its hub being killed -9 and restarted on the same
// address. The restarted hub pokes the agents of its previous run's QUIC
// sessions (it wrote down their addresses and tokens in its data dir), and
// the agent, whose session the poke names, reconnects at once. Before, the
// agent learned of the restart only when its keepalive was due, 25 s later
// at the defaults. While the hub lists the node offline, `tether-edge
// status` never says connected on the strength of the session that died
// with the hub. While the hub answers, the agent sends no heartbeat.
//
// TETHER_HUB_KILLS=N restarts the hub N times and logs the distribution.
func TestQUICAgentBackAfterHubKill(t *testing.T) {
	kills := 3
	if n, err := strconv.Atoi(os.Getenv("TETHER_HUB_KILLS")); err == nil && n > 0 {
		kills = n
	}
	h := startHubIn(t, "", 0)
	agent, stateDir := startAgent(t, h.token(), "q1", "--transport", "quic", "--log-level", "debug")
	h.waitOnline("q1", "quic")
	var backs []time.Duration
	for i := range kills {
		// Idle at first; later kills come 0.3 s after the agent is back, as
		// in a crash loop: the hub writes its file down within 0.2 s of a
		// change, so the restarted hub pokes the new session too.
		if i == 0 {
			time.Sleep(2 * time.Second)
		} else {
			time.Sleep(300 * time.Millisecond)
		}
		if strings.Contains(agent.Log(), nudgeLog) {
			t.Fatalf("q1 sent a heartbeat while its hub answered its keepalives:\n%s", agent.Tail(2000))
		}
		pokedBefore := strings.Count(agent.Log(), pokedLog)
		killed := time.Now()
		h.p.Stop(syscall.SIGKILL, stopWait)
		h.start()
		restarted := time.Now()
		// Until q1 is back: whenever the hub lists it offline, the agent's
		// status must not be that of the session that died with the hub.
		for h.connects("q1") == 0 {
			if time.Since(restarted) > 40*time.Second {
				t.Fatalf("kill %d: q1 not back %v after the restart:\n%s", i, time.Since(restarted), agent.Tail(3000))
			}
			if n, ok := h.nodes()["q1"]; ok && !n.Online && h.connects("q1") == 0 {
				if st := edgeStatus(t, stateDir); st.State == "connected" && st.Since.Before(killed) {
					t.Fatalf("kill %d: the hub lists q1 offline, and tether-edge status says connected since %v, "+
						"before the hub was killed", i, st.Since)
				}
			}
		}
		back, fromKill := time.Since(restarted), time.Since(killed)
		backs = append(backs, back)
		t.Logf("kill %d: q1 back %v after the restart (%v after the kill)", i, back.Round(10*time.Millisecond),
			fromKill.Round(10*time.Millisecond))
		if strings.Count(agent.Log(), pokedLog) == pokedBefore {
			t.Errorf("kill %d: q1's old session did not end by its hub's poke:\n%s", i, agent.Tail(2000))
		}
		if back > 3*time.Second {
			t.Errorf("kill %d: q1 back %v after its hub restarted, want within 3s", i, back.Round(10*time.Millisecond))
		}
		h.waitOnline("q1", "quic")
	}
	slices.Sort(backs)
	t.Logf("back after the restart over %d kills: median %v, max %v", len(backs),
		backs[len(backs)/2].Round(10*time.Millisecond), backs[len(backs)-1].Round(10*time.Millisecond))
}

// TestQUICAgentBackAfterHubKillUnpoked: when the restarted hub has no
// record of its previous run's agents (the file of their addresses is
// gone), a QUIC agent whose liveness is the transport's still comes back
// soon, not at its dead-peer timeout. Its keepalive PINGs are too small
// for the restarted hub to answer with a stateless reset; the heartbeat
// the agent sends once its keepalive went unanswered is not, and the reset
// ends the old session at once (a keepalive that also carries an
// acknowledgement is sometimes large enough itself).
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
func TestQUICAgentBackAfterHubKillUnpoked(t *testing.T) {
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
			t.Parallel() // mostly idle waits, each on a hub of its own
			h := startHubIn(t, "", 0, tc.hubArgs...)
			agent, _ := startAgent(t, h.token(), "q1",
				append([]string{"--transport", "quic", "--log-level", "debug"}, tc.agentArgs...)...)
			h.waitOnline("q1", "quic")
			time.Sleep(10 * time.Second) // idle: keepalives only, answered
			if strings.Contains(agent.Log(), nudgeLog) {
				t.Fatalf("q1 sent a heartbeat while its hub answered its keepalives:\n%s", agent.Tail(2000))
			}

			h.p.Stop(syscall.SIGKILL, stopWait)
			if err := os.Remove(filepath.Join(h.dataDir, "quic_peers")); err != nil {
				t.Fatalf("the hub wrote down no QUIC agents: %v", err)
			}
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

// edgeStatus is what `tether-edge status -o json` says for stateDir.
func edgeStatus(t *testing.T, stateDir string) (st struct {
	State string    `json:"state"`
	Since time.Time `json:"since"`
}) {
	t.Helper()
	out, errOut, code := runCmd(t, 10*time.Second, filepath.Join(binDir, "tether-edge"), "status", "-o", "json",
		"--state-dir", stateDir)
	if code != 0 {
		t.Fatalf("tether-edge status: exit %d: %s", code, errOut)
	}
	if err := json.Unmarshal([]byte(out), &st); err != nil {
		t.Fatalf("tether-edge status -o json: %v: %s", err, out)
	}
	return st
}
