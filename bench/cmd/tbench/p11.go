package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/bench/internal/sim"
	"github.com/tether-dev/tether/internal/testenv/pgtest"
	"github.com/tether-dev/tether/tunnel"
)

// p11Replicas is how many hub replicas P11 spreads its fleet over.
const p11Replicas = 3

// p11Ramp is how many agents a second P11 starts, in total. Lower than
// P4's: three hubs and the simulator share the cores, and a faster ramp
// only adds handshakes that time out and back off.
const p11Ramp = 500

// runP11 measures a fleet held by several hub replicas: three `tether hub`
// replicas on one throwaway PostgreSQL (Debian's server in a temp dir, as
// the store tests run it), N simulated QUIC agents enrolled through the
// join endpoint, then split into thirds, each third dialing one replica.
// Per replica: the agents it holds (from `tether replicas -o json`), its
// RSS, and its CPU over an idle window; and the time until the whole fleet
// was connected. QUIC only: a TCP agent costs the simulator one file
// descriptor, and 30k of them do not fit this machine's open-files limit.
func runP11(ctx context.Context, b *bench) error {
	n := b.sz.p11Agents
	env, err := harness.NewEnv(b.bin)
	if err != nil {
		return err
	}
	env.Keep = b.keep
	defer env.Close()
	pg, err := pgtest.Start()
	if err != nil {
		return fmt.Errorf("P11 needs PostgreSQL's server: %w", err)
	}
	defer pg.Stop()
	dsn, err := pg.CreateDB("bench")
	if err != nil {
		return err
	}
	// The first replica puts the hub identity into the store; the others
	// start after it so that none of them races it (they would converge,
	// but a loser's start takes longer).
	var hubs []*harness.Hub
	defer func() {
		for _, h := range hubs {
			h.Stop(60 * time.Second)
		}
	}()
	for i := 1; i <= p11Replicas; i++ {
		peer, err := harness.FreePort()
		if err != nil {
			return err
		}
		h, err := env.StartHub(ctx, env.Path(fmt.Sprintf("r%d", i)), "--store", dsn, "--replica-id", fmt.Sprintf("r%d", i),
			"--peer-listen", fmt.Sprintf("127.0.0.1:%d", peer))
		if err != nil {
			return fmt.Errorf("replica r%d: %w", i, err)
		}
		hubs = append(hubs, h)
	}
	time.Sleep(2 * time.Second) // let the fresh replicas settle before their base RSS
	base := make([]harness.ProcStats, len(hubs))
	for i, h := range hubs {
		if base[i], err = harness.Stats(h.PID()); err != nil {
			return err
		}
	}

	// Enrolled on this run's throwaway database, so not cached as P4's
	// fleet is: the join endpoint of r1 (any replica would do).
	join, err := hubs[0].Token(ctx, n, "bench=replicas")
	if err != nil {
		return err
	}
	enrollStart := time.Now()
	ectx, ecancel := context.WithTimeout(ctx, 15*time.Minute)
	fleet, err := sim.Enroll(ectx, sim.EnrollOptions{JoinString: join, Prefix: "rep", Count: n, Parallel: 16,
		Progress: func(done int) {
			if done%5000 == 0 {
				b.log.Info("enrolled", "done", done, "of", n, "per_second", int(float64(done)/time.Since(enrollStart).Seconds()))
			}
		}})
	ecancel()
	if err != nil {
		return err
	}
	enrolled := time.Since(enrollStart)
	b.log.Info("enrolled", "count", n, "took", enrolled.Round(time.Second))

	// Thirds in order: members [k*n/3, (k+1)*n/3) dial replica k, from
	// their own block of 127.x source addresses.
	lo := func(k int) int { return k * n / len(hubs) }
	for k, h := range hubs {
		for i := lo(k); i < lo(k+1); i++ {
			fleet.Members[i].Hubs = []string{h.Listen}
		}
	}
	var sims []*sim.Sim
	defer func() {
		for _, s := range sims {
			if s != nil {
				s.Stop()
			}
		}
	}()
	connected := func() int {
		c := 0
		for _, s := range sims {
			if s != nil {
				c += s.Connected()
			}
		}
		return c
	}
	// The three thirds are built and started together, so that the
	// replicas fill side by side (building 10k identities takes a while).
	start := time.Now()
	sims = make([]*sim.Sim, len(hubs))
	errs := make([]error, len(hubs))
	var wg sync.WaitGroup
	for k := range hubs {
		wg.Go(func() {
			sims[k], errs[k] = sim.Start(ctx,
				sim.Config{Fleet: fleet, From: lo(k), Count: lo(k+1) - lo(k), Transport: tunnel.TransportQUIC,
					PerSocket: 1000, Ramp: p11Ramp / len(hubs), IPBase: 10 + 2*k,
					BackoffMin: simBackoffMin, BackoffMax: simBackoffMax, Logger: b.agentLog()})
		})
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return err
	}
	// Bounded by the size (10 ms an agent, plus 2 minutes) and by 10
	// minutes: a fleet that does not fit is recorded as such.
	timeout := min(time.Duration(n)*10*time.Millisecond+2*time.Minute, 10*time.Minute)
	lastLog := time.Now()
	if err := harness.WaitFor(ctx, timeout, fmt.Sprintf("%d agents to connect to %d replicas", n, len(hubs)), func() bool {
		c := connected()
		if time.Since(lastLog) > 30*time.Second {
			lastLog = time.Now()
			b.log.Info("ramping up", "connected", c, "of", n, "after", time.Since(start).Round(time.Second))
		}
		return c >= n
	}); err != nil {
		c := connected()
		heldBy := "unknown"
		// Asked even when ctx was cancelled (tbench stopped by hand).
		qctx, qcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer qcancel()
		if held, err := replicaAgents(qctx, hubs[0]); err == nil {
			heldBy = fmt.Sprint(held)
		}
		b.report.Add(harness.Row{ID: "P11",
			What:  fmt.Sprintf("%d QUIC agents over %d replicas on PostgreSQL: all connected (ramp-up)", n, len(hubs)),
			Value: "not completed", Comment: fmt.Sprintf("%d connected after %v (held per replica: %s); load average "+
				"%.1f on %d cores",
				c, time.Since(start).Round(time.Second), heldBy, harness.LoadAvg1(), runtimeCPUs())})
		return fmt.Errorf("%w (%d connected)", err, c)
	}
	up := time.Since(start)
	b.log.Info("fleet connected", "agents", n, "replicas", len(hubs), "took", up.Round(time.Millisecond))

	held := map[string]int{}
	var lastErr error
	if err := harness.WaitFor(ctx, 2*time.Minute, "every replica to record the agents it holds", func() bool {
		m, err := replicaAgents(ctx, hubs[0])
		if lastErr = err; err != nil {
			return false
		}
		held = m
		total := 0
		for _, c := range held {
			total += c
		}
		return total >= n
	}); err != nil {
		return fmt.Errorf("%w (held: %v, last error: %v)", err, held, lastErr)
	}

	// P4's settle and window would keep three replicas' fleets idle for
	// minutes: P11 compares replicas, so half a minute is enough.
	window := min(b.sz.p4Idle, 30*time.Second)
	settle := min(10*time.Second, window)
	time.Sleep(settle)
	st0 := make([]harness.ProcStats, len(hubs))
	for i, h := range hubs {
		if st0[i], err = harness.Stats(h.PID()); err != nil {
			return err
		}
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(window):
	}
	wall := time.Since(t0)
	for i, h := range hubs {
		st1, err := harness.Stats(h.PID())
		if err != nil {
			return err
		}
		id := fmt.Sprintf("r%d", i+1)
		c, err := h.Connected(ctx, "quic")
		if err != nil {
			return err
		}
		have := held[id]
		per := "—"
		if have > 0 {
			per = fmt.Sprintf("%.1f KiB per agent", float64(st1.RSS-base[i].RSS)/float64(have)/1024)
		}
		b.report.Add(harness.Row{ID: "P11",
			What:    fmt.Sprintf("%d QUIC agents over %d replicas on PostgreSQL: replica %s, agents held", n, len(hubs), id),
			Value:   fmt.Sprintf("%d", have),
			Comment: fmt.Sprintf("`tether replicas -o json`; its own tether_nodes_connected: %d", c)})
		b.report.Add(harness.Row{ID: "P11",
			What:    fmt.Sprintf("%d QUIC agents over %d replicas on PostgreSQL: replica %s, RSS", n, len(hubs), id),
			Value:   fmt.Sprintf("%.0f MiB", float64(st1.RSS)/(1<<20)),
			Comment: fmt.Sprintf("%.0f MiB before the fleet; %s", float64(base[i].RSS)/(1<<20), per)})
		b.report.Add(harness.Row{ID: "P11",
			What: fmt.Sprintf("%d QUIC agents over %d replicas on PostgreSQL: replica %s, CPU while idle (over %v)", n,
				len(hubs), id, wall.Round(time.Second)),
			Value:   fmt.Sprintf("%.1f %% of a core", (st1.CPU-st0[i].CPU).Seconds()/wall.Seconds()*100),
			Comment: "keepalives, heartbeats, presence lease renewals"})
	}
	b.report.Add(harness.Row{ID: "P11",
		What:  fmt.Sprintf("%d QUIC agents over %d replicas on PostgreSQL: all connected (ramp-up)", n, len(hubs)),
		Value: fmt.Sprintf("%.1f s", up.Seconds()),
		Comment: fmt.Sprintf("started at %d agents/s in total, a third per replica; enrolling them through r1's "+
			"join endpoint took %.0f s",
			p11Ramp/len(hubs)*len(hubs), enrolled.Seconds())})
	return nil
}

// replicaAgents is how many agents each replica holds, by replica ID, as
// `tether replicas -o json` run against h shows it.
func replicaAgents(ctx context.Context, h *harness.Hub) (map[string]int, error) {
	out, err := h.Tether(ctx, "replicas", "-o", "json")
	if err != nil {
		return nil, err
	}
	var rs []struct {
		ID     string   `json:"id"`
		Agents []string `json:"agents"`
	}
	if err := json.Unmarshal([]byte(out), &rs); err != nil {
		return nil, fmt.Errorf("parse tether replicas -o json: %w", err)
	}
	m := map[string]int{}
	for _, r := range rs {
		m[r.ID] = len(r.Agents)
	}
	return m, nil
}
