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
	if _, err := env.Start("agent", filepath.Join(b.bin, "tether-edge"), "run", "--join", join, "--state-dir",
		env.Path("n1"),
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
	return b.compareJumps(ctx, "P10", args(hubs[1]), args(hubs[0]),
		"direct, the entry replica holding the tunnel", "forwarded over a peer link")
}

// compareJumps measures a jump path against a reference path in the same
// run, alternating between them: the best ssh -J bulk copy of each size
// and the median `ssh … true`, each path given as its ssh arguments.
func (b *bench) compareJumps(
	ctx context.Context, id string, refArgs, pathArgs []string, refWhat, pathWhat string,
) error {
	paths := [][]string{refArgs, pathArgs}
	for _, mib := range b.sz.p1MiB {
		var best [2]float64
		for range b.sz.p1Runs {
			for i, a := range paths {
				v, err := bulkCopy(ctx, a, mib)
				if err != nil {
					return fmt.Errorf("%s copy, %s: %w", id, []string{refWhat, pathWhat}[i], err)
				}
				best[i] = max(best[i], v)
			}
		}
		b.report.Add(harness.Row{ID: id, What: fmt.Sprintf("%d MiB ssh -J copy, %s (reference)", mib, refWhat),
			Value: fmt.Sprintf("%.0f MB/s", best[0]), Ref: fmt.Sprintf("%.0f MB/s", best[0]), Ratio: "1.00×"})
		b.report.Add(harness.Row{ID: id, What: fmt.Sprintf("%d MiB ssh -J copy, %s (best of %d)", mib, pathWhat, b.sz.p1Runs),
			Value: fmt.Sprintf("%.0f MB/s", best[1]), Ref: fmt.Sprintf("%.0f MB/s", best[0]),
			Ratio: harness.Ratio(best[1], best[0])})
	}
	var walls [2][]time.Duration
	for range b.sz.p3Runs {
		for i, a := range paths {
			start := time.Now()
			cctx, cancel := context.WithTimeout(ctx, time.Minute)
			out, err := exec.CommandContext(cctx, "ssh", append(a, "true")...).CombinedOutput()
			cancel()
			if err != nil {
				return fmt.Errorf("%s ssh true, %s: %w: %s", id, []string{refWhat, pathWhat}[i], err, out)
			}
			walls[i] = append(walls[i], time.Since(start))
		}
	}
	ref, v := median(walls[0]), median(walls[1])
	b.report.Add(harness.Row{ID: id,
		What:  fmt.Sprintf("ssh -J node true, %s (reference, median of %d)", refWhat, b.sz.p3Runs),
		Value: ms(ref), Ref: ms(ref), Ratio: "1.00×"})
	b.report.Add(harness.Row{ID: id, What: fmt.Sprintf("ssh -J node true, %s (median of %d)", pathWhat, b.sz.p3Runs),
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
