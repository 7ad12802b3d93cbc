package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
)

// Resumable streams copy every byte into a replay buffer, on the hub and on
// the agent. P1 and P2 measure what that costs end to end: the same copies
// through the default hub (resumable streams) and, in the same run, through
// a second hub started with --resume-window 0 (plain tunnel streams), each
// hub with its own agent per transport in front of the same node sshd.

// plainSuffix names a path through the hub with --resume-window 0:
// plainPath("quic") is its QUIC agent.
const plainSuffix = "-plain"

func plainPath(path string) string { return path + plainSuffix }

// resumeRounds is how many rounds the comparison runs at least: a ratio
// held to 0.95 needs more than one pair of runs on a shared machine.
// TBENCH_RESUME_ROUNDS=N asks for N (its own run: more pairs where the
// machine is noisy).
func resumeRounds(sz sizes) int {
	if n, err := strconv.Atoi(os.Getenv("TBENCH_RESUME_ROUNDS")); err == nil && n > 0 {
		return n
	}
	if sz.name == "tiny" {
		return 1
	}
	return 3
}

// resumeOrder is transport t's resumable and plain paths in round r: the
// plain one first in odd rounds, so that neither always runs second.
func resumeOrder(t string, r int) []string {
	if r%2 == 1 {
		return []string{plainPath(t), t}
	}
	return []string{t, plainPath(t)}
}

// plainHub is the hub with --resume-window 0 and its agents.
type plainHub struct {
	env    *harness.Env
	hub    *harness.Hub
	agents map[string]*harness.Proc
}

// startPlain starts the plain hub (once; jumpSetup.Close stops it).
func (s *jumpSetup) startPlain(ctx context.Context, b *bench) error {
	if s.plain != nil {
		return nil
	}
	env, err := harness.NewEnv(b.bin)
	if err != nil {
		return err
	}
	env.Keep = b.keep
	extra := []string{"--resume-window", "0"}
	if env.HubBin != "" {
		// hubprof: the default hub may hold HUBPROF_PPROF's fixed port.
		extra = append(extra, "--pprof", "127.0.0.1:0")
	}
	key, _ := s.env.OperatorKey(ctx)
	hub, agents, err := startTetherHub(ctx, env, b.bin, key, s.node.Addr, s.sink.port(), extra...)
	if err != nil {
		env.Close()
		return fmt.Errorf("the hub with --resume-window 0: %w", err)
	}
	s.plain = &plainHub{env: env, hub: hub, agents: agents}
	return nil
}

// hubOf is the hub relaying path (a transport or its plainPath).
func (s *jumpSetup) hubOf(path string) *harness.Hub {
	if _, ok := strings.CutSuffix(path, plainSuffix); ok {
		return s.plain.hub
	}
	return s.hub
}

// agentPID is the agent process relaying path (0 for the OpenSSH bastion).
func (s *jumpSetup) agentPID(path string) int {
	path, _ = strings.CutSuffix(path, stockSuffix)
	agents := s.agents
	if p, ok := strings.CutSuffix(path, plainSuffix); ok {
		path, agents = p, s.plain.agents
	}
	if a := agents[path]; a != nil {
		return a.Cmd.Process.Pid
	}
	return 0
}

// startTetherHub starts a hub in env with the bench operator (key) and one
// tether-edge per transport (nodes n-quic and n-tcp) in front of the node
// sshd at node, allowing port; it returns once both agents are connected.
func startTetherHub(ctx context.Context, env *harness.Env, bin, key, node string, port int,
	extra ...string) (*harness.Hub, map[string]*harness.Proc, error) {
	hub, err := env.StartHub(ctx, env.Path("hub"), extra...)
	if err != nil {
		return nil, nil, err
	}
	if _, err := hub.Tether(ctx, "operator", "add", "bench", "--key", key+".pub"); err != nil {
		return nil, nil, err
	}
	join, err := hub.Token(ctx, len(transports))
	if err != nil {
		return nil, nil, err
	}
	agents := map[string]*harness.Proc{}
	for _, t := range transports {
		args := []string{"run", "--join", join, "--state-dir", env.Path("n-" + t), "--name", "n-" + t,
			"--ssh", node, "--transport", t, "--log-level", "warn", "--allow-port", strconv.Itoa(port)}
		p, err := env.Start("agent-"+t, filepath.Join(bin, "tether-edge"), args...)
		if err != nil {
			return nil, nil, err
		}
		agents[t] = p
	}
	err = harness.WaitFor(ctx, 30*time.Second, "both agents to connect", func() bool {
		q, err1 := hub.Connected(ctx, "quic")
		t, err2 := hub.Connected(ctx, "tcp")
		return err1 == nil && err2 == nil && q == 1 && t == 1
	})
	if err != nil {
		return nil, nil, fmt.Errorf("%w; quic agent: %s; tcp agent: %s", err, agents["quic"].Tail(500),
			agents["tcp"].Tail(500))
	}
	return hub, agents, nil
}

// resumeCmp collects one scenario's comparison: per path (a transport, or
// its plainPath) the best MB/s and, per transport, each round's ratio
// resumable/plain; the hub's and the agent's CPU per path.
type resumeCmp struct {
	id         string
	best       map[string]float64
	round      map[string]float64
	ratios     map[string][]float64
	runs       int
	hub, agent relayCPU
}

func newResumeCmp(id string) *resumeCmp {
	c := &resumeCmp{id: id, hub: relayCPU{}, agent: relayCPU{}}
	c.reset()
	return c
}

// reset starts a new size (the CPU tallies go on over all sizes).
func (c *resumeCmp) reset() {
	c.best, c.round, c.ratios, c.runs = map[string]float64{}, map[string]float64{}, map[string][]float64{}, 0
}

