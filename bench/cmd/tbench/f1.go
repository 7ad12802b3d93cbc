package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
)

// F1 measures failures instead of throughput: per kind of failure and per
// agent transport, how long Tether takes to notice it and to recover, over
// several runs (median and max). Every process is real (hubs, agents, a
// stock OpenSSH sshd behind them, the ssh client, PostgreSQL for the
// replicas), on loopback; link cuts go through internal/faultproxy. The
// hubs and agents run with their default keepalive, dead-peer timeout and
// backoff, because what a user gets from those defaults is the figure
// (except at size tiny, which only checks that the scenario runs).
//
// Each wait of a run is bounded by the size's cap: a failure not noticed
// by then is reported as "> cap", never waited for longer.

// f1Size is F1 at one -size.
type f1Size struct {
	runs int           // runs of every failure
	cap  time.Duration // bound of every wait in a run
	// hubFlags and agentFlags are extra flags of every hub and agent: at
	// tiny, short keepalives and backoff so that `make test` gets through
	// F1 in a couple of minutes; empty otherwise (the defaults).
	hubFlags, agentFlags []string
	scpMiB               int             // the copy across link cuts
	scpCuts              []time.Duration // its cuts, in order
}

var f1Sizes = map[string]f1Size{
	"tiny": {runs: 1, cap: 30 * time.Second,
		hubFlags:   []string{"--keepalive", "1s", "--dead-peer-timeout", "3s"},
		agentFlags: []string{"--keepalive", "1s", "--dead-peer-timeout", "3s", "--backoff-max", "2s"},
		scpMiB:     64, scpCuts: secs(1, 1, 1, 1, 1)},
	"quick": {runs: 3, cap: 120 * time.Second, scpMiB: 256, scpCuts: secs(2, 3, 4, 5, 6)},
	"full":  {runs: 10, cap: 120 * time.Second, scpMiB: 1024, scpCuts: secs(2, 4, 6, 8, 10)},
	"max":   {runs: 10, cap: 120 * time.Second, scpMiB: 1024, scpCuts: secs(2, 4, 6, 8, 10)},
}

func secs(s ...int) []time.Duration {
	out := make([]time.Duration, len(s))
	for i, v := range s {
		out[i] = time.Duration(v) * time.Second
	}
	return out
}

// f1Parts are F1's failures, in the order they run.
var f1Parts = []string{"cut", "restart", "dead", "replica", "site", "scp"}

var (
	f1RunsFlag  = flag.Int("f1-runs", 0, "override F1's runs per failure (default: 1 tiny, 3 quick, 10 full)")
	f1PartsFlag = flag.String("f1-parts", strings.Join(f1Parts, ","),
		"F1's failures to run, comma-separated: cut (agent link cut 2 s), restart (hub kill -9, restarted), "+
			"dead (hub kill -9, not restarted), replica (replica kill -9), site (site hub kill -9), "+
			"scp (a copy across link cuts)")
)

// f1LinkCut is how long F1's link cuts last.
const f1LinkCut = 2 * time.Second

// f1 is one F1 run.
type f1 struct {
	b   *bench
	sz  f1Size
	cap string // the cap, as rows print it
}

