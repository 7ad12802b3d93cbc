package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
)

// hubKill kills a hub -9 under one agent per transport: restarted at once
// on the same addresses (restart), and left dead (dead).
func (f *f1) hubKill(ctx context.Context, restart, dead bool) error {
	e, err := f.newEnv(ctx)
	if err != nil {
		return err
	}
	defer e.Close()
	addrs, err := pickAddrs(2)
	if err != nil {
		return err
	}
	hub, err := e.StartHubAt(ctx, e.Path("hub"), addrs[0], addrs[1], f.sz.hubFlags...)
	if err != nil {
		return err
	}
	join, err := hub.Token(ctx, len(transports))
	if err != nil {
		return err
	}
	agents, err := f.startAgents(e, join)
	if err != nil {
		return err
	}
	if err := f.waitOnline(ctx, hub, agents); err != nil {
		return err
	}
	if restart {
		if err := f.hubRestarts(ctx, hub, agents); err != nil {
			return err
		}
	}
	if dead {
		return f.hubDeaths(ctx, e, hub, agents)
	}
	return nil
}

// watchNotice measures, per agent, the time from kill until the agent's
// status stops saying connected.
func (f *f1) watchNotice(ctx context.Context, kill time.Time, agents map[string]*agent, into map[string]*series,
	wg *sync.WaitGroup, got map[string]time.Duration, mu *sync.Mutex) {
	for _, t := range transports {
		a := agents[t]
		wg.Go(func() {
			var d time.Duration
			_, ok := until(ctx, kill, f.sz.cap, 10*time.Millisecond, func() bool {
				var seen bool
				d, seen = a.noticed(kill)
				return seen
			})
			into[t].add(d, ok)
			if ok && got != nil {
				mu.Lock()
				got[t] = d
				mu.Unlock()
			}
		})
	}
}

// hubRestarts: per run, kill -9 and an immediate restart. Per transport:
// the time from the kill until the agent's status stops saying connected
// (notice) and until the restarted hub lists the node online (recover: a
// new hub process lists only sessions made with it).
func (f *f1) hubRestarts(ctx context.Context, hub *harness.Hub, agents map[string]*agent) error {
	notice, back := map[string]*series{}, map[string]*series{}
	for _, t := range transports {
		notice[t], back[t] = &series{}, &series{}
	}
	late := map[string]int{} // runs in which the status said connected after the restarted hub served
	var served series
	for run := range f.sz.runs {
		if err := f.waitOnline(ctx, hub, agents); err != nil {
			return fmt.Errorf("before kill %d: %w", run+1, err)
		}
		var wg sync.WaitGroup
		var mu sync.Mutex
		got := map[string]time.Duration{}
		kill := time.Now()
		hub.Kill9()
		f.watchNotice(ctx, kill, agents, notice, &wg, got, &mu)
		if err := f.startAgain(ctx, "the hub", hub.Start); err != nil {
			return fmt.Errorf("restart %d: %w", run+1, err)
		}
		up := time.Since(kill)
		served.add(up, true)
		for _, t := range transports {
			a := agents[t]
			wg.Go(func() {
				d, ok := until(ctx, kill, f.sz.cap, 100*time.Millisecond, func() bool {
					nodes, err := hub.Nodes(ctx)
					return err == nil && nodes[a.name]
				})
				back[t].add(d, ok)
			})
		}
		wg.Wait()
		for _, t := range transports {
			if d, ok := got[t]; !ok || d > up {
				late[t]++
			}
		}
		f.b.log.Info("F1 hub restart", "run", run+1, "hub_serving_after", up.Round(time.Millisecond),
			"noticed", got)
	}
	for _, t := range transports {
		what := fmt.Sprintf("hub kill -9, restarted at once, %s agent", trName(t))
		f.row(what+": until its status stops saying connected", notice[t], f.cap, 0)
		f.row(what+": until the restarted hub lists it online", back[t], f.cap, 3*time.Second)
		f.b.report.Note("F1 hub restart, %s agent: its status still said connected once the restarted hub served "+
			"in %d of %d runs (the hub served %s after the kill, median / max)", trName(t), late[t], f.sz.runs,
			served.value(f.cap))
	}
	return nil
}

// hubDeaths: per run, kill -9 and no restart. Per transport: the time
// until the agent's status stops saying connected. The hub is started
// again after the run and the agents restarted, so that the next run
// does not wait for their backoff.
func (f *f1) hubDeaths(ctx context.Context, e *f1Env, hub *harness.Hub, agents map[string]*agent) error {
	notice := map[string]*series{}
	for _, t := range transports {
		notice[t] = &series{}
	}
	for run := range f.sz.runs {
		if err := f.waitOnline(ctx, hub, agents); err != nil {
			return fmt.Errorf("before kill %d: %w", run+1, err)
		}
		var wg sync.WaitGroup
		kill := time.Now()
		hub.Kill9()
		f.watchNotice(ctx, kill, agents, notice, &wg, nil, nil)
		wg.Wait()
		if err := f.startAgain(ctx, "the hub", hub.Start); err != nil {
			return fmt.Errorf("after kill %d: %w", run+1, err)
		}
		for _, t := range transports {
			if err := agents[t].restart(e); err != nil {
				return err
			}
		}
	}
	for _, t := range transports {
		f.row(fmt.Sprintf("hub kill -9, not restarted, %s agent: until its status stops saying connected", trName(t)),
			notice[t], f.cap, 0)
	}
	return nil
}
