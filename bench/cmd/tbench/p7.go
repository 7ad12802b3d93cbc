package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
)

// runP7 measures the agent's footprint: the size of the stripped binary
// `make build` produces, and the idle RSS and CPU of a connected agent (one
// per transport) over the idle window; then, for reference, the RSS after
// the agent served one `ssh -J node true` (code the idle agent never ran).
func runP7(ctx context.Context, b *bench) error {
	fi, err := os.Stat(filepath.Join(b.bin, "tether-edge"))
	if err != nil {
		return err
	}
	size := fi.Size()
	b.report.Add(harness.Row{ID: "P7", What: "tether-edge binary size (static, stripped: make build)",
		Value: fmt.Sprintf("%.1f MB (%.1f MiB)", float64(size)/1e6, float64(size)/(1<<20)), Target: "≤ 12 MB",
		Met: harness.YesNo(size <= 12e6)})

	// Fresh agents: the shared ones have moved gigabytes (P1, P2).
	s, err := newJumpSetup(ctx, b)
	if err != nil {
		return err
	}
	defer s.Close()
	// Let start-up work (key pushes, certificate, first heartbeat) pass.
	settle := min(10*time.Second, b.sz.p7Idle)
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(settle):
	}
	before := map[string]harness.ProcStats{}
	for _, t := range transports {
		st, err := harness.Stats(s.agents[t].PID())
		if err != nil {
			return err
		}
		before[t] = st
	}
	start := time.Now()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(b.sz.p7Idle):
	}
	wall := time.Since(start)
	for _, t := range transports {
		st, err := harness.Stats(s.agents[t].PID())
		if err != nil {
			return err
		}
		cpu := (st.CPU - before[t].CPU).Seconds() / wall.Seconds() * 100
		if anon, file, err := rssSplit(s.agents[t].PID()); err == nil {
			b.report.Add(harness.Row{ID: "P7",
				What: fmt.Sprintf("idle agent RSS split, %s: anonymous (heap, stacks) / file-backed (the binary's pages)",
					pathName(t)),
				Value: fmt.Sprintf("%.1f MiB / %.1f MiB", float64(anon)/(1<<20), float64(file)/(1<<20)),
				Comment: "the file-backed part is clean page cache shared with every process mapping the binary; the " +
					"agent drops its mappings of the start-up pages 5 s after it connects, so this part is what it touched since"})
		}
		b.report.Add(harness.Row{ID: "P7",
			What:  fmt.Sprintf("idle agent RSS, %s (connected, after %v)", pathName(t), (settle + wall).Round(time.Second)),
			Value: fmt.Sprintf("%.1f MiB", float64(st.RSS)/(1<<20)), Target: "≤ 10 MiB", Met: harness.YesNo(st.RSS <= 10<<20)})
		b.report.Add(harness.Row{ID: "P7",
			What:  fmt.Sprintf("idle agent CPU, %s (over %v; /proc ticks are 10 ms)", pathName(t), wall.Round(time.Second)),
			Value: fmt.Sprintf("%.3f %%", cpu), Target: "< 0.1 %", Met: harness.YesNo(cpu < 0.1)})
	}
	for _, t := range transports {
		if _, err := s.sshTrue(ctx, t); err != nil {
			return err
		}
	}
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(2 * time.Second):
	}
	for _, t := range transports {
		st, err := harness.Stats(s.agents[t].PID())
		if err != nil {
			return err
		}
		anon, file, err := rssSplit(s.agents[t].PID())
		if err != nil {
			return err
		}
		b.report.Add(harness.Row{ID: "P7",
			What:  fmt.Sprintf("agent RSS after serving one ssh -J true, %s (anonymous / file-backed)", pathName(t)),
			Value: fmt.Sprintf("%.1f MiB", float64(st.RSS)/(1<<20)),
			Comment: fmt.Sprintf("%.1f MiB / %.1f MiB: the SSH code's pages, mapped back from the page cache",
				float64(anon)/(1<<20), float64(file)/(1<<20))})
	}
	return nil
}

// rssSplit reads a process's anonymous and file-backed resident memory
// from /proc/PID/smaps_rollup.
func rssSplit(pid int) (anon, file int64, err error) {
	f, err := os.Open(fmt.Sprintf("/proc/%d/smaps_rollup", pid))
	if err != nil {
		return 0, 0, err
	}
	defer f.Close()
	var rss int64
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 2 {
			continue
		}
		kb, perr := strconv.ParseInt(fields[1], 10, 64)
		if perr != nil {
			continue
		}
		switch fields[0] {
		case "Rss:":
			rss = kb << 10
		case "Anonymous:":
			anon = kb << 10
		}
	}
	if err := sc.Err(); err != nil {
		return 0, 0, err
	}
	return anon, rss - anon, nil
}
