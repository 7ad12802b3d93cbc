package main

import (
	"context"
	"fmt"
	"os/exec"
	"slices"
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
	if err := s.startPlain(ctx, b); err != nil {
		return err
	}
	cpu := relayCPU{}
	cmp := newResumeCmp("P1")
	// Both hubs' tether_resume_buffered_bytes are sampled alike, so that
	// the scrapes cost both the same; the plain hub's stays 0.
	const every = 500 * time.Millisecond
	watched := map[*harness.Hub]*bufferedWatch{s.hub: {}, s.plain.hub: {}}
	stockRef, stockTCP := stockPath("openssh"), stockPath("tcp")
	rounds := max(b.sz.p1Runs, resumeRounds(b.sz))
	for i, mib := range b.sz.p1MiB {
		best := map[string]float64{}
		cmp.reset()
		// Interleave the paths so drifting background load hits all alike.
		// The rounds past p1Runs copy only the resumable and plain paths.
		for r := range rounds {
			var paths []string
			if r < b.sz.p1Runs {
				paths = append(paths, "openssh")
			}
			for _, t := range transports {
				paths = append(paths, resumeOrder(t, r)...)
			}
			if i == 0 && r < b.sz.p1Runs {
				paths = append(paths, stockRef, stockTCP)
			}
			for _, path := range paths {
				var stop func()
				if base, _ := strings.CutSuffix(path, stockSuffix); base != "openssh" {
					stop = watched[s.hubOf(base)].watch(ctx, s.hubOf(base), every)
				}
				v, c, ac, err := s.copy(ctx, path, mib)
				if stop != nil {
					stop()
				}
				if err != nil {
					return err
				}
				bytes := int64(mib) << 20
				if strings.HasSuffix(path, plainSuffix) || slices.Contains(transports, path) {
					cmp.record(path, v, c, ac, bytes)
				}
				if r < b.sz.p1Runs {
					best[path] = max(best[path], v)
				}
				if !strings.HasSuffix(path, plainSuffix) {
					cpu.add(path, c, bytes)
				}
			}
			cmp.endRound()
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
		for _, row := range cmp.rows(fmt.Sprintf("%d MiB ssh -J copy", mib)) {
			b.report.Add(row)
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
	for _, row := range cmp.cpuRows("ssh -J copy (all sizes and runs)") {
		b.report.Add(row)
	}
	b.report.Add(bufferedRow(ctx, "P1", s.hub, watched[s.hub], every))
	if w := watched[s.plain.hub]; w.peak > 0 || w.err != nil {
		b.report.Note("P1: the hub with --resume-window 0 kept %.0f bytes for resumable streams (err %v): its "+
			"streams were not plain, the comparison is void", w.peak, w.err)
	}
	return nil
}

// copy runs one bulk copy and returns MB/s, the CPU the relay (the hub, or
// the OpenSSH bastion's sshd with its per-connection processes) spent on
// it, and the agent's (0 for the OpenSSH bastion).
func (s *jumpSetup) copy(ctx context.Context, path string, mib int) (float64, time.Duration, time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	base, _ := strings.CutSuffix(path, stockSuffix)
	relay, agent := s.relayPID(base), s.agentPID(base)
	cpu0, err := procCPU(relay)
	if err != nil {
		return 0, 0, 0, err
	}
	var agent0 time.Duration
	if agent != 0 {
		if agent0, err = procCPU(agent); err != nil {
			return 0, 0, 0, err
		}
	}
	ssh := "ssh " + strings.Join(quoteAll(s.jumpArgs(path)), " ") + " 'cat >/dev/null'"
	cmd := exec.CommandContext(ctx, "sh", "-c", fmt.Sprintf("head -c %d /dev/zero | %s", int64(mib)<<20, ssh))
	var wait func()
	if base != "openssh" {
		// The copy's expected length at the last MB/s seen is unknown;
		// a few seconds of it is what the profile needs.
		wait = profileHub(ctx, s.hubOf(base), fmt.Sprintf("p1-ssh-J-%s-%dMiB", path, mib), 5*time.Second)
	}
	start := time.Now()
	out, err := cmd.CombinedOutput()
	d := time.Since(start)
	if wait != nil {
		wait()
	}
	if err != nil {
		return 0, 0, 0, fmt.Errorf("P1 copy through %s: %w: %s", pathName(path), err, out)
	}
	if base == "openssh" {
		if err := waitChildrenGone(ctx, relay); err != nil {
			return 0, 0, 0, err
		}
	}
	cpu1, err := procCPU(relay)
	if err != nil {
		return 0, 0, 0, err
	}
	var agent1 time.Duration
	if agent != 0 {
		if agent1, err = procCPU(agent); err != nil {
			return 0, 0, 0, err
		}
	}
	return mbps(int64(mib)<<20, d), cpu1 - cpu0, agent1 - agent0, nil
}

// relayPID is the process relaying path's connections: the OpenSSH
// bastion's sshd listener, or the hub (the plain one for a plainPath).
func (s *jumpSetup) relayPID(path string) int {
	if path == "openssh" {
		return s.bastion.Cmd.Process.Pid
	}
	return s.hubOf(path).Cmd.Process.Pid
}

func quoteAll(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return out
}
