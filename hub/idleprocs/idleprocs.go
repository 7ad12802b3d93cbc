// Package idleprocs runs a process's goroutines on one P (GOMAXPROCS 1)
// while the process is idle, and on the runtime's default again as soon as
// it is not.
//
// An idle hub holding thousands of tunnels still does a little work for
// every keepalive: a packet in, a timer, a packet out, each at its own
// moment. With more than one P, each of those events wakes a second OS
// thread, which spins looking for work to steal and goes back to sleep
// (futex wake-ups, the scheduler's search, timer checks across Ps). At
// 10,000 idle QUIC agents that was a sixth of the hub's idle CPU samples;
// on one P the same events run back to back on one thread (bench P4: 7.2–
// 7.4 % of a core before, 6.3–7.1 % with this package). The moment the process uses a
// sizeable share of a core the runtime's default returns, so a relay or a
// reconnect storm runs on every core after at most one short sample.
package idleprocs

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"runtime"
	"sync"
	"syscall"
	"time"
)

// policy is when the process narrows to one P and when it widens again.
// Loads are fractions of one core, averaged over one sample.
type policy struct {
	// Sample is how often CPU time is read while wide. While narrow it is
	// read every Sample/4, so new load is noticed within that.
	Sample time.Duration
	// IdleLoad: a sample below this counts as idle.
	IdleLoad float64
	// IdleFor is how long the process must stay idle, sample after
	// sample, before it narrows.
	IdleFor time.Duration
	// BusyLoad: while narrow, one sample above this widens at once.
	BusyLoad float64
}

// defaultPolicy: narrow after 10 s below 40 % of a core, widen as soon as
// a quarter-second sample exceeds half a core (a relayed stream or a burst
// of handshakes does within milliseconds). 10,000 idle agents cost 2–7 %
// of a core, 50,000 idle QUIC agents 20–26 % and 67,000 31–39 %: below 40
// % so that large fleets narrow too (at 50,000, wide, a seventh of the
// hub's idle CPU was thread hand-offs). The gap between the two keeps a
// steady load from flapping.
var defaultPolicy = policy{Sample: time.Second, IdleLoad: 0.40, IdleFor: 10 * time.Second, BusyLoad: 0.50}

// state is the tuner's decision state: pure, so the policy is tested
// without a clock or a runtime.
type state struct {
	narrow    bool
	idleSince time.Time // zero: the last sample was not idle
}

// next returns the state after a sample of load taken at now.
func (p policy) next(s state, load float64, now time.Time) state {
	if s.narrow {
		if load > p.BusyLoad {
			return state{}
		}
		return s
	}
	if load >= p.IdleLoad {
		return state{}
	}
	if s.idleSince.IsZero() {
		s.idleSince = now
	}
	if now.Sub(s.idleSince) >= p.IdleFor {
		return state{narrow: true}
	}
	return s
}

// interval is how long to wait before the next sample in state s.
func (p policy) interval(s state) time.Duration {
	if s.narrow {
		return p.Sample / 4
	}
	return p.Sample
}

var (
	mu      sync.Mutex
	running int                // holders of Start
	stopRun context.CancelFunc // ends the one tuner loop
	done    chan struct{}      // closed when it has ended
)

// Start starts the process's tuner with the hub's policy (narrow after
// 10 s below 40 % of a core, widen above half a core) unless GOMAXPROCS
// is set in the environment (the operator chose) or the runtime's default
// is already one P. Several holders share one tuner; the returned stop
// releases this holder's share, and the last stop ends the tuner, waits
// for it and puts the runtime's default back.
func Start(log *slog.Logger) (stop func()) { return start(log, defaultPolicy) }

// start is Start with policy p (tests use shorter ones); the first
// holder's policy applies.
func start(log *slog.Logger, p policy) (stop func()) {
	if _, set := os.LookupEnv("GOMAXPROCS"); set {
		return func() {}
	}
	mu.Lock()
	defer mu.Unlock()
	// With no tuner running, GOMAXPROCS is the runtime's default; with one
	// running it may be narrowed already, and the new holder shares it.
	if running == 0 && runtime.GOMAXPROCS(0) < 2 {
		return func() {}
	}
	running++
	if running == 1 {
		var ctx context.Context
		ctx, stopRun = context.WithCancel(context.Background())
		done = make(chan struct{})
		go func(done chan struct{}) {
			defer close(done)
			run(ctx, log, p, processCPU)
		}(done)
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			mu.Lock()
			defer mu.Unlock()
			running--
			if running == 0 {
				stopRun()
				<-done
			}
		})
	}
}

// run samples the process's CPU time and sets GOMAXPROCS by p until ctx
// ends or the CPU time cannot be read; it leaves the runtime's default in
// place.
func run(ctx context.Context, log *slog.Logger, p policy, cpu func() (time.Duration, error)) {
	defer runtime.SetDefaultGOMAXPROCS()
	read := func() (time.Duration, bool) {
		c, err := cpu()
		if err != nil {
			log.Warn("idle scheduling off: cannot read the process's CPU time", "err", err)
		}
		return c, err == nil
	}
	var s state
	lastCPU, ok := read()
	if !ok {
		return
	}
	lastAt := time.Now()
	t := time.NewTimer(p.interval(s))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		c, ok := read()
		if !ok {
			return
		}
		now := time.Now()
		load := (c - lastCPU).Seconds() / now.Sub(lastAt).Seconds()
		lastCPU, lastAt = c, now
		n := p.next(s, load, now)
		switch {
		case n.narrow && !s.narrow:
			runtime.GOMAXPROCS(1)
			log.Debug("idle: scheduling goroutines on one P", "load", load)
		case !n.narrow && s.narrow:
			runtime.SetDefaultGOMAXPROCS()
			log.Debug("busy: scheduling goroutines on the default Ps again", "load", load, "procs", runtime.GOMAXPROCS(0))
		}
		s = n
		t.Reset(p.interval(s))
	}
}

// processCPU is the CPU time (user and system) the process has used.
func processCPU() (time.Duration, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0, fmt.Errorf("getrusage: %w", err)
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), nil
}
