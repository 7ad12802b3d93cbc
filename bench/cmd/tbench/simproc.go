package main

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/tunnel"
)

// simProcess is a share of P4's fleet run by an `agentsim run` child
// process, for the steps beyond this process's open-files limit: the
// limit is per process, so each child gives its agents a UDP socket of
// their own, as in a real fleet. (Agents sharing sockets look like one
// agent to the hub's QUIC refusals, and one process holding 50,000 agents
// spent half its CPU collecting its heap: a 50,000 step stalled at
// ~10,800 agents that way, where children of 17,000 came up without a
// stall; bench/RESULTS.md, "issue 18 (67k)".)
type simProcess struct {
	*harness.Proc
}

// simProcessRamp is how many agents a second a child starts: at 250 the
// hub and four children on two cores brought 17,000 up in 90 s each.
const simProcessRamp = 250

// startSimProcess starts agentsim (in bin) running fleet members
// [from, from+n) from the fleet file against hub, its output in env's
// scratch directory.
func startSimProcess(
	env *harness.Env, bin, fleetPath, hub string, tr tunnel.Transport, from, n int,
) (*simProcess, error) {
	args := []string{"run", "-fleet", fleetPath, "-from", strconv.Itoa(from), "-n", strconv.Itoa(n), "-hub", hub,
		"-transport", tr.String(), "-per-socket", "0", "-ramp", strconv.Itoa(simProcessRamp), "-report", "1s",
		"-duration", "24h"}
	if *p4KeepAlive > 0 {
		args = append(args, "-keepalive", p4KeepAlive.String(), "-dead-peer-timeout", (3 * *p4KeepAlive).String())
	}
	p, err := env.Start(fmt.Sprintf("agentsim-%s-%d", tr, from), filepath.Join(bin, "agentsim"), args...)
	if err != nil {
		return nil, fmt.Errorf("start agentsim for fleet members %d-%d: %w", from, from+n-1, err)
	}
	return &simProcess{p}, nil
}

// Connected is the child's connected count as of its last report (a
// second old at most).
func (p *simProcess) Connected() int {
	lines := strings.Split(strings.TrimSpace(p.Tail(400)), "\n")
	for i := len(lines) - 1; i >= 0; i-- {
		if c, ok := connectedCount(lines[i]); ok {
			return c
		}
	}
	return 0
}

// connectedCount reads the connected count from an agentsim progress line
// ("  12s connected 1234/17000, failed attempts …").
func connectedCount(line string) (int, bool) {
	var secs float64
	var c, n int
	if _, err := fmt.Sscanf(line, "%fs connected %d/%d", &secs, &c, &n); err != nil {
		return 0, false
	}
	return c, true
}

// RSS is the child's resident memory.
func (p *simProcess) RSS() int64 {
	st, err := harness.Stats(p.PID())
	if err != nil {
		return 0
	}
	return st.RSS
}

// childShares splits fleet members [from, to) into consecutive shares of
// at most per agents, one per child process.
func childShares(from, to, per int) [][2]int {
	var out [][2]int
	for from < to {
		n := min(per, to-from)
		out = append(out, [2]int{from, n})
		from += n
	}
	return out
}
