// Command tbench runs Tether's benchmark scenarios (P1..P13, F1 of bench/README.md)
// side by side with their references, measured in the same run, prints one
// table row per measurement and appends the table with the machine details
// to bench/RESULTS.md.
//
//	tbench [-size tiny|quick|full|max] [-results FILE|-] [-bin DIR] p1 p2 ... | all
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net/http"
	_ "net/http/pprof" // -pprof profiles the simulated agents
	"os"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/tunnel"
)

// sizes scale every scenario: tiny is what `make test` runs (seconds),
// quick is `make bench-quick` (about seven minutes on 2 cores for all
// thirteen scenarios), full is `make bench`.
type sizes struct {
	name string

	p1MiB        []int // copy sizes
	p1Runs       int   // best of
	p2Secs       float64
	p3Runs       int // ssh -J true runs
	p3Opens      int // stream opens
	p4Counts     []int
	p4TCPMax     int           // TCP agents are limited by the hub's file descriptors
	p4Settle     time.Duration // from the last agent connected to the idle window
	p4Idle       time.Duration
	p5Counts     []int
	p6Nodes      []int
	p6Upload     int  // bytes
	p6Ansible    bool // run the Ansible reference (slow: about half a second per node here)
	p6AnsibleMax int  // largest fan-out Ansible runs at
	p7Idle       time.Duration
	p8Agents     int // agents connected while access changes
	p9Agents     int // simulated agents an agent upgrade rolls out to
	p11Agents    int // simulated agents spread over three hub replicas
	p13Sites     int // site hubs under the root
	p13Agents    int // simulated agents spread over them
}

var profiles = map[string]sizes{
	"tiny": {name: "tiny", p1MiB: []int{8}, p1Runs: 1, p2Secs: 0.5, p3Runs: 2, p3Opens: 5,
		p4Counts: []int{20}, p4TCPMax: 20, p4Settle: 2 * time.Second, p4Idle: 2 * time.Second, p5Counts: []int{20},
		p6Nodes: []int{3}, p6Upload: 64 << 10, p7Idle: 2 * time.Second, p8Agents: 20, p9Agents: 10, p11Agents: 150,
		p13Sites: 2, p13Agents: 20},
	// tiny skips Ansible (ten seconds even for three nodes): make test
	// checks that the scenarios run, not the reference.
	"quick": {name: "quick", p1MiB: []int{256}, p1Runs: 1, p2Secs: 2, p3Runs: 10, p3Opens: 50,
		p4Counts: []int{2000}, p4TCPMax: 2000, p4Settle: 10 * time.Second, p4Idle: 10 * time.Second, p5Counts: []int{2000},
		p6Nodes: []int{50}, p6Upload: 1 << 20, p6Ansible: true, p6AnsibleMax: 50, p7Idle: 10 * time.Second,
		p8Agents: 2000, p9Agents: 100, p11Agents: 1500, p13Sites: 5, p13Agents: 200},
	// full is what fits in 30 minutes on a 2-core machine, where the
	// simulator's side of every handshake and session shares the cores with
	// the hub: 10k agents per transport (about 90 s to connect each way),
	// Ansible at 100 nodes only (1,000 would take it some 25 minutes).
	"full": {name: "full", p1MiB: []int{1024, 4096}, p1Runs: 3, p2Secs: 5, p3Runs: 50, p3Opens: 200,
		p4Counts: []int{10000}, p4TCPMax: 18000, p4Settle: 30 * time.Second, p4Idle: 2 * time.Minute, p5Counts: []int{10000},
		p6Nodes: []int{100, 1000}, p6Upload: 1 << 20, p6Ansible: true, p6AnsibleMax: 100, p7Idle: 60 * time.Second,
		p8Agents: 10000, p9Agents: 1000, p11Agents: 30000, p13Sites: 10, p13Agents: 1000},
	// max is full with the fleet sizes of the targets (10k, 50k, 100k
	// agents; storms of 10k and 100k): for a machine with 8+ cores and
	// 32+ GiB and an open-files limit above 200k (make bench BENCH_SIZE=max).
	"max": {name: "max", p1MiB: []int{1024, 4096}, p1Runs: 3, p2Secs: 5, p3Runs: 50, p3Opens: 200,
		p4Counts: []int{10000, 50000, 100000}, p4TCPMax: 100000, p4Settle: 30 * time.Second, p4Idle: 2 * time.Minute,
		p5Counts: []int{10000, 100000},
		p6Nodes:  []int{100, 1000}, p6Upload: 1 << 20, p6Ansible: true, p6AnsibleMax: 1000, p7Idle: 60 * time.Second,
		p8Agents: 10000, p9Agents: 1000, p11Agents: 30000, p13Sites: 10, p13Agents: 1000},
}

