package main

import (
	"context"
	"flag"
	"fmt"
	"maps"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/bench/internal/sim"
	"github.com/tether-dev/tether/tunnel"
)

// p4KeepAlive, if set, runs P4's hub and agents with --keepalive of this
// and --dead-peer-timeout of three times this (the documented flags of
// `tether hub` and `tether-edge run`), to show what idle CPU a fleet costs
// at a longer interval than the default.
var p4KeepAlive = flag.Duration("p4-keepalive", 0,
	"run P4 with this --keepalive (and 3× as --dead-peer-timeout) on hub and agents instead of the defaults")

// p4Tunnel is the agents' tunnel config for -p4-keepalive (nil: defaults).
func p4Tunnel() *tunnel.Config {
	if *p4KeepAlive <= 0 {
		return nil
	}
	return &tunnel.Config{KeepAliveInterval: *p4KeepAlive, IdleTimeout: 3 * *p4KeepAlive}
}

// p4HubArgs are the hub flags for -p4-keepalive.
func p4HubArgs() []string {
	if *p4KeepAlive <= 0 {
		return nil
	}
	return []string{"--keepalive", p4KeepAlive.String(), "--dead-peer-timeout", (3 * *p4KeepAlive).String()}
}

// The simulator's agents back off as the real agent does by default.
const (
	simBackoffMin = 500 * time.Millisecond
	simBackoffMax = 30 * time.Second
)

func runP4(ctx context.Context, b *bench) error { return b.fleetScenarios(ctx, true, b.runsP5) }
func runP5(ctx context.Context, b *bench) error {
	if b.ranP45 {
		return nil // done together with P4 (one ramp-up serves both)
	}
	return b.fleetScenarios(ctx, false, true)
}

// fleetScenarios ramps simulated agents up to each P4 size on one hub, per
// transport, and measures the idle hub at each size (P4); at the P5 sizes it
// restarts the hub under the connected fleet and measures the reconnect
// storm (P5).
func (b *bench) fleetScenarios(ctx context.Context, p4, p5 bool) error {
	b.ranP45 = true
	defer sim.CollectTighter()()
	env, err := harness.NewEnv(b.bin)
	if err != nil {
		return err
	}
	env.Keep = b.keep
	defer env.Close()
	sizes := slices.Clone(b.sz.p4Counts)
	if !p4 {
		sizes = slices.Clone(b.sz.p5Counts)
	}
	for _, n := range b.sz.p5Counts {
		if p5 && !slices.Contains(sizes, n) {
			sizes = append(sizes, n)
		}
	}
	slices.Sort(sizes)
	dataDir, fleet, err := b.fleet(ctx, env, sizes[len(sizes)-1])
	if err != nil {
		return err
	}
	for _, tr := range []tunnel.Transport{tunnel.TransportQUIC, tunnel.TransportTCP} {
		if err := b.fleetRun(ctx, env, dataDir, fleet, tr, sizes, p4, p5); err != nil {
			return fmt.Errorf("%v: %w", tr, err)
		}
	}
	if p5 {
		return b.handshakeRows(ctx)
	}
	return nil
}