// runF1 runs the failures -f1-parts names; a failure whose set-up fails is
// reported and the others run on.
func runF1(ctx context.Context, b *bench) error {
	sz, ok := f1Sizes[b.sz.name]
	if !ok {
		return fmt.Errorf("F1: no size %q", b.sz.name)
	}
	if *f1RunsFlag > 0 {
		sz.runs = *f1RunsFlag
	}
	want := map[string]bool{}
	for _, p := range strings.Split(*f1PartsFlag, ",") {
		p = strings.TrimSpace(p)
		if !slices.Contains(f1Parts, p) {
			return fmt.Errorf("F1: -f1-parts %q: unknown failure %q, want some of %s", *f1PartsFlag, p,
				strings.Join(f1Parts, ","))
		}
		want[p] = true
	}
	f := &f1{b: b, sz: sz, cap: "> " + fmtSecs(sz.cap)}
	var errs []error
	try := func(name string, run func(context.Context) error) {
		if ctx.Err() != nil {
			return
		}
		start := time.Now()
		b.log.Info("F1 part start", "part", name, "runs", sz.runs)
		if err := run(ctx); err != nil {
			b.log.Error("F1 part failed", "part", name, "err", err)
			b.report.Note("F1 %s failed: %v", name, err)
			errs = append(errs, fmt.Errorf("%s: %w", name, err))
		}
		b.log.Info("F1 part done", "part", name, "took", time.Since(start).Round(time.Second))
	}
	if want["cut"] || want["scp"] {
		try("link", func(ctx context.Context) error { return f.link(ctx, want["cut"], want["scp"]) })
	}
	if want["restart"] || want["dead"] {
		try("hub kill", func(ctx context.Context) error { return f.hubKill(ctx, want["restart"], want["dead"]) })
	}
	if want["replica"] {
		try("replica", f.replica)
	}
	if want["site"] {
		try("site", f.site)
	}
	return errors.Join(errs...)
}

// f1Env is a part's scratch directory with a node sshd (every agent's SSH
// target) and the operator's ssh_config.
type f1Env struct {
	*harness.Env
	node      *harness.SSHD
	sshConfig string
	key       string // the operator's public key file
}

func (f *f1) newEnv(ctx context.Context) (_ *f1Env, err error) {
	env, err := harness.NewEnv(f.b.bin)
	if err != nil {
		return nil, err
	}
	env.Keep = f.b.keep
	defer func() {
		if err != nil {
			env.Close()
		}
	}()
	e := &f1Env{Env: env}
	if e.node, err = env.StartSSHD(ctx, "node-sshd"); err != nil {
		return nil, err
	}
	key, err := env.OperatorKey(ctx)
	if err != nil {
		return nil, err
	}
	e.key = key + ".pub"
	// LogLevel INFO, not the bench's usual ERROR: the ssh that -J starts
	// for the hop to the hub prints the hub's reason for refusing a jump
	// ("channel 0: open failed: ...") only from INFO up, and the reason is
	// part of the measurement. The -F file reaches that ssh too.
	e.sshConfig = env.Path("ssh_config_f1")
	conf := fmt.Sprintf("Host *\n  IdentityFile %s\n  IdentitiesOnly yes\n  StrictHostKeyChecking no\n"+
		"  UserKnownHostsFile /dev/null\n  LogLevel INFO\n  BatchMode yes\n  ControlMaster no\n", key)
	if err := os.WriteFile(e.sshConfig, []byte(conf), 0o600); err != nil {
		return nil, err
	}
	return e, nil
}

// agent is one tether-edge of a part: its node is "n-" + transport.
type agent struct {
	transport string
	name      string
	stateDir  string
	args      []string
	proc      *harness.Proc
}

// startAgents starts one agent per transport, joined with join, relaying
// SSH to the node sshd.
func (f *f1) startAgents(e *f1Env, join string) (map[string]*agent, error) {
	out := map[string]*agent{}
	for _, t := range transports {
		a := &agent{transport: t, name: "n-" + t, stateDir: e.Path("n-" + t)}
		a.args = append([]string{"run", "--join", join, "--state-dir", a.stateDir, "--name", a.name,
			"--ssh", e.node.Addr, "--transport", t, "--log-level", "warn"}, f.sz.agentFlags...)
		if err := a.start(e); err != nil {
			return nil, err
		}
		out[t] = a
	}
	return out, nil
}

func (a *agent) start(e *f1Env) (err error) {
	a.proc, err = e.Start("agent-"+a.transport, filepath.Join(e.Bin, "tether-edge"), a.args...)
	return err
}