type scenario struct {
	id   string
	what string
	run  func(ctx context.Context, b *bench) error
}

var scenarios = []scenario{
	{"p1", "bulk copy through ssh -J vs OpenSSH -J", runP1},
	{"p2", "single TCP stream through hub + agent vs direct TCP and socat", runP2},
	{"p3", "ssh -J true wall time and stream-open latency vs OpenSSH -J", runP3},
	{"p4", "idle agents held by one hub: memory, goroutines, CPU", runP4},
	{"p5", "reconnect storm after a hub restart", runP5},
	{"p6", "fan-out `true` and a 1 MiB upload vs Ansible", runP6},
	{"p7", "agent footprint: binary size, idle RSS and CPU", runP7},
	{"p8", "role edit / operator add under N connected agents: time until all hold the new keys, hub CPU", runP8},
	{"p9", "agent upgrade rollout (batch 10%) vs scp through an OpenSSH bastion: " +
		"wall, hub CPU, registry bytes, bytes pushed", runP9},
	{"p10", "a jump forwarded between hub replicas vs a direct one: bulk copy and ssh -J true", runP10},
	{"p11", "simulated agents spread over three hub replicas on PostgreSQL: " +
		"agents held, RSS and idle CPU per replica, ramp-up", runP11},
	{"p12", "a jump from the root to a leaf two site levels down vs a direct jump at the site hub: " +
		"bulk copy and ssh -J true", runP12},
	{"p13", "mission fan-out from the root to simulated agents spread over site hubs vs tether run through them", runP13},
	// Run by name only: its runs last as long as the failures take to be
	// noticed (minutes at the defaults), not as long as the load.
	{"f1", "failures: time to notice and to recover, per failure and agent transport (not in all)", runF1},
}

// byNameOnly are the scenarios "all" leaves out.
var byNameOnly = map[string]bool{"f1": true}

// bench is what every scenario gets.
type bench struct {
	sz      sizes
	bin     string
	cache   string // fleet cache directory
	keep    bool
	report  *harness.Report
	log     *slog.Logger
	results string
	verbose bool
	shared  *jumpSetup // P1-P3's processes
	runsP5  bool       // P5 is also wanted: P4's ramp-up does it on the way
	ranP45  bool

	p8Transports []tunnel.Transport // -p8-transports
}

