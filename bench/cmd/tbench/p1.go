package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
)

// runP1 copies SIZE MiB with `ssh -J HUB NODE 'cat >/dev/null'` (aes128-gcm)
// to a real loopback sshd through each tether transport and, in the same
// run, through a stock OpenSSH bastion.
func runP1(ctx context.Context, b *bench) error {
	s, err := b.jump(ctx)
	if err != nil {
		return err
	}
	for _, mib := range b.sz.p1MiB {
		best := map[string]float64{}
		// Interleave the paths so drifting background load hits all alike.
		for range b.sz.p1Runs {
			for _, path := range []string{"openssh", "quic", "tcp"} {
				v, err := s.copy(ctx, path, mib)
				if err != nil {
					return err
				}
				best[path] = max(best[path], v)
			}
		}
		ref := best["openssh"]
		b.report.Add(harness.Row{ID: "P1", What: fmt.Sprintf("%d MiB ssh -J copy, OpenSSH bastion (reference)", mib),
			Value: fmt.Sprintf("%.0f MB/s", ref), Ref: fmt.Sprintf("%.0f MB/s", ref), Ratio: "1.00×"})
		for _, path := range []string{"quic", "tcp"} {
			v := best[path]
			b.report.Add(harness.Row{ID: "P1", What: fmt.Sprintf("%d MiB ssh -J copy, %s (best of %d)", mib, pathName(path), b.sz.p1Runs),
				Value: fmt.Sprintf("%.0f MB/s", v), Ref: fmt.Sprintf("%.0f MB/s", ref), Ratio: harness.Ratio(v, ref),
				Target: "≥ 1.5×", Met: harness.YesNo(v >= 1.5*ref)})
		}
	}
	return nil
}

// copy runs one bulk copy and returns MB/s.
func (s *jumpSetup) copy(ctx context.Context, path string, mib int) (float64, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	ssh := "ssh " + strings.Join(quoteAll(s.jumpArgs(path)), " ") + " 'cat >/dev/null'"
	cmd := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("head -c %d /dev/zero | %s", int64(mib)<<20, ssh))
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("P1 copy through %s: %w: %s", pathName(path), err, out)
	}
	return mbps(int64(mib)<<20, d), nil
}

func quoteAll(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return out
}