// record is one run of path: MB/s, and the hub's and the agent's CPU for
// its bytes.
func (c *resumeCmp) record(path string, v float64, hub, agent time.Duration, bytes int64) {
	c.best[path] = max(c.best[path], v)
	c.round[path] = v
	c.hub.add(path, hub, bytes)
	c.agent.add(path, agent, bytes)
}

// endRound pairs the round's runs.
func (c *resumeCmp) endRound() {
	for _, t := range transports {
		if r, p := c.round[t], c.round[plainPath(t)]; r > 0 && p > 0 {
			c.ratios[t] = append(c.ratios[t], r/p)
		}
	}
	c.round = map[string]float64{}
	c.runs++
}

// rows are the throughput rows of what (e.g. "256 MiB ssh -J copy"), one
// per transport.
func (c *resumeCmp) rows(what string) []harness.Row {
	var rows []harness.Row
	for _, t := range transports {
		v, ref := c.best[t], c.best[plainPath(t)]
		rs := slices.Clone(c.ratios[t])
		slices.Sort(rs)
		each := make([]string, len(c.ratios[t]))
		for i, r := range c.ratios[t] {
			each[i] = fmt.Sprintf("%.2f", r)
		}
		comment := "each round's ratio " + strings.Join(each, ", ")
		if n := len(rs); n > 0 {
			comment += fmt.Sprintf("; median %.2f", (rs[(n-1)/2]+rs[n/2])/2)
		}
		rows = append(rows, harness.Row{ID: c.id,
			What: fmt.Sprintf("%s, %s: resumable streams (default hub) vs plain (--resume-window 0), best of %d "+
				"each, interleaved", what, pathName(t), c.runs),
			Value: fmt.Sprintf("%.0f MB/s", v), Ref: fmt.Sprintf("%.0f MB/s plain", ref), Ratio: harness.Ratio(v, ref),
			Target: "≥ 0.95×", Met: harness.YesNo(ref > 0 && v >= 0.95*ref), Comment: comment})
	}
	return rows
}

// cpuRows are the CPU rows of what (e.g. "ssh -J copy"), one per
// transport: the hub's CPU per GiB, resumable against plain, the agent's
// in the comment.
func (c *resumeCmp) cpuRows(what string) []harness.Row {
	var rows []harness.Row
	for _, t := range transports {
		v, ref := c.hub.perGiB(t), c.hub.perGiB(plainPath(t))
		rows = append(rows, harness.Row{ID: c.id,
			What: fmt.Sprintf("%s, hub CPU per GiB, %s: resumable streams vs plain (--resume-window 0)", what,
				pathName(t)),
			Value: fmt.Sprintf("%.2f CPU-s/GiB", v), Ref: fmt.Sprintf("%.2f CPU-s/GiB plain", ref),
			Ratio:   harness.Ratio(v, ref),
			Comment: fmt.Sprintf("agent %.2f vs %.2f CPU-s/GiB", c.agent.perGiB(t), c.agent.perGiB(plainPath(t)))})
	}
	return rows
}

// bufferedWatch samples a hub's tether_resume_buffered_bytes (the bytes it
// keeps unacknowledged for resumable streams) while copies run.
type bufferedWatch struct {
	mu   sync.Mutex
	peak float64
	n    int // samples
	err  error
}

// watch samples hub every interval until the returned stop is called.
// P1 watches both hubs alike, so that the scrapes cost both the same.
func (w *bufferedWatch) watch(ctx context.Context, hub *harness.Hub, every time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(every)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			v, err := resumeBuffered(ctx, hub)
			w.mu.Lock()
			if err != nil && ctx.Err() == nil {
				w.err = err
			} else if err == nil {
				w.peak, w.n = max(w.peak, v), w.n+1
			}
			w.mu.Unlock()
		}
	}()
	return func() { cancel(); <-done }
}

// resumeBuffered is the hub's tether_resume_buffered_bytes.
func resumeBuffered(ctx context.Context, hub *harness.Hub) (float64, error) {
	m, err := hub.Metrics(ctx)
	if err != nil {
		return 0, err
	}
	v, ok := m["tether_resume_buffered_bytes"]
	if !ok {
		return 0, fmt.Errorf("the hub's metrics have no tether_resume_buffered_bytes")
	}
	return v, nil
}

// bufferedRow waits (up to 10 s) for the default hub's
// tether_resume_buffered_bytes and its attached resumable streams to fall
// to 0 after the copies (a stream ends once its last bytes and Fin are
// acknowledged), and reports them with the peak w sampled during them.
func bufferedRow(ctx context.Context, id string, hub *harness.Hub, w *bufferedWatch, every time.Duration) harness.Row {
	start := time.Now()
	var v, attached float64
	var err error
	for {
		var m map[string]float64
		if m, err = hub.Metrics(ctx); err == nil {
			v, attached = m["tether_resume_buffered_bytes"], m[`tether_resume_streams{state="attached"}`]
		}
		if (err == nil && v == 0 && attached == 0) || time.Since(start) > 10*time.Second || ctx.Err() != nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	row := harness.Row{ID: id, What: "the default hub's tether_resume_buffered_bytes once the copies ended",
		Target: "0"}
	if err != nil {
		row.Value, row.Met = "not read: "+err.Error(), "no"
		return row
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	row.Value = fmt.Sprintf("%.0f B", v)
	row.Met = harness.YesNo(v == 0 && attached == 0)
	row.Comment = fmt.Sprintf("read %.1f s after the last copy; resumable streams attached then: %.0f; peak during "+
		"its copies %.1f MiB (%d samples, one every %v)", time.Since(start).Seconds(), attached, w.peak/(1<<20), w.n,
		every)
	if w.err != nil {
		row.Comment += "; a sample failed: " + w.err.Error()
	}
	return row
}
