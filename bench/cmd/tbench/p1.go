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
// run, through a stock OpenSSH bastion. At the first size it also copies
// with an unconfigured ssh (no cipher pin) through the TLS agent and the
// OpenSSH bastion: what an operator's own ssh costs the hub, which the
// pinned figures alone once hid (stock OpenSSH asks for chacha20-poly1305
// first, which x/crypto runs without assembly on amd64).
func runP1(ctx context.Context, b *bench) error {
	s, err := b.jump(ctx)
	if err != nil {
		return err
	}
	cpu := relayCPU{}
	stockRef, stockTCP := stockPath("openssh"), stockPath("tcp")
	for i, mib := range b.sz.p1MiB {
		best := map[string]float64{}
		paths := []string{"openssh", "quic", "tcp"}
		if i == 0 {
			paths = append(paths, stockRef, stockTCP)
		}
		// Interleave the paths so drifting background load hits all alike.
		for range b.sz.p1Runs {
			for _, path := range paths {
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
			b.report.Add(harness.Row{ID: "P1",
				What:  fmt.Sprintf("%d MiB ssh -J copy, %s (best of %d)", mib, pathName(path), b.sz.p1Runs),
				Value: fmt.Sprintf("%.0f MB/s", v), Ref: fmt.Sprintf("%.0f MB/s", ref), Ratio: harness.Ratio(v, ref),
				Target: "≥ 0.75×", Met: harness.YesNo(v >= 0.75*ref)})
		}
		if i == 0 {
			v, ref := best[stockTCP], best[stockRef]
			b.report.Add(harness.Row{ID: "P1",
				What:  fmt.Sprintf("%d MiB ssh -J copy, %s (best of %d)", mib, pathName(stockTCP), b.sz.p1Runs),
				Value: fmt.Sprintf("%.0f MB/s", v), Ref: fmt.Sprintf("%.0f MB/s OpenSSH bastion, stock ssh ciphers", ref),
				Ratio:  harness.Ratio(v, ref),
				Target: "≥ 0.75×", Met: harness.YesNo(v >= 0.75*ref)})
		}
	}
	ref := cpu.perGiB("openssh")
	for _, path := range []string{"quic", "tcp"} {
		b.report.Add(cpuRow("P1", fmt.Sprintf("ssh -J copy, relay CPU per GiB: the tether hub, %s agent (all sizes "+
			"and runs)", pathName(path)), cpu.perGiB(path), ref))
	}
	b.report.Add(cpuRow("P1", fmt.Sprintf("ssh -J copy with stock ssh ciphers (the reference's too), relay CPU "+
		"per GiB: the tether hub, %s agent (first size)", pathName("tcp")),
		cpu.perGiB(stockTCP), cpu.perGiB(stockRef)))
	return nil
}

// copy runs one bulk copy and returns MB/s and the CPU the relay (the
// hub, or the OpenSSH bastion's sshd with its per-connection processes)
// spent on it.
func (s *jumpSetup) copy(ctx context.Context, path string, mib int) (float64, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	base, _ := strings.CutSuffix(path, stockSuffix)
	relay := s.relayPID(base)
	cpu0, err := procCPU(relay)
	if err != nil {
		return 0, 0, err
	}
	ssh := "ssh " + strings.Join(quoteAll(s.jumpArgs(path)), " ") + " 'cat >/dev/null'"
	cmd := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("head -c %d /dev/zero | %s", int64(mib)<<20, ssh))
	var wait func()
	if base != "openssh" {
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
	if base == "openssh" {
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