// restart stops the agent and starts it again from its state dir: it
// dials at once instead of after its backoff.
func (a *agent) restart(e *f1Env) error {
	a.proc.Stop(10 * time.Second)
	return a.start(e)
}

// agentStatus is the part of the agent's status file (what `tether-edge
// status` shows) F1 reads.
type agentStatus struct {
	State string    `json:"state"`
	Since time.Time `json:"since"`
}

func (a *agent) status() agentStatus {
	var st agentStatus
	b, err := os.ReadFile(filepath.Join(a.stateDir, "status.json"))
	if err == nil {
		_ = json.Unmarshal(b, &st)
	}
	return st
}

// noticed reports whether the agent has noticed a failure at kill: its
// status no longer says connected, or says connected since after kill
// (it noticed, reconnected, and the poll missed the state between; the
// time is then when it was connected again, a bound from above).
func (a *agent) noticed(kill time.Time) (time.Duration, bool) {
	st := a.status()
	switch {
	case st.State != "connected":
		return time.Since(kill), true
	case st.Since.After(kill):
		return st.Since.Sub(kill), true
	}
	return 0, false
}

// waitOnline waits until hub lists every agent online and each says it is
// connected.
func (f *f1) waitOnline(ctx context.Context, hub *harness.Hub, agents map[string]*agent) error {
	err := harness.WaitFor(ctx, f.sz.cap, "every agent online", func() bool {
		nodes, err := hub.Nodes(ctx)
		if err != nil {
			return false
		}
		for _, a := range agents {
			if !nodes[a.name] || a.status().State != "connected" {
				return false
			}
		}
		return true
	})
	if err != nil {
		return fmt.Errorf("%w%s", err, agentLogs(agents))
	}
	return nil
}

func agentLogs(agents map[string]*agent) string {
	var b strings.Builder
	for _, t := range transports {
		if a := agents[t]; a != nil && a.proc != nil {
			fmt.Fprintf(&b, "\n---- agent %s ----\n%s", a.name, a.proc.Tail(1500))
		}
	}
	return b.String()
}

// jumpResult is how one `ssh -J` ended.
type jumpResult struct {
	took   time.Duration
	ok     bool
	killed bool   // still running at its limit
	reason string // why it failed, from ssh's output
}

// jump runs `ssh -J bench@hubSSH LOGIN@node true`, killed after limit.
// sshOpts come before the destination (-o ConnectTimeout=5).
func (e *f1Env) jump(ctx context.Context, hubSSH, node string, limit time.Duration, sshOpts ...string) jumpResult {
	cctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	args := append([]string{"-F", e.sshConfig}, sshOpts...)
	args = append(args, "-J", "bench@"+hubSSH, harness.Login()+"@"+node, "true")
	start := time.Now()
	out, err := harness.Run(cctx, "ssh", args...)
	r := jumpResult{took: time.Since(start), ok: err == nil}
	if err != nil {
		r.killed = cctx.Err() != nil && ctx.Err() == nil
		r.reason = sshReason(out)
	}
	return r
}

// waitJump waits until a jump to node through hubSSH works.
func (f *f1) waitJump(ctx context.Context, e *f1Env, hubSSH, node string) error {
	var last jumpResult
	err := harness.WaitFor(ctx, f.sz.cap, "a jump to "+node, func() bool {
		last = e.jump(ctx, hubSSH, node, 20*time.Second, "-o", "ConnectTimeout=10")
		return last.ok
	})
	if err != nil {
		return fmt.Errorf("%w (last: %s)", err, last.reason)
	}
	return nil
}

// sshReason is the line of ssh's output that says why a jump failed: the
// hub's refusal of the channel if there is one, else the last line that is
// not one of ssh's generic follow-ups, else the last line.
func sshReason(out string) string {
	var last, lastAny string
	for _, l := range strings.Split(out, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case strings.Contains(l, "open failed"):
			return clip(l)
		case l == "":
			continue
		case strings.HasPrefix(l, "Warning: Permanently added"):
			continue
		case slices.Contains(sshFollowUps, l):
		default:
			last = l
		}
		lastAny = l
	}
	switch {
	case last != "":
		return clip(last)
	case lastAny != "":
		return clip(lastAny)
	}
	return "no output"
}