func (b *bench) fleetRun(ctx context.Context, env *harness.Env, dataDir string, fleet *sim.Fleet, tr tunnel.Transport,
	sizes []int, p4, p5 bool) error {
	hub, err := env.StartHub(ctx, dataDir, p4HubArgs()...)
	if err != nil {
		return err
	}
	defer hub.Stop(60 * time.Second)
	fleet.SetHub(hub.Listen)
	time.Sleep(2 * time.Second)
	base, err := harness.Stats(hub.PID())
	if err != nil {
		return err
	}
	m, err := hub.Metrics(ctx)
	if err != nil {
		return err
	}
	baseG := m["go_goroutines"]
	baseHeap := m["go_memstats_heap_inuse_bytes"]
	baseStack := m["go_memstats_stack_inuse_bytes"]
	selfBase, _ := harness.Stats(selfPID())

	var sims []*sim.Sim
	var procs []*simProcess
	defer func() {
		for _, s := range sims {
			s.Stop()
		}
		for _, p := range procs {
			p.Stop(30 * time.Second)
		}
	}()
	connected := func() int {
		n := 0
		for _, s := range sims {
			n += s.Connected()
		}
		for _, p := range procs {
			n += p.Connected()
		}
		return n
	}
	childRSS := func() int64 {
		var rss int64
		for _, p := range procs {
			rss += p.RSS()
		}
		return rss
	}
	name := tr.String()
	have := 0
	// TCP agents hold a file descriptor each in the hub and in this
	// process, and QUIC agents a UDP socket each in this process: stay
	// under the open-files limit with room to spare. QUIC agents beyond it
	// run in agentsim child processes (simProcess), each with a limit of
	// its own.
	tcpMax := min(b.sz.p4TCPMax, int(nofileHard())-2000)
	for _, n := range sizes {
		if tr == tunnel.TransportTCP && n > tcpMax {
			b.report.Add(harness.Row{ID: "P4", What: fmt.Sprintf("%d idle agents, %s", n, pathName(name)),
				Value: "not measured", Target: "100k agents", Met: "no",
				Comment: fmt.Sprintf("the hub holds one file descriptor per TCP agent and RLIMIT_NOFILE is capped at %d "+
					"on this machine (no CAP_SYS_RESOURCE); measured up to %d", nofileHard(), tcpMax)})
			continue
		}
		// The next step's memory, from what hub and simulators took per
		// agent so far: a fleet that does not fit is reported, not run
		// into the OOM killer (which would take the machine's other work
		// with it).
		if have > 0 {
			if need, avail, ok := fitsMemory(hub.PID(), base.RSS, selfBase.RSS, childRSS(), have, n); !ok {
				b.report.Add(harness.Row{ID: "P4", What: fmt.Sprintf("%d idle agents, %s", n, pathName(name)),
					Value: "not measured", Target: "fits the machine", Met: "no",
					Comment: fmt.Sprintf("needs ~%.1f GiB more (hub and simulators per agent as measured at %d), %.1f GiB "+
						"available", need/(1<<30), have, avail/(1<<30))})
				break
			}
		}
		start := time.Now()
		if n <= tcpMax {
			// 1,000 agents a second: at 5,000 the simulator's own
			// handshakes starved its connected agents of CPU on this
			// 2-core box (their heartbeats went silent, the hub closed
			// them: 345 of 10,000 up after 3 min 40 s), where 1,000
			// brought 10,000 up in 100 s.
			s, err := sim.Start(ctx, sim.Config{Fleet: fleet, From: have, Count: n - have, Transport: tr, Ramp: 1000,
				Tunnel:     p4Tunnel(),
				BackoffMin: simBackoffMin, BackoffMax: simBackoffMax, Logger: b.agentLog()})
			if err != nil {
				return err
			}
			sims = append(sims, s)
		} else {
			// One child at a time, each once the one before is up: their
			// ramps together with the hub's handshakes fill two cores.
			for _, share := range childShares(have, n, tcpMax) {
				p, err := startSimProcess(env, b.bin, b.fleetFile(), hub.Listen, tr, share[0], share[1])
				if err != nil {
					return err
				}
				procs = append(procs, p)
				if err := harness.WaitFor(ctx, time.Duration(share[1])*10*time.Millisecond+2*time.Minute,
					fmt.Sprintf("agentsim with fleet members %d-%d to connect", share[0], share[0]+share[1]-1), func() bool {
						return p.Connected() >= share[1]
					}); err != nil {
					return fmt.Errorf("%w (agentsim: %s; hub: %s)", err, p.Tail(300), hub.Tail(500))
				}
			}
		}
		have = n
		timeout := time.Duration(n)*10*time.Millisecond + 2*time.Minute
		if err := harness.WaitFor(ctx, timeout, fmt.Sprintf("%d %s agents to connect", n, name), func() bool {
			return connected() >= n
		}); err != nil {
			return fmt.Errorf("%w (%d connected, hub: %s)", err, connected(), hub.Tail(500))
		}
		up := time.Since(start)
		b.log.Info("fleet connected", "transport", name, "agents", n, "took", up.Round(time.Millisecond),
			"agentsim_processes", len(procs))
		if err := harness.WaitFor(ctx, time.Minute, "the hub to count every agent", func() bool {
			c, err := hub.Connected(ctx, name)
			return err == nil && c >= n
		}); err != nil {
			return err
		}
		if p4 && slices.Contains(b.sz.p4Counts, n) {
			if err := b.measureIdle(ctx, hub, n, name, up, base, baseG, baseHeap, baseStack, selfBase, childRSS()); err != nil {
				return err
			}
		}
		if p5 && slices.Contains(b.sz.p5Counts, n) && len(procs) > 0 {
			b.report.Add(harness.Row{ID: "P5", What: fmt.Sprintf("reconnect storm, %d agents, %s", n, pathName(name)),
				Value: "not measured", Met: "no",
				Comment: fmt.Sprintf("agents beyond the open-files limit (%d) run in agentsim processes, which do not "+
					"report each agent's reconnect", tcpMax)})
		} else if p5 && slices.Contains(b.sz.p5Counts, n) {
			if err := b.storm(ctx, hub, sims, n, name); err != nil {
				return err
			}
		}
	}
	return nil
}

