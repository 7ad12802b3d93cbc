package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/internal/testenv/pgtest"
)

// replica kills -9 the hub replica that holds the agents, of two replicas
// on one throwaway PostgreSQL (Debian's server in a temp dir, as P11 runs
// it). Each replica advertises itself and then the other, so the agents'
// join string (made on the first) names both and they can fail over; the
// killed replica is started again after the run, and the next run kills
// the other one, which then holds the agents. Per transport: the time from
// the kill until the live replica holds the agent's tunnel, and how a jump
// entering the live replica for that node, started at the kill, ends
// (works, or fails with a reason) and when.
func (f *f1) replica(ctx context.Context) error {
	e, err := f.newEnv(ctx)
	if err != nil {
		return err
	}
	defer e.Close()
	pg, err := pgtest.Start()
	if err != nil {
		return fmt.Errorf("replicas need PostgreSQL's server: %w", err)
	}
	defer pg.Stop()
	dsn, err := pg.CreateDB("f1")
	if err != nil {
		return err
	}
	addrs, err := pickAddrs(6) // tunnel, ssh and peer address of each replica
	if err != nil {
		return err
	}
	var hubs []*harness.Hub
	for i := range 2 {
		other := 1 - i
		extra := append([]string{"--store", dsn, "--replica-id", fmt.Sprintf("r%d", i+1),
			"--peer-listen", addrs[4+i], "--advertise", addrs[i], "--advertise", addrs[other]}, f.sz.hubFlags...)
		h, err := e.StartHubAt(ctx, e.Path(fmt.Sprintf("r%d", i+1)), addrs[i], addrs[2+i], extra...)
		if err != nil {
			return fmt.Errorf("replica r%d: %w", i+1, err)
		}
		hubs = append(hubs, h)
	}
	if _, err := hubs[0].Tether(ctx, "operator", "add", "bench", "--key", e.key); err != nil {
		return err
	}
	join, err := hubs[0].Token(ctx, len(transports))
	if err != nil {
		return err
	}
	agents, err := f.startAgents(e, join)
	if err != nil {
		return err
	}
	// holder is the replica that holds transport t's agent now (-1: none).
	holder := func(t string) int {
		for i, h := range hubs {
			if n, err := h.Connected(ctx, t); err == nil && n > 0 {
				return i
			}
		}
		return -1
	}
	moved, jumped := map[string]*series{}, map[string]*series{}
	outcomes := map[string]*tally{}
	for _, t := range transports {
		moved[t], jumped[t], outcomes[t] = &series{}, &series{}, &tally{}
	}
	for run := range f.sz.runs {
		held := map[int][]string{}
		if err := harness.WaitFor(ctx, f.sz.cap, "every agent on a replica", func() bool {
			clear(held)
			for _, t := range transports {
				i := holder(t)
				if i < 0 {
					return false
				}
				held[i] = append(held[i], t)
			}
			return true
		}); err != nil {
			return fmt.Errorf("before kill %d: %w%s", run+1, err, agentLogs(agents))
		}
		// Kill the replica holding the QUIC agent; a TCP agent elsewhere
		// gives this run no TCP figure.
		k := holder("quic")
		dead, live := hubs[k], hubs[1-k]
		for _, t := range held[k] {
			if err := f.waitJump(ctx, e, live.SSH, agents[t].name); err != nil {
				return fmt.Errorf("before kill %d, a jump entering the other replica: %w", run+1, err)
			}
		}
		var wg sync.WaitGroup
		kill := time.Now()
		dead.Kill9()
		for _, t := range held[k] {
			wg.Go(func() {
				d, ok := until(ctx, kill, f.sz.cap, 100*time.Millisecond, func() bool {
					n, err := live.Connected(ctx, t)
					return err == nil && n > 0
				})
				moved[t].add(d, ok)
			})
			wg.Go(func() {
				r := e.jump(ctx, live.SSH, agents[t].name, f.sz.cap)
				took := time.Since(kill)
				jumped[t].add(took, !r.killed)
				switch {
				case r.ok:
					outcomes[t].add("worked")
				case r.killed:
					outcomes[t].add("hung until the cap")
				default:
					outcomes[t].add("failed: " + relReason(r.reason, kill))
				}
			})
		}
		wg.Wait()
		if err := f.startAgain(ctx, fmt.Sprintf("replica r%d", k+1), dead.Start); err != nil {
			return fmt.Errorf("after kill %d: %w", run+1, err)
		}
		f.b.log.Info("F1 replica kill", "run", run+1, "killed", k+1, "held", held[k])
	}
	for _, t := range transports {
		what := fmt.Sprintf("replica kill -9 (two on PostgreSQL), %s agent", trName(t))
		f.row(what+": until the live replica holds its tunnel", moved[t], f.cap, 10*time.Second)
		f.row(what+": until a jump entering the live replica, started at the kill, ends", jumped[t], f.cap, 0)
		f.b.report.Note("F1 replica kill, %s agent: the jump entering the live replica at the kill: %s", trName(t),
			outcomes[t])
	}
	return nil
}