func main() {
	// Commands on the nodes (P6's `true`, the sshd sessions of P1-P3, and
	// Ansible's modules alike) run in a plain POSIX shell: a developer's
	// interactive bash start-up (pyenv, conda, nvm) would be measured
	// instead of Tether, and could stall every node on its own locks.
	_ = os.Setenv("SHELL", "/bin/sh")
	size := flag.String("size", "full",
		"tiny (make test), quick (make bench-quick), full (make bench: fits 30 minutes on 2 cores) or max (the "+
			"target fleet sizes: 100k agents)")
	results := flag.String("results", "bench/RESULTS.md", `file the report is appended to ("-": none)`)
	bin := flag.String("bin", envOr("TETHER_BIN_DIR", "bin"), "directory with tether and tether-edge")
	cache := flag.String("cache", envOr("TETHER_BENCH_CACHE", "/var/tmp/tether-bench"),
		"where enrolled fleets are kept between runs")
	keep := flag.Bool("keep", false, "keep scratch directories (logs) of the scenarios")
	verbose := flag.Bool("v", false, "log progress at debug level")
	p6Nodes := flag.String("p6-nodes", "", "override P6's node counts (comma-separated)")
	p11Agents := flag.Int("p11-agents", 0, "override P11's fleet size (agents over the three replicas)")
	p13Sites := flag.Int("p13-sites", 0, "override P13's site hub count")
	p13Agents := flag.Int("p13-agents", 0, "override P13's fleet size (agents spread over the site hubs)")
	p8Transports := flag.String("p8-transports", "tcp,quic", "transports P8 runs over, in order (tcp, quic)")
	pprofAddr := flag.String("pprof", "", "serve net/http/pprof of tbench itself (the simulated agents) on this address")
	flag.Usage = func() {
		fmt.Fprintf(os.Stderr, "usage: tbench [flags] all | SCENARIO...\n\nscenarios:\n")
		for _, s := range scenarios {
			fmt.Fprintf(os.Stderr, "  %s  %s\n", s.id, s.what)
		}
		fmt.Fprintf(os.Stderr, "\nflags:\n")
		flag.PrintDefaults()
	}
	flag.Parse()
	if *pprofAddr != "" {
		go func() { _ = http.ListenAndServe(*pprofAddr, nil) }()
	}
	sz, ok := profiles[*size]
	if !ok {
		fmt.Fprintf(os.Stderr, "tbench: -size %q: want tiny, quick, full or max\n", *size)
		os.Exit(2)
	}
	if *p6Nodes != "" {
		sz.p6Nodes = nil
		for _, f := range strings.Split(*p6Nodes, ",") {
			n, err := strconv.Atoi(f)
			if err != nil || n < 1 {
				fmt.Fprintf(os.Stderr, "tbench: -p6-nodes %q: want counts like 100,1000\n", *p6Nodes)
				os.Exit(2)
			}
			sz.p6Nodes = append(sz.p6Nodes, n)
		}
	}
	if *p11Agents > 0 {
		sz.p11Agents = *p11Agents
	}
	if *p13Sites > 0 {
		sz.p13Sites = *p13Sites
	}
	if *p13Agents > 0 {
		sz.p13Agents = *p13Agents
	}
	var p8Tr []tunnel.Transport
	for _, f := range strings.Split(*p8Transports, ",") {
		t, err := tunnel.ParseTransport(strings.TrimSpace(f))
		if err != nil || t == tunnel.TransportAuto {
			fmt.Fprintf(os.Stderr, "tbench: -p8-transports %q: want tcp, quic or both, comma-separated\n", *p8Transports)
			os.Exit(2)
		}
		p8Tr = append(p8Tr, t)
	}
	want := flag.Args()
	if len(want) == 0 {
		flag.Usage()
		os.Exit(2)
	}
	if slices.Contains(want, "all") {
		want = nil
		for _, s := range scenarios {
			if !byNameOnly[s.id] {
				want = append(want, s.id)
			}
		}
	}
	level := slog.LevelInfo
	if *verbose {
		level = slog.LevelDebug
	}
	absBin, _ := filepath.Abs(*bin)
	b := &bench{sz: sz, bin: absBin, cache: *cache, keep: *keep, results: *results, verbose: *verbose, p8Transports: p8Tr,
		log:    slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: level})),
		report: &harness.Report{Title: "bench " + strings.Join(want, " ") + " (size " + sz.name + ")"}}

	b.runsP5 = slices.Contains(want, "p5")
	// SIGINT/SIGTERM cancel the scenario, whose deferred cleanups stop every
	// process it started.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	machine := harness.Machine()
	fmt.Println(machine)
	failed := false
	for _, id := range want {
		i := slices.IndexFunc(scenarios, func(s scenario) bool { return s.id == strings.ToLower(id) })
		if i < 0 {
			fmt.Fprintf(os.Stderr, "tbench: unknown scenario %q\n", id)
			os.Exit(2)
		}
		s := scenarios[i]
		start := time.Now()
		b.log.Info("scenario start", "id", s.id, "what", s.what)
		if err := s.run(ctx, b); err != nil {
			failed = true
			b.log.Error("scenario failed", "id", s.id, "err", err)
			b.report.Note("%s failed: %v", strings.ToUpper(s.id), err)
			if errors.Is(err, context.Canceled) {
				break
			}
		}
		b.log.Info("scenario done", "id", s.id, "took", time.Since(start).Round(time.Second))
	}
	if b.shared != nil {
		b.shared.Close()
	}
	if harness.LoadAvg1() > float64(2*runtimeCPUs()) {
		b.report.Note("load average %.1f at the end on %d cores: other work shared the machine, so figures are noisy",
			harness.LoadAvg1(), runtimeCPUs())
	}
	if *results != "-" && len(b.report.Rows) > 0 {
		if err := b.report.AppendTo(*results, machine); err != nil {
			fmt.Fprintln(os.Stderr, "tbench:", err)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}