// fitsMemory reports whether growing the fleet from have to n agents fits
// in the memory available, at the per-agent cost the hub (pid, baseline
// RSS hubBase) and this process (baseline selfBase) have shown so far, with
// a 10 % margin. children is the RSS of the agentsim processes holding
// part of the fleet.
func fitsMemory(pid int, hubBase, selfBase, children int64, have, n int) (need, avail float64, ok bool) {
	h, herr := harness.Stats(pid)
	self, serr := harness.Stats(selfPID())
	a, aerr := memAvailable()
	if herr != nil || serr != nil || aerr != nil {
		return 0, 0, true // unknown: try
	}
	per := float64(max(0, h.RSS-hubBase)+max(0, self.RSS+children-selfBase)) / float64(have)
	need = per * float64(n-have) * 1.1
	return need, float64(a), need <= float64(a)
}

// memAvailable is the kernel's estimate of memory available for new work.
func memAvailable() (int64, error) {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	for line := range strings.Lines(string(b)) {
		if v, ok := strings.CutPrefix(line, "MemAvailable:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no MemAvailable in /proc/meminfo")
}

// measureIdle settles, then measures the hub over the idle window.
func (b *bench) measureIdle(ctx context.Context, hub *harness.Hub, n int, name string, up time.Duration,
	base harness.ProcStats, baseG, baseHeap, baseStack float64, selfBase harness.ProcStats, children int64) error {
	// What the first keepalive cycle after connecting costs once per session
	// is not idle cost: each agent's first ping finds its session's goroutine
	// stacks shrunk by the ramp's last collection, and quic-go's path MTU
	// probes still pending. At full size the settle lets every agent ping
	// once, and the window (at least one keepalive interval, or the window
	// samples only some agents) lasts two minutes: the runtime collects at
	// least every two minutes, so one collection falls in it, as in any two
	// idle minutes.
	settle := b.sz.p4Settle
	window := max(b.sz.p4Idle, keepAliveInUse())
	time.Sleep(settle)
	st0, err := harness.Stats(hub.PID())
	if err != nil {
		return err
	}
	prof := newHubProfiler(hub, b.cache)
	if prof != nil {
		prof.startCPU(ctx, window, fmt.Sprintf("p4-%s-%d", name, n))
	}
	t0 := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(window):
	}
	st1, err := harness.Stats(hub.PID())
	if err != nil {
		return err
	}
	wall := time.Since(t0)
	m, err := hub.Metrics(ctx)
	if err != nil {
		return err
	}
	self, _ := harness.Stats(selfPID())
	// Sessions the hub lost during the window (agents starved of CPU on a
	// shared machine miss their heartbeats) make every figure per agent
	// smaller than it is: say so.
	held, herr := hub.Connected(ctx, name)
	heldNote := ""
	if herr != nil {
		heldNote = fmt.Sprintf("; sessions held at the end not read: %v", herr)
	} else if held < n {
		heldNote = fmt.Sprintf("; ONLY %d OF %d STILL CONNECTED at the end (load average %.1f): figure too low", held,
			n, harness.LoadAvg1())
	}
	perRSS := float64(st1.RSS-base.RSS) / float64(n)
	perHeap := (m["go_memstats_heap_inuse_bytes"] - baseHeap) / float64(n)
	perStack := (m["go_memstats_stack_inuse_bytes"] - baseStack) / float64(n)
	perG := (m["go_goroutines"] - baseG) / float64(n)
	cpu := (st1.CPU - st0.CPU).Seconds() / wall.Seconds() * 100
	limit := 48.0
	if name == "tcp" {
		limit = 24
	}
	b.report.Add(harness.Row{ID: "P4", What: fmt.Sprintf("%d idle agents, %s: hub RSS per agent", n, pathName(name)),
		Value:  fmt.Sprintf("%.1f KiB", perRSS/1024),
		Ref:    "rathole ≈36 KB/conn, frp ≈150 KB/client (published)",
		Target: fmt.Sprintf("≤ %.0f KiB", limit), Met: harness.YesNo(perRSS/1024 <= limit),
		Comment: fmt.Sprintf("growth over the same hub before any agent (%.0f MiB); hub RSS %.0f MiB in all, %.1f "+
			"KiB per agent counting the baseline; Go heap in use %.1f KiB/agent, goroutine stacks %.1f KiB/agent; all "+
			"connected in %v%s",
			float64(base.RSS)/(1<<20), float64(st1.RSS)/(1<<20), float64(st1.RSS)/float64(n)/1024, perHeap/1024,
			perStack/1024, up.Round(time.Second), heldNote)})
	b.report.Add(harness.Row{ID: "P4",
		What:  fmt.Sprintf("%d idle agents, %s: hub goroutines per agent", n, pathName(name)),
		Value: fmt.Sprintf("%.2f", perG)})
	b.report.Add(harness.Row{ID: "P4",
		What: fmt.Sprintf("%d idle agents, %s: hub CPU while idle (over %v, from %v after the last agent connected)",
			n, pathName(name), wall.Round(time.Second), settle),
		Value: fmt.Sprintf("%.1f %% of a core", cpu), Target: "≤ 5 % of a core", Met: harness.YesNo(cpu <= 5),
		Comment: fmt.Sprintf("%s; load average %.1f", keepaliveNote(), harness.LoadAvg1())})
	if prof != nil {
		prof.report(ctx, b, n, pathName(name), fmt.Sprintf("p4-%s-%d", name, n))
	}
	// The simulator keeps the heap of the previous transport's fleet
	// mapped, so after the first transport its growth can be negative:
	// only a growth is a figure.
	if grew := float64(self.RSS+children) - float64(selfBase.RSS); grew > 0 {
		b.report.Add(harness.Row{ID: "P4",
			What:  fmt.Sprintf("%d idle agents, %s: simulator RSS per agent (informational)", n, pathName(name)),
			Value: fmt.Sprintf("%.1f KiB", grew/float64(n)/1024)})
	}
	return nil
}

