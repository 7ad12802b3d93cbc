package main

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/bench/internal/sim"
	"github.com/tether-dev/tether/tunnel"
)

// accessChange is one change of who may do what, made through the real CLI,
// and what every simulated agent must hold once the hub has pushed it.
type accessChange struct {
	what string   // row label
	args []string // tether arguments with agents connected
	ref  []string // the same change for the reference, with no agent connected
	// want is what an agent's authorized keys must satisfy once it has
	// the change; nil: the change concerns no agent.
	want  func(keys []string) bool
	needs string // what the agents need from it, for the report
}

// refFigures are a change's figures with no agent connected.
type refFigures struct{ call, cpu time.Duration }

// idleHub is the hub with the fleet connected and nothing changing.
type idleHub struct {
	goroutines int
	cpuRate    float64 // cores
}

// p8Quiet is how long no push may arrive before a change counts as over,
// and p8Idle how long the hub's idle CPU rate is measured (at 10k agents it
// is some 40 % of a core, subtracted from every change): shorter for the
// small fleets of `make test`, whose pushes end within milliseconds.
func p8Quiet(n int) time.Duration {
	if n < 1000 {
		return time.Second
	}
	return 3 * time.Second
}

func p8Idle(n int) time.Duration {
	if n < 1000 {
		return time.Second
	}
	return 10 * time.Second
}

// runP8 times an access change on a hub holding the fleet: an operator
// added and a role edited, per transport, until every simulated agent holds
// the new authorized keys; the hub's CPU for it; and the pushes agents got
// that changed nothing for them. The same changes made with no agent
// connected are the reference.
func runP8(ctx context.Context, b *bench) error {
	env, err := harness.NewEnv(b.bin)
	if err != nil {
		return err
	}
	env.Keep = b.keep
	defer env.Close()
	n := b.sz.p8Agents
	cached, fleet, err := b.fleet(ctx, env, n)
	if err != nil {
		return err
	}
	hostKey := env.Path("node-host-key")
	if _, err := harness.Run(
		ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "p8-node", "-f", hostKey,
	); err != nil {
		return err
	}
	for _, tr := range b.p8Transports {
		if err := b.roleEdit(ctx, env, cached, fleet, tr, n, hostKey); err != nil {
			return fmt.Errorf("%v: %w", tr, err)
		}
	}
	return nil
}

