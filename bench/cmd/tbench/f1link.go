package main

import (
	"context"
	"fmt"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/internal/faultproxy"
	"github.com/tether-dev/tether/internal/testenv"
)

// linkSetup is a hub whose agents (one per transport) dial it through one
// fault proxy: the hub advertises the proxy, so the agents' join string
// names it. Operators reach the hub directly.
type linkSetup struct {
	e      *f1Env
	hub    *harness.Hub
	link   *faultproxy.Link
	agents map[string]*agent
}

// link runs the link cuts and the copy across cuts on one setup.
func (f *f1) link(ctx context.Context, cuts, scp bool) error {
	e, err := f.newEnv(ctx)
	if err != nil {
		return err
	}
	defer e.Close()
	addrs, err := pickAddrs(2)
	if err != nil {
		return err
	}
	link, err := faultproxy.NewLink("127.0.0.1:0", addrs[0])
	if err != nil {
		return err
	}
	defer link.Close()
	hub, err := e.StartHubAt(ctx, e.Path("hub"), addrs[0], addrs[1],
		append([]string{"--advertise", link.Addr()}, f.sz.hubFlags...)...)
	if err != nil {
		return err
	}
	if _, err := hub.Tether(ctx, "operator", "add", "bench", "--key", e.key); err != nil {
		return err
	}
	join, err := hub.Token(ctx, len(transports))
	if err != nil {
		return err
	}
	s := &linkSetup{e: e, hub: hub, link: link}
	if s.agents, err = f.startAgents(e, join); err != nil {
		return err
	}
	if err := f.waitOnline(ctx, hub, s.agents); err != nil {
		return err
	}
	if cuts {
		if err := f.linkCuts(ctx, s); err != nil {
			return err
		}
	}
	if scp {
		return f.scpAcrossCuts(ctx, s)
	}
	return nil
}

