package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"runtime/debug"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/tunnel"
)

// Config configures Start.
type Config struct {
	Fleet *Fleet
	// From and Count select Fleet.Members[From:From+Count].
	From, Count int
	Transport   tunnel.Transport
	Tunnel      *tunnel.Config // nil: defaults, as the real agent
	// SSHTarget is the agents' ssh service: edge.SSHEmbedded (then
	// SSHHostKey, shared by all, is required) or HOST:PORT of an sshd.
	// Empty means a closed port: ssh streams are refused.
	SSHTarget  string
	SSHHostKey string
	// SSHDHostKey is the host key file whose ".pub" agents with an sshd
	// target send for the hub to certify (edge.Config.SSHDHostKey), shared
	// by all; default the machine's own /etc/ssh key.
	SSHDHostKey string
	AllowPorts  []uint16
	// IPBase is the second octet of the agents' source addresses: agent i
	// dials from 127.IPBase+i/64516.(i/254%254+1).(i%254+1), so every
	// agent has a source address of its own and 100k connections fit the
	// port space. Default 10.
	IPBase int
	// PerSocket, for QUIC, shares one UDP socket between this many agents
	// (tunnel.UDPSocket): 100k agents then hold 100 file descriptors, not
	// 100k. 0 gives every agent a socket of its own.
	PerSocket int
	// Ramp is how many agents start per second (0: all at once, a storm).
	Ramp                   int
	BackoffMin, BackoffMax time.Duration
	Logger                 *slog.Logger
	// OnAgent, if set, is called with every agent once it exists (the P6
	// harness reaches the embedded SSH servers this way).
	OnAgent func(i int, a *edge.Agent)
	// Configure, if set, adjusts agent i's configuration before the agent
	// is created (P9 gives each agent a state dir and the node-side
	// updater).
	Configure func(i int, c *edge.Config)
}

// Sim is a running set of agents.
type Sim struct {
	cfg     Config
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	sockets []*tunnel.UDPSocket
	agents  []agentState
	pushes  pushWatch
	start   time.Time
	ctx     context.Context // the agents' parent
	runs    []agentRun

	connected atomic.Int64
	attempts  atomic.Int64 // dial attempts that failed
	drops     atomic.Int64 // sessions that ended
	started   atomic.Int64 // agents whose Run has begun
	exited    atomic.Int64 // agents whose Run returned (refused, rejoin needed)
}

// agentRun is one agent's current Run, so it can be restarted alone.
type agentRun struct {
	mu     sync.Mutex // guards the following fields
	cfg    edge.Config
	cancel context.CancelFunc
	done   chan struct{}
}

type agentState struct {
	mu          sync.Mutex
	connected   bool
	connects    int
	failures    int // failed attempts since the last connect
	failedUp    int // failed attempts before the last connect
	lastUp      time.Time
	lastDown    time.Time
	lastErr     string
	everRefused bool
	lastEvent   time.Time     // last status change (or Mark)
	maxGap      time.Duration // longest time between status changes since Mark
	eventErr    string        // LastError of the last status change
	maxGapAfter string        // eventErr when the longest gap began: what the agent waited on
	marked      time.Time     // the last Mark
	trail       []string      // status changes since Mark (at most maxTrail), for Stragglers
}

// maxTrail bounds the status changes an agent keeps for Stragglers.
const maxTrail = 12

// IPFor is the source address of agent i (see Config.IPBase).
func IPFor(base, i int) net.IP {
	const per = 254 * 254
	return net.IPv4(127, byte(base+i/per), byte(i/254%254+1), byte(i%254+1))
}