func (b *bench) roleEdit(
	ctx context.Context, env *harness.Env, cached string, fleet *sim.Fleet, tr tunnel.Transport, n int, hostKey string,
) error {
	name := tr.String()
	// A copy of the fleet's hub: the operators and roles added here must
	// not reach the cache that later runs and scenarios start from.
	dataDir := env.Path("p8-hub-" + name)
	if err := copyDir(cached, dataDir); err != nil {
		return err
	}
	keys := map[string]string{} // operator -> public key blob (base64)
	for _, op := range []string{"p8-ref", "p8-new"} {
		p := env.Path(op + "-" + name)
		if _, err := harness.Run(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", op, "-f", p); err != nil {
			return err
		}
		pub, err := os.ReadFile(p + ".pub")
		if err != nil {
			return err
		}
		f := strings.Fields(string(pub))
		if len(f) < 2 {
			return fmt.Errorf("unreadable public key %s.pub", p)
		}
		keys[op] = f[1]
	}
	hub, err := env.StartHub(ctx, dataDir)
	if err != nil {
		return err
	}
	defer hub.Stop(60 * time.Second)
	fleet.SetHub(hub.Listen)

	// Role p8 selects every simulated node (all joined with bench=fleet);
	// p8-none selects none of them.
	for _, args := range [][]string{
		{"role", "create", "p8", "--nodes", "bench=fleet", "--logins", "root"},
		{"role", "create", "p8-none", "--nodes", "bench=none", "--logins", "root"},
	} {
		if _, err := hub.Tether(ctx, args...); err != nil {
			return err
		}
	}
	line := func(op string, cond func(string) bool) func([]string) bool {
		return func(ks []string) bool {
			for _, k := range ks {
				if strings.Contains(k, " "+keys[op]+" ") && cond(k) {
					return true
				}
			}
			return false
		}
	}
	changes := []accessChange{
		{what: "operator added (its role selects every node)",
			args:  []string{"operator", "add", "p8-new", "--key", env.Path("p8-new-" + name + ".pub"), "--role", "p8"},
			ref:   []string{"operator", "add", "p8-ref", "--key", env.Path("p8-ref-" + name + ".pub"), "--role", "p8"},
			want:  line("p8-new", func(string) bool { return true }),
			needs: "every agent needs the new authorized keys, none a new SSH trust"},
		{what: "role edited (a login added to a role selecting every node)",
			args: []string{"role", "create", "p8", "--nodes", "bench=fleet", "--logins", "root,ref,edited"},
			ref:  []string{"role", "create", "p8", "--nodes", "bench=fleet", "--logins", "root,ref"},
			want: line("p8-new", func(k string) bool {
				opts, _, _ := strings.Cut(k, " ") // tether-logins="…" before the key
				return strings.HasPrefix(opts, "tether-logins=") && strings.Contains(opts, "edited")
			}),
			needs: "every agent needs new authorized keys and new principals"},
		{what: "role edited that selects no connected node",
			args:  []string{"role", "create", "p8-none", "--nodes", "bench=none", "--logins", "root,ref,edited"},
			ref:   []string{"role", "create", "p8-none", "--nodes", "bench=none", "--logins", "root,ref"},
			needs: "no agent needs any push"},
	}

	// The reference: each change with no agent connected.
	refs := make([]refFigures, len(changes))
	for i, c := range changes {
		st0, err := harness.Stats(hub.PID())
		if err != nil {
			return err
		}
		t0 := time.Now()
		if _, err := hub.Tether(ctx, c.ref...); err != nil {
			return err
		}
		call := time.Since(t0)
		time.Sleep(p8Quiet(0)) // pushes (to no one) may run after the call returns
		st1, err := harness.Stats(hub.PID())
		if err != nil {
			return err
		}
		refs[i] = refFigures{call, st1.CPU - st0.CPU}
	}

	// A gentler ramp than P4's: on a shared 2-core machine a faster one
	// makes the hub refuse handshakes and drop starved sessions, and the
	// fleet churns instead of settling (what is timed here is not the
	// ramp-up but the change after it).
	s, err := sim.Start(ctx, sim.Config{Fleet: fleet, Count: n, Transport: tr, PerSocket: 1000, Ramp: 1000,
		SSHDHostKey: hostKey, BackoffMin: simBackoffMin, BackoffMax: simBackoffMax, Logger: b.agentLog()})
	if err != nil {
		return err
	}
	defer s.Stop()
	start := time.Now()
	if err := harness.WaitFor(ctx, time.Duration(n)*30*time.Millisecond+2*time.Minute,
		fmt.Sprintf("%d %s agents to connect", n, name),
		func() bool { return s.Connected() >= n }); err != nil {
		return fmt.Errorf("%w (%d connected, hub: %s)", err, s.Connected(), hub.Tail(500))
	}
	b.log.Info("fleet connected", "transport", name, "agents", n, "took", time.Since(start).Round(time.Millisecond))
	if err := harness.WaitFor(ctx, time.Minute, "the hub to count every agent", func() bool {
		c, err := hub.Connected(ctx, name)
		return err == nil && c >= n
	}); err != nil {
		return err
	}
	// Every agent got its keys and trust on connect: wait for those pushes
	// to end, then take the hub's idle CPU rate, which is subtracted from
	// the CPU of each change (keepalives and heartbeats go on meanwhile).
	s.Watch(nil)
	if err := b.waitQuiet(ctx, hub, s, time.Now(), -1, n); err != nil {
		return err
	}
	m, err := hub.Metrics(ctx)
	if err != nil {
		return err
	}
	idle := idleHub{goroutines: int(m["go_goroutines"])}
	idle0, err := harness.Stats(hub.PID())
	if err != nil {
		return err
	}
	tIdle := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(p8Idle(n)):
	}
	idle1, err := harness.Stats(hub.PID())
	if err != nil {
		return err
	}
	idle.cpuRate = (idle1.CPU - idle0.CPU).Seconds() / time.Since(tIdle).Seconds()

	for i, c := range changes {
		if err := b.timeChange(ctx, hub, s, c, refs[i], idle, n, name); err != nil {
			return err
		}
	}
	return nil
}