// keepAliveInUse is the keepalive interval hub and agents run with.
func keepAliveInUse() time.Duration {
	if *p4KeepAlive > 0 {
		return *p4KeepAlive
	}
	return tunnel.DefaultKeepAliveInterval
}

func keepaliveNote() string {
	if *p4KeepAlive > 0 {
		return fmt.Sprintf("hub and agents run with --keepalive %v --dead-peer-timeout %v", *p4KeepAlive, 3**p4KeepAlive)
	}
	return fmt.Sprintf("the product's default keepalive (%v) and dead-peer timeout (%v)",
		tunnel.DefaultKeepAliveInterval, tunnel.DefaultIdleTimeout)
}

// storm restarts the hub under n connected agents and waits for all of them
// to come back.
func (b *bench) storm(ctx context.Context, hub *harness.Hub, sims []*sim.Sim, n int, name string) error {
	failed0 := 0
	for _, s := range sims {
		s.Mark()
		failed0 += s.FailedAttempts()
	}
	t0 := time.Now()
	if _, err := hub.Restart(ctx); err != nil {
		return err
	}
	ready := time.Now()
	b.log.Info("hub restarted under the fleet", "transport", name, "agents", n, "restart_took",
		ready.Sub(t0).Round(time.Millisecond))
	limit := 30 * time.Second
	if n > 10000 {
		limit = 3 * time.Minute
	}
	cpu0 := time.Duration(0)
	if st, err := harness.Stats(hub.PID()); err == nil {
		cpu0 = st.CPU
	}
	// With the profiling hub (TBENCH_HUB=hubprof), where the hub's CPU goes
	// while the fleet storms back.
	prof := newHubProfiler(hub, b.cache)
	if prof != nil {
		prof.startCPU(ctx, 15*time.Second, fmt.Sprintf("p5-%s-%d", name, n))
	}
	tl := stormTimeline{start: ready, hubPID: hub.PID(), hubCPU0: cpu0, selfCPU0: selfCPU()}
	err := harness.WaitFor(ctx, 3*limit+time.Minute, fmt.Sprintf("%d agents to reconnect", n), func() bool {
		c := 0
		for _, s := range sims {
			c += s.Connected()
		}
		tl.sample(c, false)
		return c >= n
	})
	back := time.Since(ready)
	if err != nil {
		return err
	}
	tl.sample(n, true)
	b.log.Info("storm timeline", "transport", name, "agents", n, "seconds", tl.String())
	st, _ := harness.Stats(hub.PID())
	var all []sim.ReconnectStats
	failed := -failed0
	for _, s := range sims {
		all = append(all, s.Reconnects(ready))
		failed += s.FailedAttempts()
	}
	rs := sim.Merge(all...)
	var late []sim.Straggler
	for _, s := range sims {
		late = append(late, s.Stragglers(ready, 3)...)
	}
	for _, st := range sim.LastBack(late, 3) {
		b.log.Info("storm straggler (status changes since the restart)", "transport", name, "trail",
			strings.Join(st.Trail, " | "))
	}
	cpu := (st.CPU - cpu0).Seconds() / back.Seconds()
	b.report.Add(harness.Row{ID: "P5",
		What:   fmt.Sprintf("reconnect storm, %d agents, %s: all back after hub restart", n, pathName(name)),
		Value:  fmt.Sprintf("%.1f s", rs.Last.Seconds()),
		Target: fmt.Sprintf("≤ %v", limit), Met: harness.YesNo(rs.Last <= limit && rs.Back >= n),
		Comment: fmt.Sprintf("from the new hub serving; p50 %.1f s, p99 %.1f s; hub stop+start took %.1f s; %s",
			rs.P50.Seconds(), rs.P99.Seconds(), ready.Sub(t0).Seconds(), tl.summary())})
	b.report.Add(harness.Row{ID: "P5",
		What:    fmt.Sprintf("reconnect storm, %d agents, %s: hub CPU during the storm", n, pathName(name)),
		Value:   fmt.Sprintf("%.2f cores", cpu),
		Comment: fmt.Sprintf("%.0f CPU-s over %.1f s", (st.CPU - cpu0).Seconds(), back.Seconds())})
	refusals := ""
	if m, err := hub.Metrics(ctx); err == nil {
		// The restarted hub's counters: this storm's refusals only.
		refusals = fmt.Sprintf("the hub refused %.0f QUIC and %.0f TCP attempts with a retry hint, %.0f TCP "+
			"without (too many refusals at once), pacing them at %.0f admissions/s; %.0f handshakes took a slot and "+
			"failed, holding slots %.0f s in all",
			m[`tether_tunnel_busy_refusals_total{hinted="yes",transport="quic"}`],
			m[`tether_tunnel_busy_refusals_total{hinted="yes",transport="tcp"}`],
			m[`tether_tunnel_busy_refusals_total{hinted="no",transport="tcp"}`], m[`tether_tunnel_admission_rate_per_second`],
			m[`tether_tunnel_handshakes_failed_total`], m[`tether_tunnel_handshake_failed_slot_seconds_total`])
	}
	b.report.Add(harness.Row{ID: "P5",
		What:  fmt.Sprintf("reconnect storm, %d agents, %s: failed or refused attempts", n, pathName(name)),
		Value: fmt.Sprintf("%d (most by one agent: %d)", failed, rs.MaxFailures), Comment: refusals})
	capGap := simBackoffMax + tunnel.DefaultHandshakeTimeout + time.Second
	b.report.Add(harness.Row{ID: "P5",
		What:   fmt.Sprintf("reconnect storm, %d agents, %s: longest wait of one agent between attempts", n, pathName(name)),
		Value:  fmt.Sprintf("%.1f s", rs.MaxGap.Seconds()),
		Target: fmt.Sprintf("≤ backoff cap %v + one handshake timeout", simBackoffMax),
		Met:    harness.YesNo(rs.MaxGap <= capGap),
		Comment: fmt.Sprintf("each agent's longest wait: p50 %.1f s, p99 %.1f s, max %.1f s (refused agents wait "+
			"for the retry-after hint of the hub's admission pacer, on both transports); waits of %v or more, by what "+
			"they followed: %s; load average %.1f",
			rs.GapP50.Seconds(), rs.GapP99.Seconds(), rs.MaxGap.Seconds(), sim.LongGap, gapCauses(rs.LongGapAfter),
			harness.LoadAvg1())})
	if prof != nil && prof.cpu != nil {
		if f := <-prof.cpu; f != "" {
			b.log.Info("hub CPU profile of the storm", "file", f)
			for _, e := range pprofTop(ctx, f, "cpu", 8) {
				b.report.Add(harness.Row{ID: "P5",
					What:    fmt.Sprintf("reconnect storm, %d agents, %s: hub CPU in %s", n, pathName(name), e.fn),
					Value:   fmt.Sprintf("%.1f %%", e.pct),
					Comment: "share of the hub's CPU samples over the storm's first 15 s (flat)"})
			}
		}
	}
	return nil
}

