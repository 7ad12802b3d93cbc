package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/bench/internal/sim"
	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel"
)

// runP13 fans a mission out from the root to N simulated agents spread
// evenly over S site hubs: a root and S `tether hub --parent … --site sK`
// processes under it, each site with N/S simulated agents (QUIC, the
// embedded SSH server, label role=pos) held in this process. `tether
// mission create` at the root, placed on every site by the label; measured
// until the root shows every node's run done (the mission stored by each
// site, run by each site's job engine, per-node states aggregated up).
// Reference in the same run: `tether run -l role=pos -- true` at the root,
// a job the root runs itself through the sites' routes to the same nodes.
func runP13(ctx context.Context, b *bench) error {
	if out, err := exec.Command(filepath.Join(b.bin, "tether"), "mission", "--help").CombinedOutput(); err != nil {
		b.report.Note("P13 skipped: `tether mission` is not in this build (%s)", strings.TrimSpace(string(out)))
		return nil
	}
	nSites, total := b.sz.p13Sites, b.sz.p13Agents
	per := total / nSites
	total = per * nSites
	env, err := harness.NewEnv(b.bin)
	if err != nil {
		return err
	}
	env.Keep = b.keep
	defer env.Close()
	dir := env.Path("tree")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	var sites []string
	for k := range nSites {
		sites = append(sites, "s"+strconv.Itoa(k))
	}
	// The sites straight under the root: the fan-out crosses one level,
	// and ten site hubs are what this machine's two cores can hold.
	tr, err := testenv.BuildTree(ctx, testenv.TreeConfig{Bin: b.bin, Dir: dir, Sites: sites, AgentsPerSite: -1,
		NoRegion: true, NoLinks: true, LogLevel: "warn"})
	if err != nil {
		return err
	}
	defer tr.Close()
	hostKey := env.Path("node_host_key")
	var sims []*sim.Sim
	defer func() {
		for _, s := range sims {
			s.Stop()
		}
	}()
	for k, name := range sites {
		h := tr.Sites[name]
		join, err := h.Tether(ctx, "token", "create", "--uses", strconv.Itoa(per), "--ttl", "1h", "--label", "role=pos")
		if err != nil {
			return err
		}
		fleet, err := sim.Enroll(ctx,
			sim.EnrollOptions{JoinString: strings.TrimSpace(join), Prefix: name, Count: per, Parallel: 8})
		if err != nil {
			return fmt.Errorf("P13 enroll at %s: %w", name, err)
		}
		s, err := sim.Start(ctx, sim.Config{Fleet: fleet, Count: per, Transport: tunnel.TransportQUIC, PerSocket: 1000,
			SSHTarget: edge.SSHEmbedded, SSHHostKey: hostKey, IPBase: 40 + k, Ramp: 500,
			BackoffMin: simBackoffMin, BackoffMax: simBackoffMax, Logger: b.agentLog(),
			Configure: func(_ int, c *edge.Config) { c.SSHShell = "/bin/sh" }})
		if err != nil {
			return err
		}
		sims = append(sims, s)
	}
	for _, s := range sims {
		if _, err := s.WaitConnected(ctx, per, time.Duration(per)*20*time.Millisecond+time.Minute); err != nil {
			return err
		}
	}
	// The root shows every simulated node online through the sites'
	// inventories.
	if err := harness.WaitFor(ctx, 2*time.Minute, "the root to list every simulated node online", func() bool {
		nodes, err := tr.Root.Nodes(ctx)
		if err != nil {
			return false
		}
		online := 0
		for _, n := range nodes {
			if n.Online && n.Labels["role"] == "pos" {
				online++
			}
		}
		return online == total
	}); err != nil {
		return fmt.Errorf("P13: %w\n%s", err, tr.Logs(2000))
	}

	script := env.Path("p13.sh")
	if err := os.WriteFile(script, []byte("#!/bin/sh\ntrue\n"), 0o755); err != nil {
		return err
	}
	start := time.Now()
	if _, err := tr.Root.Tether(ctx, "mission", "create", "fanout", "--script", script,
		"--sites", strings.Join(sites, ","), "--match-labels", "role=pos"); err != nil {
		return err
	}
	var last testenv.MissionView
	err = harness.WaitFor(ctx, time.Duration(total)*100*time.Millisecond+2*time.Minute,
		"the root to show the mission applied on every node", func() bool {
			m, err := tr.Root.Mission(ctx, "fanout")
			if err == nil {
				last = m
			}
			return err == nil && m.Total.Applied >= total
		})
	if err != nil {
		return fmt.Errorf("P13: %w (last seen: %+v)\n%s", err, last.Total, tr.Logs(2000))
	}
	mission := time.Since(start)

	// The reference: a job the root runs itself, through the sites.
	start = time.Now()
	_, runErr := tr.Root.Tether(ctx, "run", "-l", "role=pos", "--parallel", "200", "--", "true")
	job := time.Since(start)
	what := fmt.Sprintf("mission fan-out to %d simulated agents over %d site hubs: create at the root → root "+
		"shows every node done", total, nSites)
	if runErr != nil {
		b.report.Add(harness.Row{ID: "P13", What: what, Value: fmt.Sprintf("%.1f s", mission.Seconds())})
		b.report.Note("P13 reference (tether run at the root through the sites) failed: %v", runErr)
		return nil
	}
	b.report.Add(harness.Row{ID: "P13",
		What: fmt.Sprintf("tether run -l role=pos -- true at the root through %d site hubs to %d nodes (reference)",
			nSites, total),
		Value: fmt.Sprintf("%.1f s", job.Seconds()), Ref: fmt.Sprintf("%.1f s", job.Seconds()), Ratio: "1.00×"})
	b.report.Add(harness.Row{ID: "P13", What: what,
		Value: fmt.Sprintf("%.1f s", mission.Seconds()), Ref: fmt.Sprintf("%.1f s", job.Seconds()),
		Ratio: harness.Ratio(mission.Seconds(), job.Seconds())})
	return nil
}