// sshFollowUps are what ssh prints after the line that says what failed.
var sshFollowUps = []string{
	"stdio forwarding failed",
	"kex_exchange_identification: Connection closed by remote host",
	"Connection closed by UNKNOWN port 65535",
}

func clip(s string) string {
	if len(s) > 240 {
		return s[:237] + "..."
	}
	return s
}

var (
	stampRE = regexp.MustCompile(`\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)`)
	agoRE   = regexp.MustCompile(` ?\(\d+(\.\d+)?[a-zµ]+ ago\)`)
)

// relReason is a failure's reason as the tallies count it: without ssh's
// prefix, and with every time in it written relative to the kill
// ("unreachable since kill-41s"), so that the same reason in different
// runs counts once and a "since" before the failure stands out.
func relReason(reason string, kill time.Time) string {
	reason = strings.TrimPrefix(reason, "channel 0: open failed: connect failed: ")
	reason = agoRE.ReplaceAllString(reason, "")
	return stampRE.ReplaceAllStringFunc(reason, func(stamp string) string {
		t, err := time.Parse(time.RFC3339Nano, stamp)
		if err != nil {
			return stamp
		}
		// The stamp has whole seconds: compare with the kill's second.
		d := t.Sub(kill.Truncate(time.Second)).Round(time.Second)
		if d < 0 {
			return "kill" + d.String()
		}
		return "kill+" + d.String()
	})
}

// until polls cond every step until it holds or limit after from passes,
// and returns the time from `from` to the poll that saw it hold.
func until(ctx context.Context, from time.Time, limit, step time.Duration, cond func() bool) (time.Duration, bool) {
	for {
		if cond() {
			return time.Since(from), true
		}
		if time.Since(from) > limit || ctx.Err() != nil {
			return 0, false
		}
		select {
		case <-ctx.Done():
		case <-time.After(step):
		}
	}
}

// series are the runs of one measurement: a time each, or a miss (never
// happened within the window, or not within the cap).
type series struct {
	mu   sync.Mutex
	runs []time.Duration
	miss int
}

func (s *series) add(d time.Duration, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if ok {
		s.runs = append(s.runs, d)
	} else {
		s.miss++
	}
}

func (s *series) n() int { return len(s.runs) + s.miss }

// max is the largest time, ok false when some run missed.
func (s *series) max() (time.Duration, bool) {
	if s.miss > 0 || len(s.runs) == 0 {
		return 0, false
	}
	return slices.Max(s.runs), true
}

// value is "MEDIAN / MAX", a miss printed as missWord ("never", "> 120 s");
// how many runs missed follows when some did.
func (s *series) value(missWord string) string {
	n := s.n()
	if n == 0 {
		return "not measured"
	}
	if len(s.runs) == 0 {
		return fmt.Sprintf("%s (%d of %d)", missWord, s.miss, n)
	}
	sorted := slices.Sorted(slices.Values(s.runs))
	at := func(i int) (time.Duration, bool) {
		if i < len(sorted) {
			return sorted[i], true
		}
		return 0, false
	}
	show := func(d time.Duration, ok bool) string {
		if !ok {
			return missWord
		}
		return fmtSecs(d)
	}
	var med string
	lo, okLo := at((n - 1) / 2)
	hi, okHi := at(n / 2)
	switch {
	case okLo && okHi:
		med = fmtSecs((lo + hi) / 2)
	default:
		med = missWord
	}
	v := med + " / " + show(s.max())
	if s.miss > 0 {
		v += fmt.Sprintf(" (%s in %d of %d)", missWord, s.miss, n)
	}
	return v
}

