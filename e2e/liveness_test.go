package e2e

import (
	"syscall"
	"testing"
	"time"
)

// TestQUICAgentBackAfterHubKill: a QUIC agent whose liveness is the
// transport's comes back within a few keepalive intervals of its hub being
// killed -9 and restarted on the same address, not at its dead-peer
// timeout. Its keepalive PINGs are too small for the restarted hub to
// answer with a stateless reset; the heartbeat the agent sends once its
// keepalive went unanswered is not, and the reset ends the old session at
// once. Without that heartbeat the agent waited for its own silence limit
// (here 14.5 s).
func TestQUICAgentBackAfterHubKill(t *testing.T) {
	timing := []string{"--keepalive", "1s", "--dead-peer-timeout", "15s"}
	h := startHubIn(t, "", 0, timing...)
	startAgent(t, h.token(), "q1", append([]string{"--transport", "quic"}, timing...)...)
	h.waitOnline("q1", "quic")
	time.Sleep(3 * time.Second) // idle: keepalives only

	h.p.Stop(syscall.SIGKILL, stopWait)
	h.start()
	restarted := time.Now()
	// h.connects reads the restarted hub's own log.
	waitFor(t, "q1 connected to the restarted hub", 30*time.Second, func() bool { return h.connects("q1") > 0 })
	took := time.Since(restarted)
	t.Logf("q1 back %v after the restart", took.Round(100*time.Millisecond))
	if took > 8*time.Second {
		t.Errorf("q1 came back %v after its hub restarted; with 1 s keepalives it should take a few seconds, not its 15 s dead-peer timeout", took.Round(100*time.Millisecond))
	}
}