// Start creates the agents and starts them (at Ramp per second) in the
// background. Stop ends them all.
func Start(ctx context.Context, cfg Config) (*Sim, error) {
	if cfg.Fleet == nil || cfg.From < 0 || cfg.Count < 0 || cfg.From+cfg.Count > len(cfg.Fleet.Members) {
		n := 0
		if cfg.Fleet != nil {
			n = len(cfg.Fleet.Members)
		}
		return nil, fmt.Errorf("sim: want members %d..%d but the fleet has %d: enroll more", cfg.From, cfg.From+cfg.Count, n)
	}
	if cfg.IPBase == 0 {
		cfg.IPBase = 10
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.SSHTarget == "" {
		cfg.SSHTarget = "127.0.0.1:1"
	}
	s := &Sim{cfg: cfg, agents: make([]agentState, cfg.Count), start: time.Now(), runs: make([]agentRun, cfg.Count)}
	s.pushes.agents = make([]agentPushes, cfg.Count)
	agents := make([]*edge.Agent, cfg.Count)
	for i := range cfg.Count {
		id, err := cfg.Fleet.Identity(cfg.From + i)
		if err != nil {
			s.closeSockets()
			return nil, err
		}
		ec := edge.Config{
			Identity: id, SSHTarget: cfg.SSHTarget, SSHHostKey: cfg.SSHHostKey, SSHDHostKey: cfg.SSHDHostKey,
			AllowPorts: cfg.AllowPorts, Transport: cfg.Transport, Tunnel: cfg.Tunnel,
			BackoffMin: cfg.BackoffMin, BackoffMax: cfg.BackoffMax,
			Logger: cfg.Logger, OnStatus: s.onStatus(i), OnControl: s.pushes.onControl(i),
		}
		if cfg.Transport == tunnel.TransportQUIC && cfg.PerSocket > 0 {
			k := i / cfg.PerSocket
			if k == len(s.sockets) {
				sock, err := tunnel.ListenUDP(net.JoinHostPort(IPFor(cfg.IPBase, k).String(), "0"))
				if err != nil {
					s.closeSockets()
					return nil, err
				}
				s.sockets = append(s.sockets, sock)
			}
			ec.UDP = s.sockets[k]
		} else {
			ec.SourceIP = IPFor(cfg.IPBase, i)
		}
		if cfg.Configure != nil {
			cfg.Configure(i, &ec)
		}
		a, err := edge.New(ec)
		if err != nil {
			s.closeSockets()
			return nil, fmt.Errorf("sim: agent %s: %w", id.Config.Name, err)
		}
		agents[i] = a
		s.runs[i].cfg = ec
		if cfg.OnAgent != nil {
			cfg.OnAgent(i, a)
		}
	}
	ctx, s.cancel = context.WithCancel(ctx)
	s.ctx = ctx
	s.wg.Go(func() {
		var tick *time.Ticker
		batch := cfg.Count
		if cfg.Ramp > 0 {
			// Start in 10 batches a second.
			batch = max(1, cfg.Ramp/10)
			tick = time.NewTicker(100 * time.Millisecond)
			defer tick.Stop()
		}
		for i := 0; i < cfg.Count; {
			for end := min(cfg.Count, i+batch); i < end; i++ {
				s.started.Add(1)
				r := &s.runs[i]
				r.mu.Lock()
				s.runLocked(r, agents[i])
				r.mu.Unlock()
			}
			if tick != nil && i < cfg.Count {
				select {
				case <-ctx.Done():
					return
				case <-tick.C:
				}
			}
		}
	})
	return s, nil
}

func (s *Sim) onStatus(i int) func(edge.Status) {
	return func(st edge.Status) {
		a := &s.agents[i]
		now := time.Now()
		a.mu.Lock()
		defer a.mu.Unlock()
		if !a.lastEvent.IsZero() && now.Sub(a.lastEvent) > a.maxGap {
			a.maxGap, a.maxGapAfter = now.Sub(a.lastEvent), a.eventErr
		}
		a.lastEvent, a.eventErr = now, st.LastError
		if !a.marked.IsZero() && len(a.trail) < maxTrail {
			a.trail = append(a.trail, fmt.Sprintf("%.1fs %s %.120s", now.Sub(a.marked).Seconds(), st.State, st.LastError))
		}
		switch st.State {
		case "connected":
			if !a.connected {
				a.connected = true
				a.connects++
				a.failedUp, a.failures = a.failures, 0
				a.lastUp = now
				s.connected.Add(1)
			}
		case "connecting", "refused", "rejoin-needed", "stopped":
			if a.connected {
				a.connected = false
				a.lastDown = now
				s.connected.Add(-1)
				s.drops.Add(1)
			} else if st.State == "connecting" {
				a.failures++
				s.attempts.Add(1)
			}
			a.lastErr = st.LastError
			if st.State == "refused" {
				a.everRefused = true
			}
		}
	}
}

// runLocked starts a's Run as agent r's current run.
func (s *Sim) runLocked(r *agentRun, a *edge.Agent) {
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	r.cancel, r.done = cancel, done
	s.wg.Go(func() {
		defer close(done)
		err := a.Run(ctx)
		if err != nil {
			s.cfg.Logger.Warn("simulated agent stopped", "err", err)
		}
		// A stop or a restart is not an agent giving up.
		if ctx.Err() == nil {
			s.exited.Add(1)
		}
	})
}

// Restart stops agent i (its session ends as a process exit would end it)
// and starts a new agent with the same configuration: what a service
// manager's restart is to a real agent. An agent not started yet is left
// to start.
func (s *Sim) Restart(i int) error {
	if i < 0 || i >= len(s.runs) {
		return fmt.Errorf("sim: no agent %d", i)
	}
	r := &s.runs[i]
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cancel == nil || s.ctx.Err() != nil {
		return nil
	}
	r.cancel()
	<-r.done
	a, err := edge.New(r.cfg)
	if err != nil {
		return fmt.Errorf("sim: restart agent %d: %w", i, err)
	}
	s.runLocked(r, a)
	return nil
}

// Connected is how many agents have a live session.
func (s *Sim) Connected() int { return int(s.connected.Load()) }

// FailedAttempts is how many dial attempts failed so far.
func (s *Sim) FailedAttempts() int { return int(s.attempts.Load()) }

// Drops is how many sessions ended so far.
func (s *Sim) Drops() int { return int(s.drops.Load()) }

// WaitConnected waits until at least n agents are connected, or timeout. It
// returns how long it took.
func (s *Sim) WaitConnected(ctx context.Context, n int, timeout time.Duration) (time.Duration, error) {
	start := time.Now()
	deadline := start.Add(timeout)
	for s.Connected() < n {
		if time.Now().After(deadline) {
			return time.Since(start), fmt.Errorf("sim: %d of %d agents connected after %v (failed attempts %d; an error: %s)",
				s.Connected(), n, timeout, s.FailedAttempts(), s.anError())
		}
		if ctx.Err() != nil {
			return time.Since(start), ctx.Err()
		}
		if int(s.exited.Load()) > 0 {
			return time.Since(start), fmt.Errorf("sim: %d agents stopped for good: %s", s.exited.Load(), s.anError())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return time.Since(start), nil
}

// WaitDown waits until no agent is connected (a hub went away), or timeout.
func (s *Sim) WaitDown(ctx context.Context, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for s.Connected() > 0 {
		if time.Now().After(deadline) || ctx.Err() != nil {
			return fmt.Errorf("sim: %d agents still connected after %v", s.Connected(), timeout)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}

func (s *Sim) anError() string {
	for i := range s.agents {
		a := &s.agents[i]
		a.mu.Lock()
		e := a.lastErr
		a.mu.Unlock()
		if e != "" {
			return e
		}
	}
	return "none recorded"
}

// Mark starts a storm observation: it resets every agent's longest gap
// between status changes (see ReconnectStats.MaxGap).
func (s *Sim) Mark() {
	now := time.Now()
	for i := range s.agents {
		a := &s.agents[i]
		a.mu.Lock()
		a.lastEvent, a.maxGap, a.maxGapAfter, a.marked, a.trail = now, 0, "", now, nil
		a.mu.Unlock()
	}
}

// ReconnectStats describes how agents came back after since (a hub restart).
type ReconnectStats struct {
	Back        int           // agents connected again after since
	Last        time.Duration // since -> the last of them connected
	P50, P99    time.Duration
	MaxFailures int // most failed attempts of one agent before it came back
	// MaxGap is the longest time one agent went between status changes
	// since Mark: a backoff sleep plus one dial attempt at most, unless
	// something held it up.
	MaxGap time.Duration
	// GapP50, GapP99 are the distribution of each agent's longest gap
	// (how starved the typical and the unluckiest agents were).
	GapP50, GapP99 time.Duration
	// LongGapAfter counts the agents whose longest gap was LongGap or
	// more, by what the gap followed: "retry hint", "busy without hint",
	// "timeout", "hub closed", "none" (the gap began without an error: the
	// hub's restart) or "other".
	LongGapAfter map[string]int
	ds           []time.Duration
	gaps         []time.Duration
}

// Merge combines the stats of several Sims observed from the same instant.
func Merge(all ...ReconnectStats) ReconnectStats {
	var rs ReconnectStats
	for _, r := range all {
		rs.Back += r.Back
		rs.Last = max(rs.Last, r.Last)
		rs.MaxFailures = max(rs.MaxFailures, r.MaxFailures)
		rs.MaxGap = max(rs.MaxGap, r.MaxGap)
		rs.ds = append(rs.ds, r.ds...)
		rs.gaps = append(rs.gaps, r.gaps...)
		for k, v := range r.LongGapAfter {
			if rs.LongGapAfter == nil {
				rs.LongGapAfter = map[string]int{}
			}
			rs.LongGapAfter[k] += v
		}
	}
	rs.P50, rs.P99 = quantile(rs.ds, 0.5), quantile(rs.ds, 0.99)
	rs.GapP50, rs.GapP99 = quantile(rs.gaps, 0.5), quantile(rs.gaps, 0.99)
	return rs
}

// Reconnects summarises agents' last connect times relative to since.
func (s *Sim) Reconnects(since time.Time) ReconnectStats {
	var rs ReconnectStats
	var ds []time.Duration
	for i := range s.agents {
		a := &s.agents[i]
		a.mu.Lock()
		if a.connected && a.lastUp.After(since) {
			d := a.lastUp.Sub(since)
			ds = append(ds, d)
			rs.Last = max(rs.Last, d)
			rs.MaxFailures = max(rs.MaxFailures, a.failedUp)
		}
		rs.MaxGap = max(rs.MaxGap, a.maxGap)
		rs.gaps = append(rs.gaps, a.maxGap)
		if a.maxGap >= LongGap {
			if rs.LongGapAfter == nil {
				rs.LongGapAfter = map[string]int{}
			}
			rs.LongGapAfter[gapCause(a.maxGapAfter)]++
		}
		a.mu.Unlock()
	}
	rs.Back = len(ds)
	rs.ds = ds
	rs.P50, rs.P99 = quantile(ds, 0.5), quantile(ds, 0.99)
	rs.GapP50, rs.GapP99 = quantile(rs.gaps, 0.5), quantile(rs.gaps, 0.99)
	return rs
}

// Straggler is an agent that came back late after a storm: when, and its
// status changes since Mark ("12.3s connecting hub busy ...").
type Straggler struct {
	BackAt time.Time
	Trail  []string
}

// Stragglers returns the n agents that came back last after since, last
// first.
func (s *Sim) Stragglers(since time.Time, n int) []Straggler {
	var all []Straggler
	for i := range s.agents {
		a := &s.agents[i]
		a.mu.Lock()
		if a.connected && a.lastUp.After(since) {
			all = append(all, Straggler{a.lastUp, slices.Clone(a.trail)})
		}
		a.mu.Unlock()
	}
	return LastBack(all, n)
}

// LastBack returns the n of all that came back last, last first.
func LastBack(all []Straggler, n int) []Straggler {
	slices.SortFunc(all, func(x, y Straggler) int { return y.BackAt.Compare(x.BackAt) })
	return all[:min(n, len(all))]
}

// Stop ends every agent and waits for them.
func (s *Sim) Stop() {
	if s.cancel != nil {
		s.cancel()
	}
	s.wg.Wait()
	s.closeSockets()
}

func (s *Sim) closeSockets() {
	for _, sock := range s.sockets {
		if err := sock.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			s.cfg.Logger.Debug("close udp socket", "err", err)
		}
	}
	s.sockets = nil
}

func quantile(ds []time.Duration, q float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	c := append([]time.Duration(nil), ds...)
	slices.Sort(c)
	return c[min(len(c)-1, int(q*float64(len(c))))]
}

// LongGap is how long a wait of one agent must be to be counted in
// ReconnectStats.LongGapAfter.
const LongGap = 15 * time.Second

// gapCause sorts the error a wait followed into a few kinds.
func gapCause(err string) string {
	switch {
	case err == "":
		return "none"
	case strings.Contains(err, "asked to retry after"):
		return "retry hint"
	case strings.Contains(err, "hub busy"):
		return "busy without hint"
	case strings.Contains(err, "timeout") || strings.Contains(err, "deadline exceeded"):
		return "timeout"
	case strings.Contains(err, "EOF") || strings.Contains(err, "closed") || strings.Contains(err, "reset"):
		return "hub closed"
	}
	return "other"
}

// GCPercent is the GC target CollectTighter sets in a process that holds
// simulated agents. At the runtime's default (100) their garbage let the
// process reach twice their live heap: 143 KiB of RSS per idle QUIC agent at
// 4,000 agents sharing sockets, against 108 KiB at 25, and 100,000 agents
// did not fit beside the hub on a 24 GiB machine. It is the load
// generator's setting only: hubs run as shipped, and what the simulator
// costs is reported apart from them.
const GCPercent = 25

// CollectTighter sets GCPercent for this process unless GOGC is set in its
// environment, and returns what puts the previous target back.
func CollectTighter() (restore func()) {
	if os.Getenv("GOGC") != "" {
		return func() {}
	}
	old := debug.SetGCPercent(GCPercent)
	return func() { debug.SetGCPercent(old) }
}
