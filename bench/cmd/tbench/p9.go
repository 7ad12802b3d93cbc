package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/bench/internal/sim"
	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/edge/upgrade"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// runP9 rolls an agent upgrade out to N simulated agents in batches of
// 10% and measures the wall time, the hub's CPU, the bytes the registry
// served and the bytes the hub pushed; in the same run, the reference
// copies the same binary with scp through a stock OpenSSH bastion to the
// same nodes, as many at a time as a batch.
//
// What is real: the registry (go-containerregistry's, over TLS, with
// credentials), the artifact (the tether-edge binary of -bin, pushed with
// the code of `tether artifact push`), the hub binary and its rollout,
// each agent's tunnel, session and embedded SSH server (edge.Agent,
// in-process), and on each node the real `tether-edge upgrade
// offer/apply/watch` processes (digest checks, versioned install, atomic
// switch, the updater) on a state dir of its own.
//
// What is simulated: the service manager. Every node's agent/manager.json
// names this process as its supervisor; the updater's restart (SIGUSR1)
// makes tbench stop that node's in-process agent and start a new one,
// which reports the new version: the global edge.Version is set to it
// once the fleet is connected (simulated agents cannot exec a new binary).
// The new version's binary is installed on disk but never executed.
func runP9(ctx context.Context, b *bench) error {
	if out, err := exec.Command(
		filepath.Join(b.bin, "tether"), "upgrade", "create", "--help",
	).CombinedOutput(); err != nil {
		b.report.Note("P9 skipped: `tether upgrade create` is not in this build (%s)", strings.TrimSpace(string(out)))
		return nil
	}
	n := b.sz.p9Agents
	batch := max(1, n/10)
	if v := os.Getenv("P9_RESTART_DELAY"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			return fmt.Errorf("P9_RESTART_DELAY %q: %w", v, err)
		}
		restartDelay = d
	}
	env, err := harness.NewEnv(b.bin)
	if err != nil {
		return err
	}
	env.Keep = b.keep
	defer env.Close()
	edgeBin := filepath.Join(b.bin, "tether-edge")
	out, err := exec.Command(edgeBin, "--version").Output()
	if err != nil {
		return fmt.Errorf("P9: tether-edge --version: %w", err)
	}
	from := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(string(out)), "tether-edge"))
	const to = "9.9.9-bench"
	st, err := os.Stat(edgeBin)
	if err != nil {
		return err
	}
	binSize := st.Size()

	// The registry, with credentials, and the artifact.
	pw := make([]byte, 12)
	_, _ = rand.Read(pw)
	if err := os.MkdirAll(env.Path("registry"), 0o700); err != nil {
		return err
	}
	reg, err := testenv.NewRegistry(env.Path("registry"),
		testenv.RegistryOptions{User: "bench", Password: hex.EncodeToString(pw)})
	if err != nil {
		return err
	}
	defer reg.Close()
	pushed, err := reg.PushAgent(ctx, reg.Ref("tether/edge:"+to), to,
		map[string]string{runtime.GOOS + "/" + runtime.GOARCH: edgeBin})
	if err != nil {
		return fmt.Errorf("P9: push the artifact: %w", err)
	}

	hub, err := env.StartHub(ctx, env.Path("hub"), "--registry-ca", reg.CAFile, "--registry-auth", reg.AuthFile)
	if err != nil {
		return err
	}
	join, err := hub.Token(ctx, n, "bench=p9")
	if err != nil {
		return err
	}
	fleet, err := sim.Enroll(ctx, sim.EnrollOptions{JoinString: join, Prefix: "p9", Count: n, Parallel: 16})
	if err != nil {
		return err
	}

	// The simulated service manager: SIGUSR1 from an updater restarts the
	// agents whose install switched to the new version.
	usr1 := make(chan os.Signal, 16)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	oldVersion := edge.Version
	edge.Version = from
	defer func() { edge.Version = oldVersion }()
	nodes := make([]*upgrade.Node, n)
	for i := range n {
		dir := env.Path("nodes", fleet.Members[i].Name)
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return err
		}
		nodes[i] = &upgrade.Node{Dir: dir, Version: from, Exe: edgeBin}
		if err := nodes[i].SetManager(upgrade.Manager{Kind: upgrade.ManagerSupervisor, PID: os.Getpid()}); err != nil {
			return err
		}
	}
	hostKey := env.Path("node_host_key")
	s, err := sim.Start(ctx, sim.Config{Fleet: fleet, Count: n, Transport: tunnel.TransportQUIC, PerSocket: 1000,
		SSHTarget: edge.SSHEmbedded, SSHHostKey: hostKey, IPBase: 50, Ramp: 2000,
		BackoffMin: simBackoffMin, BackoffMax: simBackoffMax, Logger: b.agentLog(),
		// A plain POSIX shell on the nodes, as in P6: a login shell's start-up
		// (pyenv rehash in ~/.bashrc) would be measured, and can stall on its locks.
		Configure: func(i int, c *edge.Config) { c.StateDir, c.Upgrade, c.SSHShell = nodes[i].Dir, nodes[i], "/bin/sh" }})
	if err != nil {
		return err
	}
	defer s.Stop()
	if _, err := s.WaitConnected(ctx, n, time.Duration(n)*20*time.Millisecond+time.Minute); err != nil {
		return err
	}
	edge.Version = to // what a restarted agent is
	mgr := newSimManager(s, nodes, to, "p9")
	mctx, stopMgr := context.WithCancel(ctx)
	var mwg sync.WaitGroup
	mwg.Go(func() { mgr.run(mctx, usr1) })
	defer func() { stopMgr(); mwg.Wait() }()

	// The rollout.
	hub0, _ := harness.Stats(hub.Cmd.Process.Pid)
	m0, _ := hub.Metrics(ctx)
	reg0, blobs0 := reg.BlobBytesServed(), reg.BlobsServed()
	start := time.Now()
	if _, err := hub.Tether(ctx, "upgrade", "create", "p9", "--artifact", pushed.Reference,
		"-l", "bench=p9", "--batch", "10%",
		// A node that fails is reported in the row instead of halting the
		// measurement (the default tolerance is none).
		"--failure-tolerance", "10%"); err != nil {
		return fmt.Errorf("P9: tether upgrade create: %w", err)
	}
	final, err := waitRollout(ctx, hub, "p9", n, time.Duration(n)*1500*time.Millisecond+5*time.Minute)
	wall := time.Since(start)
	if err != nil {
		return err
	}
	var hubCPU time.Duration
	if hub1, err := harness.Stats(hub.Cmd.Process.Pid); err == nil {
		hubCPU = hub1.CPU - hub0.CPU
	}
	m1, _ := hub.Metrics(ctx)
	regBytes, regBlobs := reg.BlobBytesServed()-reg0, reg.BlobsServed()-blobs0
	pushedToNodes := sumMetric(m1, "tether_upgrade_bytes_pushed_total") -
		sumMetric(m0, "tether_upgrade_bytes_pushed_total")
	hubRead := sumMetric(m1, "tether_upgrade_registry_bytes_total") - sumMetric(m0, "tether_upgrade_registry_bytes_total")

	// The reference: the same binary with scp through an OpenSSH bastion
	// to the same nodes (the same embedded SSH server code, on TCP).
	ref, err := startOpenSSHSide(ctx, env, hostKey, n)
	if err != nil {
		return err
	}
	defer ref.nodes.Close()
	scpWall, scpErr := scpAll(ctx, env, ref.nodes, ref.sshConfig, ref.bastion, edgeBin, batch)

	row := harness.Row{ID: "P9",
		What: fmt.Sprintf("agent upgrade rollout (%s binary) to %d simulated agents, batch 10%% (%d), QUIC",
			mib(binSize), n, batch),
		Value: fmt.Sprintf("%.1f s", wall.Seconds()),
		Comment: fmt.Sprintf("%s; hub CPU %.1f s (%.1f ms per node); registry served %s of blobs in %d GETs = %s "+
			"(the hub read %s with the manifests); pushed to nodes %s (%.2f× the binary per node)",
			final, hubCPU.Seconds(), hubCPU.Seconds()*1000/float64(n), mib(regBytes), regBlobs, onceOrNot(regBytes, binSize),
			mib(int64(hubRead)), mib(int64(pushedToNodes)), pushedToNodes/float64(binSize)/float64(n)),
		Target: "registry bytes = one artifact", Met: harness.YesNo(regBytes == binSize)}
	if scpErr != nil {
		b.report.Note("P9 reference (scp through an OpenSSH bastion) failed: %v", scpErr)
	} else {
		row.Ref = fmt.Sprintf("%.1f s: scp of the binary via an OpenSSH bastion (ProxyJump), %d at a time, "+
			"%s total (a copy only: no verify, install, restart or health check)", scpWall.Seconds(), batch,
			mib(binSize*int64(n)))
		row.Ratio = harness.Ratio(wall.Seconds(), scpWall.Seconds()) + " the scp time"
	}
	b.report.Add(row)
	b.report.Note("P9: nodes are in-process edge.Agent sessions with embedded SSH servers; each node runs the "+
		"real `tether-edge upgrade offer/apply/watch` on its own state dir; the service manager's restart is "+
		"simulated (tbench restarts the in-process agent %s after the updater asks, and it then reports the new "+
		"version); all of it shares the machine's %d cores with the hub", restartDelay, runtimeCPUs())
	return nil
}