// timeChange makes change c with the fleet connected and reports how long
// until every agent holds it, the hub's CPU for it and the pushes not needed.
func (b *bench) timeChange(
	ctx context.Context, hub *harness.Hub, s *sim.Sim, c accessChange, ref refFigures, idle idleHub, n int, name string,
) error {
	drops0 := s.Drops()
	s.Watch(c.want)
	st0, err := harness.Stats(hub.PID())
	if err != nil {
		return err
	}
	t0 := time.Now()
	if _, err := hub.Tether(ctx, c.args...); err != nil {
		return err
	}
	t1 := time.Now()
	var all, fromStart time.Duration
	if c.want != nil {
		if err := harness.WaitFor(ctx, 10*time.Minute, fmt.Sprintf("every %s agent to hold the new keys", name), func() bool {
			return s.Pushes().Have >= n
		}); err != nil {
			return fmt.Errorf("%w (%d of %d have them)", err, s.Pushes().Have, n)
		}
		last := s.Pushes().Last
		all, fromStart = max(0, last.Sub(t1)), last.Sub(t0)
	}
	if err := b.waitQuiet(ctx, hub, s, t1, idle.goroutines, n); err != nil {
		return err
	}
	st1, err := harness.Stats(hub.PID())
	if err != nil {
		return err
	}
	window := time.Since(t0)
	ps := s.Pushes()
	cpu := (st1.CPU - st0.CPU).Seconds() - idle.cpuRate*window.Seconds()
	pushedFor := time.Duration(0)
	if !ps.LastPush.IsZero() {
		pushedFor = ps.LastPush.Sub(t1)
	}
	label := fmt.Sprintf("%d agents, %s: %s", n, pathName(name), c.what)
	call := fmt.Sprintf("the API call (tether CLI) took %d ms (%d ms with no agent)", t1.Sub(t0).Milliseconds(),
		ref.call.Milliseconds())
	if dropped := s.Drops() - drops0; dropped > 0 {
		call += fmt.Sprintf("; %d agents reconnected meanwhile (their connect pushes are counted)", dropped)
	}
	if c.want != nil {
		b.report.Add(harness.Row{ID: "P8", What: label + ": time until every agent holds the new keys",
			Value: fmt.Sprintf("%.2f s", all.Seconds()), Ref: fmt.Sprintf("0 agents: %.2f s API call", ref.call.Seconds()),
			Comment: fmt.Sprintf("from the API call returning (0: all had them before the CLI exited); %.2f s from "+
				"the call's start; %s", fromStart.Seconds(), call)})
	}
	b.report.Add(harness.Row{ID: "P8", What: label + ": hub CPU",
		Value: fmt.Sprintf("%.2f CPU-s", max(cpu, 0)), Ref: fmt.Sprintf("0 agents: %.2f CPU-s", ref.cpu.Seconds()),
		Comment: fmt.Sprintf("%.2f ms per agent; %.2f CPU-s over %.1f s less the idle rate %.1f %% of a core; last "+
			"push %.2f s after the call returned; %s",
			max(cpu, 0)*1000/float64(n), (st1.CPU - st0.CPU).Seconds(), window.Seconds(), idle.cpuRate*100,
			pushedFor.Seconds(), call)})
	b.report.Add(harness.Row{ID: "P8", What: label + ": agents pushed to that needed nothing; pushes not needed",
		Value: fmt.Sprintf("%d of %d agents; %d of %d pushes", ps.AgentsNeedless, n,
			ps.KeysUnchanged+ps.TrustUnchanged, ps.Keys+ps.Trust), Ref: "0",
		Comment: fmt.Sprintf("%s; pushes received: %d authorized keys (%d unchanged), %d SSH trust (%d unchanged "+
			"but for a re-signed host certificate)",
			c.needs, ps.Keys, ps.KeysUnchanged, ps.Trust, ps.TrustUnchanged)})
	return nil
}

// waitQuiet waits until the hub is done with a change: no push has reached
// an agent for p8Quiet (counted from since when none has come at all) and,
// unless idleG is negative, the hub's goroutines are back to idleG (plus 1 %
// of n for the fleet's own comings and goings). The goroutines matter: a hub
// whose pushes queue on its database sends in bursts with long gaps, which
// no quiet period alone tells from the end.
func (b *bench) waitQuiet(ctx context.Context, hub *harness.Hub, s *sim.Sim, since time.Time, idleG, n int) error {
	quiet := p8Quiet(n)
	g := -1
	var scraped time.Time
	err := harness.WaitFor(ctx, 10*time.Minute, "the hub's pushes to end", func() bool {
		last := s.Pushes().LastPush
		if last.Before(since) {
			last = since
		}
		if time.Since(last) < quiet {
			return false
		}
		if idleG < 0 {
			return true
		}
		// A scrape costs the hub CPU that is being measured: one a second.
		if time.Since(scraped) < time.Second {
			return false
		}
		scraped = time.Now()
		m, err := hub.Metrics(ctx)
		if err != nil {
			return false
		}
		g = int(m["go_goroutines"])
		return g <= idleG+max(50, n/100)
	})
	if err != nil {
		return fmt.Errorf("%w (hub goroutines %d, %d when idle)", err, g, idleG)
	}
	return nil
}

// copyDir copies the regular files under src to dst, keeping their modes
// (the hub refuses key files others may read).
func copyDir(src, dst string) error {
	return filepath.WalkDir(src, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, p)
		if err != nil {
			return err
		}
		to := filepath.Join(dst, rel)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.MkdirAll(to, info.Mode().Perm())
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		in, err := os.Open(p)
		if err != nil {
			return err
		}
		defer in.Close()
		out, err := os.OpenFile(to, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, info.Mode().Perm())
		if err != nil {
			return err
		}
		if _, err := io.Copy(out, in); err != nil {
			out.Close()
			return fmt.Errorf("copy %s: %w", p, err)
		}
		return out.Close()
	})
}
