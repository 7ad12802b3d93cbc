package e2e

import (
	"fmt"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/faultproxy"
)

// TestFaultStalledPeer is fault 2: the link stops forwarding without
// closing anything — both ways (a stalled peer), or one way only (a
// half-open connection). On each transport, both the hub and the agent
// notice within the configured dead-peer timeout, and the agent comes back
// once the link does.
func TestFaultStalledPeer(t *testing.T) {
	t.Parallel()
	const deadPeer = 4 * time.Second
	// Detection happens between deadPeer-keepalive and deadPeer after the
	// last packet; the slack covers scheduling on a loaded machine and the
	// log poll.
	const slack = 2500 * time.Millisecond
	link, hubPort := newLink(t)
	tuning := []string{"--keepalive", "1s", "--dead-peer-timeout", deadPeer.String()}
	h := startHubArgs(t, hubPort, append([]string{"--advertise", link.Addr()}, tuning...)...)
	join := h.token("--uses", "2")
	nodes := map[string]string{"stall-quic": "quic", "stall-tcp": "tcp"}
	agents := map[string]*proc{}
	for name, tr := range nodes {
		agents[name], _ = startAgent(t, join, name, append([]string{"--ssh", "embedded", "--transport", tr}, tuning...)...)
	}
	rounds := soakOr(1, 5)
	for round := range rounds {
		for _, dir := range []faultproxy.Direction{faultproxy.Both, faultproxy.Downstream, faultproxy.Upstream} {
			for name, tr := range nodes {
				h.waitOnline(name, tr)
			}
			hubLog := h.p.Log()
			hubBefore, agentBefore := map[string]int{}, map[string]int{}
			for name, a := range agents {
				hubBefore[name] = logCount(hubLog, "node disconnected", name)
				agentBefore[name] = logCount(a.Log(), "hub connection lost; retrying", name)
			}
			if err := link.Stall(dir); err != nil {
				t.Fatal(err)
			}
			stalledAt := time.Now()
			hubSaw, agentSaw := map[string]time.Duration{}, map[string]time.Duration{}
			for time.Since(stalledAt) < deadPeer+slack+5*time.Second && (len(hubSaw) < 2 || len(agentSaw) < 2) {
				hubLog := h.p.Log()
				for name, a := range agents {
					if _, ok := hubSaw[name]; !ok && logCount(hubLog, "node disconnected", name) > hubBefore[name] {
						hubSaw[name] = time.Since(stalledAt)
					}
					if _, ok := agentSaw[name]; !ok && logCount(a.Log(), "hub connection lost; retrying", name) > agentBefore[name] {
						agentSaw[name] = time.Since(stalledAt)
					}
				}
				time.Sleep(50 * time.Millisecond)
			}
			for name := range nodes {
				hd, hok := hubSaw[name]
				ad, aok := agentSaw[name]
				t.Logf("round %d, stall %s: %s noticed by the hub after %s, by the agent after %s", round, dir, name,
					fmtSeen(hd, hok), fmtSeen(ad, aok))
				if !hok || !aok || hd > deadPeer+slack || ad > deadPeer+slack {
					t.Errorf("stall %s on %s: not noticed on both sides within %s + %s", dir, name, deadPeer, slack)
				}
			}
			// The link comes back (its stalled connections reset): the
			// agents reconnect by themselves.
			if err := link.Up(); err != nil {
				t.Fatal(err)
			}
		}
	}
	for name, tr := range nodes {
		h.waitOnline(name, tr)
	}
}

func fmtSeen(d time.Duration, ok bool) string {
	if !ok {
		return "never"
	}
	return fmt.Sprint(d.Round(10 * time.Millisecond))
}