func onceOrNot(got, artifact int64) string {
	if got == artifact {
		return "one artifact"
	}
	return fmt.Sprintf("%.2f artifacts", float64(got)/float64(artifact))
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

func sumMetric(m map[string]float64, name string) float64 {
	var t float64
	for k, v := range m {
		if k == name || strings.HasPrefix(k, name+"{") {
			t += v
		}
	}
	return t
}

// simManager is the nodes' service manager. An updater's restart is a
// SIGUSR1 to its supervisor, which does not say which node: every signal
// restarts the agents whose upgrade record reached health_check (the
// updater moves it there, then asks for the restart) and that were not
// restarted yet, as a real supervisor restarts only when asked. Nodes whose
// upgrade succeeded get their install dir removed, so 1,000 copies of the
// binary do not pile up on the bench machine's disk.
//
// The restart is immediate (restartDelay, P9_RESTART_DELAY): it races the
// `upgrade apply` session that started the updater, which runs through the
// tunnel the restart tears down. The hub leaves such a node to its own
// record (the restarted agent reports it); before it did, 1 in 100 nodes
// here and 10% of 1,000 under load failed with "connection to the node
// lost".
type simManager struct {
	s         *sim.Sim
	nodes     []*upgrade.Node
	to, name  string
	restarted []bool
	cleaned   []bool
	restarts  atomic.Int64
	wg        sync.WaitGroup // delayed restarts
}

// restartDelay is how long after an updater's request the simulated
// service manager restarts the agent: none by default, the harshest case
// (P9_RESTART_DELAY overrides it).
var restartDelay time.Duration

func newSimManager(s *sim.Sim, nodes []*upgrade.Node, to, name string) *simManager {
	return &simManager{s: s, nodes: nodes, to: to, name: name, restarted: make([]bool, len(nodes)),
		cleaned: make([]bool, len(nodes))}
}

func (m *simManager) run(ctx context.Context, usr1 <-chan os.Signal) {
	defer m.wg.Wait()
	t := time.NewTicker(2 * time.Second)
	defer t.Stop()
	for {
		restart := false
		select {
		case <-ctx.Done():
			return
		case <-usr1:
			restart = true
		case <-t.C:
		}
		for i, nd := range m.nodes {
			if restart && !m.restarted[i] && nd.InstalledVersion() == m.to {
				if st, err := nd.Load(m.name); err == nil && st.Step == upgradeproto.StepHealthCheck {
					m.restarted[i] = true
					m.restarts.Add(1)
					m.wg.Go(func() {
						select {
						case <-ctx.Done():
						case <-time.After(restartDelay):
							_ = m.s.Restart(i)
						}
					})
				}
			}
			if m.restarted[i] && !m.cleaned[i] {
				if st, err := nd.Load(m.name); err == nil && st.Step == upgradeproto.StepSucceeded {
					m.cleaned[i] = true
					_ = os.RemoveAll(filepath.Join(nd.Dir, "agent", "versions"))
				}
			}
		}
	}
}

// scpAll copies file to every node with scp through the bastion, parallel
// at a time, each copy removed once it arrived.
func scpAll(ctx context.Context, env *harness.Env, nodes *tcpNodes, sshConfig string, bastion *harness.SSHD,
	file string, parallel int) (time.Duration, error) {
	dest := env.Path("scp-dest")
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return 0, err
	}
	sem := make(chan struct{}, parallel)
	var wg sync.WaitGroup
	var mu sync.Mutex
	var errs []error
	start := time.Now()
	for i, addr := range nodes.addrs {
		host, port, _ := strings.Cut(addr, ":")
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			target := filepath.Join(dest, fmt.Sprintf("n%d", i))
			cmd := exec.CommandContext(ctx, "scp", "-q", "-F", sshConfig, "-o", "ProxyJump="+harness.Login()+"@"+bastion.Addr,
				"-P", port, file, harness.Login()+"@"+host+":"+target)
			if out, err := cmd.CombinedOutput(); err != nil {
				mu.Lock()
				errs = append(errs, fmt.Errorf("scp to %s: %w: %s", addr, err, tail(string(out), 300)))
				mu.Unlock()
				return
			}
			_ = os.Remove(target)
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return 0, fmt.Errorf("%d of %d copies failed, first: %w", len(errs), len(nodes.addrs), errors.Join(errs[0]))
	}
	return time.Since(start), nil
}