// stormTimeline samples, once a second of a storm, how many agents are back
// and the CPU the hub and the simulated fleet (this process) have used: it
// tells a storm limited by CPU from one limited by the agents' waits.
type stormTimeline struct {
	start             time.Time
	hubPID            int
	hubCPU0, selfCPU0 time.Duration
	points            []stormPoint
}

type stormPoint struct {
	at           time.Duration
	back         int
	hubCPU, self time.Duration // since the storm began
}

func (t *stormTimeline) sample(back int, final bool) {
	at := time.Since(t.start)
	if !final && len(t.points) > 0 && at-t.points[len(t.points)-1].at < time.Second {
		return
	}
	p := stormPoint{at: at, back: back, self: selfCPU() - t.selfCPU0}
	if st, err := harness.Stats(t.hubPID); err == nil {
		p.hubCPU = st.CPU - t.hubCPU0
	}
	t.points = append(t.points, p)
}

// String is the whole timeline, one "t:back(hub cores,sim cores)" per
// five seconds, for the log.
func (t *stormTimeline) String() string {
	var b strings.Builder
	var prev stormPoint
	next := 5 * time.Second
	for i, p := range t.points {
		if p.at < next && i != len(t.points)-1 {
			continue
		}
		el := (p.at - prev.at).Seconds()
		fmt.Fprintf(&b, "%.0fs:%d(hub %.2f, sim %.2f) ", p.at.Seconds(), p.back,
			(p.hubCPU-prev.hubCPU).Seconds()/el, (p.self-prev.self).Seconds()/el)
		prev = p
		for next <= p.at {
			next += 5 * time.Second
		}
	}
	return strings.TrimSpace(b.String())
}

