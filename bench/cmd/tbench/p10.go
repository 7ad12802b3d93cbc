package main

import (
	"context"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
)

// runP10 compares a jump forwarded between hub replicas with a direct one,
// in the same run: two replicas on one shared store (SQLite file), one
// agent (QUIC) on replica r2 in front of a real sshd. Direct: ssh -J
// through r2, which holds the tunnel. Forwarded: ssh -J through r1, which
// forwards the stream over its peer link to r2. Bulk copy MB/s (best of
// runs) and `ssh -J node true` wall time (median).
func runP10(ctx context.Context, b *bench) error {
	env, err := harness.NewEnv(b.bin)
	if err != nil {
		return err
	}
	env.Keep = b.keep
	defer env.Close()
	node, err := env.StartSSHD(ctx, "node-sshd")
	if err != nil {
		return err
	}
	sshConfig, err := env.SSHConfig(ctx)
	if err != nil {
		return err
	}
	db := env.Path("shared.db")
	var hubs []*harness.Hub
	for i := 1; i <= 2; i++ {
		peer, err := harness.FreePort()
		if err != nil {
			return err
		}
		h, err := env.StartHub(ctx, env.Path(fmt.Sprintf("r%d", i)), "--store", db, "--replica-id", fmt.Sprintf("r%d", i),
			"--peer-listen", fmt.Sprintf("127.0.0.1:%d", peer))
		if err != nil {
			return err
		}
		defer h.Stop(30 * time.Second)
		hubs = append(hubs, h)
	}
	key, _ := env.OperatorKey(ctx)
	// Added on r1; r2 restarts so it has the operator for sure when the
	// runs begin (the change feed would bring it within a second).
	if _, err := hubs[0].Tether(ctx, "operator", "add", "bench", "--key", key+".pub"); err != nil {
		return err
	}
	if _, err := hubs[1].Restart(ctx); err != nil {
		return err
	}
	join, err := hubs[1].Token(ctx, 1)
	if err != nil {
		return err
	}
	if _, err := env.Start("agent", filepath.Join(b.bin, "tether-edge"), "run", "--join", join, "--state-dir", env.Path("n1"),
		"--name", "n1", "--ssh", node.Addr, "--transport", "quic", "--log-level", "warn"); err != nil {
		return err
	}
	if err := harness.WaitFor(ctx, 30*time.Second, "the agent on r2", func() bool {
		n, err := hubs[0].Nodes(ctx)
		return err == nil && n["n1"]
	}); err != nil {
		return err
	}
	login := harness.Login()
	args := func(h *harness.Hub) []string {
		return []string{"-F", sshConfig, "-J", "bench@" + h.SSH, login + "@n1"}
	}
	paths := map[string]*harness.Hub{"direct": hubs[1], "forwarded": hubs[0]}
	order := []string{"direct", "forwarded"}
	for _, mib := range b.sz.p1MiB {
		best := map[string]float64{}
		for range b.sz.p1Runs {
			for _, p := range order {
				v, err := bulkCopy(ctx, args(paths[p]), mib)
				if err != nil {
					return fmt.Errorf("P10 %s: %w", p, err)
				}
				best[p] = max(best[p], v)
			}
		}
		ref := best["direct"]
		b.report.Add(harness.Row{ID: "P10", What: fmt.Sprintf("%d MiB ssh -J copy, direct (entry replica holds the tunnel, reference)", mib),
			Value: fmt.Sprintf("%.0f MB/s", ref), Ref: fmt.Sprintf("%.0f MB/s", ref), Ratio: "1.00×"})
		b.report.Add(harness.Row{ID: "P10", What: fmt.Sprintf("%d MiB ssh -J copy, forwarded over a peer link (best of %d)", mib, b.sz.p1Runs),
			Value: fmt.Sprintf("%.0f MB/s", best["forwarded"]), Ref: fmt.Sprintf("%.0f MB/s", ref), Ratio: harness.Ratio(best["forwarded"], ref)})
	}
	walls := map[string][]time.Duration{}
	for range b.sz.p3Runs {
		for _, p := range order {
			start := time.Now()
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			out, err := exec.CommandContext(cctx, "ssh", append(args(paths[p]), "true")...).CombinedOutput()
			cancel()
			if err != nil {
				return fmt.Errorf("P10 ssh true %s: %w: %s", p, err, out)
			}
			walls[p] = append(walls[p], time.Since(start))
		}
	}
	ref := median(walls["direct"])
	b.report.Add(harness.Row{ID: "P10", What: fmt.Sprintf("ssh -J node true, direct (reference, median of %d)", b.sz.p3Runs),
		Value: ms(ref), Ref: ms(ref), Ratio: "1.00×"})
	v := median(walls["forwarded"])
	b.report.Add(harness.Row{ID: "P10", What: fmt.Sprintf("ssh -J node true, forwarded over a peer link (median of %d)", b.sz.p3Runs),
		Value: ms(v), Ref: ms(ref), Ratio: harness.Ratio(v.Seconds(), ref.Seconds())})
	return nil
}

// bulkCopy pipes mib MiB of zeros through ssh to `cat >/dev/null` and
// returns MB/s.
func bulkCopy(ctx context.Context, sshArgs []string, mib int) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	ssh := "ssh " + strings.Join(quoteAll(sshArgs), " ") + " 'cat >/dev/null'"
	cmd := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("head -c %d /dev/zero | %s", int64(mib)<<20, ssh))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("copy: %w: %s", err, out)
	}
	return mbps(int64(mib)<<20, d), nil
}