// linkCuts cuts both agents' link for f1LinkCut, then brings it back the
// way a flapping edge link comes back (TCP connections reset, UDP from a
// new source port), once per run. Per transport: whether the hub listed
// the node offline during the cut (notice), the time from the link's
// return until a new `ssh -J` through the hub works (recover), and whether
// an ssh session live across the cut goes on.
func (f *f1) linkCuts(ctx context.Context, s *linkSetup) error {
	notice, recovered := map[string]*series{}, map[string]*series{}
	fates, seenOff := map[string]*tally{}, map[string]int{}
	for _, t := range transports {
		notice[t], recovered[t], fates[t] = &series{}, &series{}, &tally{}
	}
	for run := range f.sz.runs {
		for _, t := range transports {
			if err := f.waitJump(ctx, s.e, s.hub.SSH, s.agents[t].name); err != nil {
				return fmt.Errorf("before cut %d: %w%s", run+1, err, agentLogs(s.agents))
			}
		}
		sessions := map[string]*liveSession{}
		for _, t := range transports {
			ls, err := startLiveSession(ctx, s.e, s.hub.SSH, s.agents[t].name)
			if err != nil {
				return fmt.Errorf("before cut %d: %w", run+1, err)
			}
			defer ls.stop()
			sessions[t] = ls
		}
		// The hub's listing, watched from the cut until both jumps work
		// again.
		var mu sync.Mutex
		offAt := map[string]time.Duration{}
		watchCtx, stopWatch := context.WithCancel(ctx)
		down := time.Now()
		var watch sync.WaitGroup
		watch.Go(func() {
			until(watchCtx, down, 10*f.sz.cap, 100*time.Millisecond, func() bool {
				nodes, err := s.hub.Nodes(watchCtx)
				if err != nil {
					return false
				}
				mu.Lock()
				defer mu.Unlock()
				for _, t := range transports {
					if _, seen := offAt[t]; !seen && !nodes[s.agents[t].name] {
						offAt[t] = time.Since(down)
					}
				}
				return watchCtx.Err() != nil
			})
		})
		if err := s.link.Down(); err != nil {
			stopWatch()
			return err
		}
		time.Sleep(f1LinkCut - time.Since(down))
		if err := s.link.Up(); err != nil {
			stopWatch()
			return err
		}
		up := time.Now()
		ticksAtUp := map[string]int{}
		for _, t := range transports {
			ticksAtUp[t] = sessions[t].ticks()
		}
		var wg sync.WaitGroup
		for _, t := range transports {
			wg.Go(func() {
				d, ok := until(ctx, up, f.sz.cap, 200*time.Millisecond, func() bool {
					return s.e.jump(ctx, s.hub.SSH, s.agents[t].name, 10*time.Second, "-o", "ConnectTimeout=5").ok
				})
				recovered[t].add(d, ok)
			})
		}
		wg.Wait()
		stopWatch()
		watch.Wait()
		cut := up.Sub(down)
		for _, t := range transports {
			d, seen := offAt[t]
			notice[t].add(d, seen && d <= cut)
			if seen {
				seenOff[t]++
			}
		}
		// A session that survived prints on; give it a few seconds to
		// show it.
		for _, t := range transports {
			ls := sessions[t]
			_, _ = until(ctx, time.Now(), 5*time.Second, 100*time.Millisecond, func() bool {
				return ls.exited() || ls.ticks() >= ticksAtUp[t]+5
			})
			switch {
			case ls.exited():
				fates[t].add("ended: " + sshReason(ls.errOut.String()))
			case ls.ticks() >= ticksAtUp[t]+5:
				fates[t].add("survived")
			default:
				fates[t].add("stalled (running, silent)")
			}
			ls.stop()
		}
		f.b.log.Info("F1 link cut", "run", run+1, "quic", fates["quic"].String(), "tcp", fates["tcp"].String())
	}
	for _, t := range transports {
		what := fmt.Sprintf("agent link cut %s, %s agent", label(f1LinkCut), trName(t))
		f.row(what+": until the hub lists the node offline, within the cut", notice[t], "never", 0)
		f.row(what+": from the link's return until a new ssh -J works", recovered[t], f.cap, 0)
		survived := fates[t].m["survived"]
		f.b.report.Add(harness.Row{ID: "F1", What: what + ": live ssh sessions that go on after the cut",
			Value: fmt.Sprintf("%d of %d", survived, f.sz.runs), Target: "all",
			Met: harness.YesNo(survived == f.sz.runs)})
		f.b.report.Note("F1 link cut, %s agent: the hub listed the node offline at some point (within the cut or "+
			"after it) in %d of %d runs; live sessions: %s", trName(t), seenOff[t], f.sz.runs, fates[t])
	}
	return nil
}

// liveSession is an ssh session through the hub that prints a line every
// 200 ms until stopped.
type liveSession struct {
	cmd         *exec.Cmd
	out, errOut testenv.SyncBuffer
	done        chan struct{}
}

func startLiveSession(ctx context.Context, e *f1Env, hubSSH, node string) (*liveSession, error) {
	ls := &liveSession{done: make(chan struct{})}
	ls.cmd = exec.Command("ssh", "-F", e.sshConfig, "-J", "bench@"+hubSSH, harness.Login()+"@"+node,
		"while :; do echo tick; sleep 0.2; done")
	ls.cmd.Stdout, ls.cmd.Stderr = &ls.out, &ls.errOut
	ls.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := ls.cmd.Start(); err != nil {
		return nil, err
	}
	go func() { _ = ls.cmd.Wait(); close(ls.done) }()
	if _, ok := until(ctx, time.Now(), 30*time.Second, 50*time.Millisecond, func() bool {
		return ls.exited() || ls.ticks() >= 2
	}); !ok || ls.exited() {
		ls.stop()
		return nil, fmt.Errorf("an ssh session to %s did not start: %s", node, sshReason(ls.errOut.String()))
	}
	return ls, nil
}

func (ls *liveSession) ticks() int { return strings.Count(ls.out.String(), "\n") }

func (ls *liveSession) exited() bool {
	select {
	case <-ls.done:
		return true
	default:
		return false
	}
}

// stop ends the session's process group and waits.
func (ls *liveSession) stop() {
	if ls.exited() {
		return
	}
	_ = syscall.Kill(-ls.cmd.Process.Pid, syscall.SIGKILL)
	<-ls.done
}
