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
	cpu := relayCPU{}
	for _, mib := range b.sz.p1MiB {
		best := map[string]float64{}
		// Interleave the paths so drifting background load hits all alike.
		for range b.sz.p1Runs {
			for _, path := range []string{"openssh", "quic", "tcp"} {
				v, c, err := s.copy(ctx, path, mib)
				if err != nil {
					return err
				}
				best[path] = max(best[path], v)
				cpu.add(path, c, int64(mib)<<20)
			}
		}
		ref := best["openssh"]
		b.report.Add(harness.Row{ID: "P1", What: fmt.Sprintf("%d MiB ssh -J copy, OpenSSH bastion (reference)", mib),
			Value: fmt.Sprintf("%.0f MB/s", ref), Ref: fmt.Sprintf("%.0f MB/s", ref), Ratio: "1.00×"})
		for _, path := range []string{"quic", "tcp"} {
			v := best[path]
			b.report.Add(harness.Row{ID: "P1", What: fmt.Sprintf("%d MiB ssh -J copy, %s (best of %d)", mib, pathName(path), b.sz.p1Runs),
				Value: fmt.Sprintf("%.0f MB/s", v), Ref: fmt.Sprintf("%.0f MB/s", ref), Ratio: harness.Ratio(v, ref),
				Target: "≥ 0.75×", Met: harness.YesNo(v >= 0.75*ref)})
		}
	}
	ref := cpu.perGiB("openssh")
	for _, path := range []string{"quic", "tcp"} {
		b.report.Add(cpuRow("P1", fmt.Sprintf("ssh -J copy, relay CPU per GiB: the tether hub, %s agent (all sizes and runs)", pathName(path)), cpu.perGiB(path), ref))
	}
	return nil
}

// copy runs one bulk copy and returns MB/s and the CPU the relay (the
// hub, or the OpenSSH bastion's sshd with its per-connection processes)
// spent on it.
func (s *jumpSetup) copy(ctx context.Context, path string, mib int) (float64, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	relay := s.relayPID(path)
	cpu0, err := procCPU(relay)
	if err != nil {
		return 0, 0, err
	}
	ssh := "ssh " + strings.Join(quoteAll(s.jumpArgs(path)), " ") + " 'cat >/dev/null'"
	cmd := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("head -c %d /dev/zero | %s", int64(mib)<<20, ssh))
	var wait func()
	if path != "openssh" {
		// The copy's expected length at the last MB/s seen is unknown;
		// a few seconds of it is what the profile needs.
		wait = profileHub(ctx, fmt.Sprintf("p1-ssh-J-%s-%dMiB", path, mib), 5*time.Second)
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(start)
	if wait != nil {
		wait()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("P1 copy through %s: %w: %s", pathName(path), err, out)
	}
	if path == "openssh" {
		if err := waitChildrenGone(ctx, relay); err != nil {
			return 0, 0, err
		}
	}
	cpu1, err := procCPU(relay)
	if err != nil {
		return 0, 0, err
	}
	return mbps(int64(mib)<<20, d), cpu1 - cpu0, nil
}

// relayPID is the process relaying path's connections: the OpenSSH
// bastion's sshd listener, or the hub.
func (s *jumpSetup) relayPID(path string) int {
	if path == "openssh" {
		return s.bastion.Cmd.Process.Pid
	}
	return s.hub.Cmd.Process.Pid
}

func quoteAll(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return out
}