// summary is the report's short form: agents back at 10, 20 and 30 s, and
// the cores the hub and the simulator used over the whole storm.
func (t *stormTimeline) summary() string {
	var back []string
	for _, s := range []time.Duration{10 * time.Second, 20 * time.Second, 30 * time.Second} {
		n := 0
		for _, p := range t.points {
			if p.at <= s {
				n = p.back
			}
		}
		back = append(back, strconv.Itoa(n))
	}
	last := stormPoint{}
	if len(t.points) > 0 {
		last = t.points[len(t.points)-1]
	}
	el := max(last.at.Seconds(), 0.001)
	return fmt.Sprintf("back at 10/20/30 s: %s; simulator %.2f cores, hub %.2f cores over the storm",
		strings.Join(back, "/"), last.self.Seconds()/el, last.hubCPU.Seconds()/el)
}

// gapCauses lists ReconnectStats.LongGapAfter, largest first.
func gapCauses(m map[string]int) string {
	if len(m) == 0 {
		return "none"
	}
	keys := slices.Collect(maps.Keys(m))
	slices.SortFunc(keys, func(a, b string) int { return m[b] - m[a] })
	var out []string
	for _, k := range keys {
		out = append(out, fmt.Sprintf("%s %d", k, m[k]))
	}
	return strings.Join(out, ", ")
}