// label is a duration as a row's label says it: "2 s".
func label(d time.Duration) string { return fmt.Sprintf("%g s", d.Seconds()) }

func fmtSecs(d time.Duration) string {
	switch {
	case d < 10*time.Second:
		return fmt.Sprintf("%.2f s", d.Seconds())
	case d < 100*time.Second:
		return fmt.Sprintf("%.1f s", d.Seconds())
	}
	return fmt.Sprintf("%.0f s", d.Seconds())
}

// row adds a measurement's row: median / max over the runs, and whether the
// max meets limit (0: no target).
func (f *f1) row(what string, s *series, missWord string, limit time.Duration) {
	r := harness.Row{ID: "F1", What: fmt.Sprintf("%s (median / max of %d)", what, s.n()), Value: s.value(missWord)}
	if limit > 0 {
		r.Target = "≤ " + label(limit)
		m, ok := s.max()
		r.Met = harness.YesNo(ok && m <= limit)
	}
	f.b.report.Add(r)
}

// tally counts outcomes ("ok", a failure's reason) of one measurement.
type tally struct {
	mu sync.Mutex
	m  map[string]int
}

func (t *tally) add(outcome string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.m == nil {
		t.m = map[string]int{}
	}
	t.m[outcome]++
}

// String lists the outcomes, most frequent first.
func (t *tally) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	keys := make([]string, 0, len(t.m))
	for k := range t.m {
		keys = append(keys, k)
	}
	slices.SortFunc(keys, func(a, b string) int {
		if t.m[a] != t.m[b] {
			return t.m[b] - t.m[a]
		}
		return strings.Compare(a, b)
	})
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = strconv.Itoa(t.m[k]) + "× " + k
	}
	return strings.Join(parts, "; ")
}

// trName is a transport as the rows name it.
func trName(t string) string {
	if t == "quic" {
		return "QUIC"
	}
	return "TCP"
}

// pickAddrs returns n loopback addresses free for TCP and UDP, with ports
// below the kernel's range of ephemeral ports (ip_local_port_range, from
// 32768 by default). F1 starts killed hubs again on their addresses: a port
// the kernel handed out can meanwhile be any client socket's local port on
// a busy machine (a replica's restart failed so, once in ten), one of these
// cannot.
func pickAddrs(n int) ([]string, error) {
	f1PortsMu.Lock()
	defer f1PortsMu.Unlock()
	var out []string
	for tries := 0; len(out) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("no %d loopback ports free for TCP and UDP in %d..%d", n, f1PortLo, f1PortHi-1)
		}
		port := f1PortLo + rand.IntN(f1PortHi-f1PortLo)
		if f1Ports[port] {
			continue
		}
		addr := fmt.Sprintf("127.0.0.1:%d", port)
		l, err := net.Listen("tcp", addr)
		if err != nil {
			continue
		}
		u, err := net.ListenPacket("udp", addr)
		l.Close()
		if err != nil {
			continue
		}
		u.Close()
		f1Ports[port] = true
		out = append(out, addr)
	}
	return out, nil
}

// F1's ports, below the ephemeral range.
const f1PortLo, f1PortHi = 20000, 32768

var (
	f1PortsMu sync.Mutex
	f1Ports   = map[int]bool{}
)

// startAgain starts a killed hub again, retrying for a while when its
// address is still taken (by a socket that has not closed yet).
func (f *f1) startAgain(ctx context.Context, what string, start func(context.Context) error) error {
	var err error
	deadline := time.Now().Add(f.sz.cap)
	for {
		if err = start(ctx); err == nil || !strings.Contains(err.Error(), "address already in use") ||
			time.Now().After(deadline) {
			break
		}
		f.b.log.Warn("F1: the address of a killed hub is still taken; trying again", "hub", what, "err", err)
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(time.Second):
		}
	}
	if err != nil {
		return fmt.Errorf("start %s again: %w", what, err)
	}
	return nil
}