// waitRollout polls `tether upgrade show NAME -o json` until the rollout
// ends, and says how its nodes ended (with the first failure's reason).
func waitRollout(ctx context.Context, hub *harness.Hub, name string, n int, timeout time.Duration) (string, error) {
	deadline := time.Now().Add(timeout)
	for {
		out, err := hub.Tether(ctx, "upgrade", "show", name, "-o", "json")
		if err != nil {
			return "", fmt.Errorf("P9: tether upgrade show: %w", err)
		}
		var v struct {
			State  string         `json:"state"`
			Reason string         `json:"reason"`
			Counts map[string]int `json:"counts"`
			Nodes  []struct {
				Node, Step, Reason string
			} `json:"nodes"`
		}
		if err := json.Unmarshal([]byte(out), &v); err != nil {
			return "", fmt.Errorf("P9: tether upgrade show -o json: %w", err)
		}
		ok := v.Counts[string(upgradeproto.StepSucceeded)]
		summary := fmt.Sprintf("%d/%d nodes succeeded", ok, n)
		if failed := n - ok; failed > 0 {
			summary += fmt.Sprintf(", %d not (%v)", failed, v.Counts)
			for _, nd := range v.Nodes {
				if nd.Step == string(upgradeproto.StepFailed) || nd.Step == string(upgradeproto.StepRolledBack) {
					summary += fmt.Sprintf("; first failure %s: %s", nd.Node, tail(nd.Reason, 300))
					break
				}
			}
		}
		switch v.State {
		case "done":
			return summary, nil
		case "halted", "cancelled":
			return "", fmt.Errorf("P9: the rollout %s (%s): %s", v.State, v.Reason, summary)
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("P9: the rollout did not end within %s: %s %s", timeout, v.State, summary)
		}
		select {
		case <-ctx.Done():
			return "", ctx.Err()
		case <-time.After(time.Second):
		}
	}
}
