package main

import (
	"context"
	"fmt"
	"os"
	"sync"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// f1Prompt is how fast a jump must fail to count as failing at once rather
// than hanging.
const f1Prompt = 2 * time.Second

// site kills -9 a site hub below a parent, per uplink transport: two trees
// (a parent, one site hub joined to it with --parent-transport quic or
// tcp, one agent below the site), both sites killed in the same moment
// and started again after the run. Per transport: how the first jump from
// the parent to the node below, started at the kill, ends and when, and
// the time from the kill until jumps fail at once (within f1Prompt) with
// a reason instead of hanging (a new jump tried every second, each given
// a little more than f1Prompt).
func (f *f1) site(ctx context.Context) error {
	e, err := f.newEnv(ctx)
	if err != nil {
		return err
	}
	defer e.Close()
	trees := map[string]*testenv.Tree{}
	defer func() {
		for _, tr := range trees {
			tr.Close()
		}
	}()
	node := map[string]string{} // transport -> the node's name at the parent
	for _, t := range transports {
		dir := e.Path("tree-" + t)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return err
		}
		tr, err := testenv.BuildTree(ctx, testenv.TreeConfig{Bin: f.b.bin, Dir: dir, Sites: []string{"s-" + t},
			NoRegion: true, NoLinks: true, AgentsPerSite: -1, LogLevel: "warn",
			HubArgs:   append([]string{"--parent-transport", t}, f.sz.hubFlags...),
			AgentArgs: append([]string{"--ssh", e.node.Addr}, f.sz.agentFlags...)})
		if err != nil {
			return err
		}
		trees[t] = tr
		site := tr.Sites["s-"+t]
		a, err := tr.AddAgent(ctx, site, "n1", t)
		if err != nil {
			return err
		}
		node[t] = a.Path()
		for _, h := range []*testenv.TreeHub{tr.Root, site} {
			if _, err := h.Tether(ctx, "operator", "add", "bench", "--key", e.key); err != nil {
				return err
			}
		}
		if err := tr.WaitTree(ctx, 2*time.Minute); err != nil {
			return fmt.Errorf("tree over %s: %w\n%s", t, err, tr.Logs(2000))
		}
	}
	first, prompt := map[string]*series{}, map[string]*series{}
	firstOutcome, promptReason := map[string]*tally{}, map[string]*tally{}
	for _, t := range transports {
		first[t], prompt[t], firstOutcome[t], promptReason[t] = &series{}, &series{}, &tally{}, &tally{}
	}
	for run := range f.sz.runs {
		for _, t := range transports {
			if err := f.waitJump(ctx, e, trees[t].Root.SSH, node[t]); err != nil {
				return fmt.Errorf("before kill %d, a jump from the parent over %s: %w\n%s", run+1, t, err,
					trees[t].Logs(2000))
			}
		}
		var wg sync.WaitGroup
		kill := time.Now()
		for _, t := range transports {
			wg.Go(trees[t].Sites["s-"+t].Kill)
		}
		wg.Wait()
		for _, t := range transports {
			root := trees[t].Root.SSH
			wg.Go(func() {
				r := e.jump(ctx, root, node[t], f.sz.cap)
				first[t].add(time.Since(kill), !r.killed)
				switch {
				case r.ok:
					firstOutcome[t].add("worked")
				case r.killed:
					firstOutcome[t].add("hung until the cap")
				default:
					firstOutcome[t].add("failed: " + relReason(r.reason, kill))
				}
			})
			wg.Go(func() {
				d, reason, ok := f.promptFailure(ctx, e, root, node[t], kill)
				prompt[t].add(d, ok)
				if ok {
					promptReason[t].add(relReason(reason, kill))
				}
			})
		}
		wg.Wait()
		for _, t := range transports {
			if err := f.startAgain(ctx, "site hub s-"+t, trees[t].Sites["s-"+t].Start); err != nil {
				return fmt.Errorf("after kill %d: %w", run+1, err)
			}
		}
		f.b.log.Info("F1 site kill", "run", run+1)
	}
	for _, t := range transports {
		what := fmt.Sprintf("site hub kill -9, %s uplink: until", trName(t))
		f.row(what+" a jump from the parent to the node below, started at the kill, ends", first[t], f.cap, 0)
		f.row(what+" jumps from the parent to the node below fail at once (≤ "+label(f1Prompt)+")", prompt[t],
			f.cap, 5*time.Second)
		f.b.report.Note("F1 site kill, %s uplink: the first jump: %s; the first to fail at once: %s", trName(t),
			firstOutcome[t], promptReason[t])
	}
	return nil
}

// promptFailure starts a jump every second from kill on, each killed a
// little after f1Prompt, until one fails within f1Prompt; it returns the
// time from the kill until that one ended, and why it failed.
func (f *f1) promptFailure(ctx context.Context, e *f1Env, hubSSH, node string, kill time.Time) (
	time.Duration, string, bool) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type hit struct {
		at     time.Duration
		reason string
	}
	hits := make(chan hit, 1)
	var wg sync.WaitGroup
	defer wg.Wait()
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	for time.Since(kill) < f.sz.cap {
		wg.Go(func() {
			r := e.jump(ctx, hubSSH, node, f1Prompt+time.Second)
			if !r.ok && !r.killed && r.took <= f1Prompt && ctx.Err() == nil {
				select {
				case hits <- hit{time.Since(kill), r.reason}:
				default:
				}
			}
		})
		select {
		case h := <-hits:
			cancel()
			return h.at, h.reason, true
		case <-tick.C:
		case <-ctx.Done():
			return 0, "", false
		}
	}
	select {
	case h := <-hits:
		return h.at, h.reason, true
	default:
	}
	return 0, "", false
}
