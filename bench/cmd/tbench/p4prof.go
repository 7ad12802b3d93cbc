package main

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
)

// hubProfiler fetches the idle hub's profiles from bench/cmd/hubprof (the
// same hub with net/http/pprof), when TBENCH_HUB runs it: P4 then says where
// each KiB, goroutine and CPU-second of an idle agent goes.
type hubProfiler struct {
	addr string // hubprof's pprof address
	dir  string // where the profiles are kept
	cpu  chan string
}

// newHubProfiler returns nil unless the hub is hubprof.
func newHubProfiler(hub *harness.Hub, cache string) *hubProfiler {
	if os.Getenv("TBENCH_HUB") == "" {
		return nil
	}
	b, err := os.ReadFile(filepath.Join(hub.DataDir, "hubprof.addr"))
	if err != nil {
		return nil
	}
	dir := filepath.Join(cache, "profiles")
	if os.MkdirAll(dir, 0o700) != nil {
		return nil
	}
	return &hubProfiler{addr: strings.TrimSpace(string(b)), dir: dir}
}

func (p *hubProfiler) fetch(ctx context.Context, path, file string) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+p.addr+path, nil)
	if err != nil {
		return "", err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("hubprof %s: %s", path, resp.Status)
	}
	out := filepath.Join(p.dir, file)
	f, err := os.Create(out)
	if err != nil {
		return "", err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		f.Close()
		return "", err
	}
	return out, f.Close()
}

// startCPU profiles the hub over d in the background.
func (p *hubProfiler) startCPU(ctx context.Context, d time.Duration, name string) {
	p.cpu = make(chan string, 1)
	go func() {
		f, err := p.fetch(ctx, fmt.Sprintf("/debug/pprof/profile?seconds=%d", int(d.Seconds())), name+"-cpu.pb.gz")
		if err != nil {
			f = ""
		}
		p.cpu <- f
	}()
}

// report adds P4 rows for the heap in use by allocation site, goroutines by
// start function, and CPU by function, each per agent.
func (p *hubProfiler) report(ctx context.Context, b *bench, n int, label, name string) {
	add := func(what, value, comment string) {
		b.report.Add(harness.Row{ID: "P4", What: fmt.Sprintf("%d idle agents, %s: %s", n, label, what), Value: value,
			Comment: comment})
	}
	if heap, err := p.fetch(ctx, "/debug/pprof/heap?gc=1", name+"-heap.pb.gz"); err == nil {
		b.log.Info("hub heap profile", "file", heap)
		for _, e := range pprofTop(ctx, heap, "inuse_space", 8) {
			add("heap in use at "+e.fn, fmt.Sprintf("%.2f KiB/agent", e.value/float64(n)/1024),
				fmt.Sprintf("%.1f %% of the heap profile", e.pct))
		}
	}
	if g, err := p.fetch(ctx, "/debug/pprof/goroutine?debug=1", name+"-goroutines.txt"); err == nil {
		for _, e := range goroutinesByStart(g, 5) {
			add("goroutines started at "+e.fn, fmt.Sprintf("%.2f per agent", e.value/float64(n)), "")
		}
	}
	if p.cpu != nil {
		if cpu := <-p.cpu; cpu != "" {
			b.log.Info("hub CPU profile", "file", cpu)
			for _, e := range pprofTop(ctx, cpu, "cpu", 6) {
				add("idle CPU in "+e.fn, fmt.Sprintf("%.1f %%", e.pct), "share of the hub's idle CPU samples (flat)")
			}
		}
		p.cpu = nil
	}
}

type topEntry struct {
	fn    string
	value float64 // bytes, or nanoseconds, or a count
	pct   float64
}

// pprofTop runs `go tool pprof -top` on a profile and returns its first k
// rows (flat).
func pprofTop(ctx context.Context, file, index string, k int) []topEntry {
	out, err := exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount="+strconv.Itoa(k),
		"-sample_index="+index, "-unit=B", file).Output()
	if index == "cpu" {
		out, err = exec.CommandContext(ctx, "go", "tool", "pprof", "-top", "-nodecount="+strconv.Itoa(k), "-unit=ns",
			file).Output()
	}
	if err != nil {
		return nil
	}
	var top []topEntry
	inTable := false
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) >= 5 && f[0] == "flat" {
			inTable = true
			continue
		}
		if !inTable || len(f) < 6 {
			continue
		}
		v, err1 := strconv.ParseFloat(strings.TrimRight(f[0], "Bns"), 64)
		pct, err2 := strconv.ParseFloat(strings.TrimSuffix(f[1], "%"), 64)
		if err1 != nil || err2 != nil {
			continue
		}
		top = append(top, topEntry{fn: shortFn(strings.Join(f[5:], " ")), value: v, pct: pct})
	}
	return top
}

// goroutinesByStart counts the goroutines of a debug=1 goroutine profile by
// the function each was started with (the last frame of its stack).
func goroutinesByStart(file string, k int) []topEntry {
	data, err := os.ReadFile(file)
	if err != nil {
		return nil
	}
	counts := map[string]float64{}
	total := 0.0
	for _, rec := range strings.Split(string(data), "\n\n") {
		lines := strings.Split(strings.TrimSpace(rec), "\n")
		if strings.HasPrefix(lines[0], "goroutine profile:") {
			lines = lines[1:]
		}
		if len(lines) < 2 {
			continue
		}
		head := strings.Fields(lines[0])
		if len(head) < 2 || head[1] != "@" {
			continue
		}
		c, err := strconv.ParseFloat(head[0], 64)
		if err != nil {
			continue
		}
		start := ""
		for _, l := range lines[1:] {
			if f := strings.Fields(l); len(f) >= 3 && f[0] == "#" {
				start = f[2]
			}
		}
		counts[shortFn(start)] += c
		total += c
	}
	var top []topEntry
	for fn, c := range counts {
		top = append(top, topEntry{fn: fn, value: c, pct: c / total * 100})
	}
	slices.SortFunc(top, func(a, b topEntry) int { return cmp.Compare(b.value, a.value) })
	return top[:min(k, len(top))]
}

// shortFn drops the module path prefix and offsets of a function name.
func shortFn(fn string) string {
	if i := strings.LastIndex(fn, "+0x"); i > 0 {
		fn = fn[:i]
	}
	if i := strings.LastIndex(fn, "/"); i >= 0 {
		fn = fn[i+1:]
	}
	return "`" + fn + "`"
}
