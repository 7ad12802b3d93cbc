package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/bench/internal/harness"
	"github.com/tether-dev/tether/bench/internal/sim"
	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/edge/sshserver"
	"github.com/tether-dev/tether/tunnel"
)

// runP6 fans out `true`, then a 1 MiB upload, to N simulated nodes with
// `tether run` (the hub runs SSH to each node's embedded SSH server through
// its tunnel), and in the same run with Ansible ad-hoc (forks 50) over
// OpenSSH ProxyJump through a stock OpenSSH bastion to the same nodes: every
// simulated node also listens on a TCP address of its own, served by the same
// embedded SSH server code (edge/sshserver) with the same host key.
func runP6(ctx context.Context, b *bench) error {
	if out, err := exec.Command(filepath.Join(b.bin, "tether"), "run", "--help").CombinedOutput(); err != nil {
		b.report.Note("P6 skipped: `tether run` is not in this build (%s)", strings.TrimSpace(string(out)))
		return nil
	}
	env, err := harness.NewEnv(b.bin)
	if err != nil {
		return err
	}
	env.Keep = b.keep
	defer env.Close()
	total := 0
	for _, n := range b.sz.p6Nodes {
		total = max(total, n)
	}
	hub, err := env.StartHub(ctx, env.Path("hub"))
	if err != nil {
		return err
	}
	join, err := hub.Token(ctx, total, "bench=p6")
	if err != nil {
		return err
	}
	fleet, err := sim.Enroll(ctx, sim.EnrollOptions{JoinString: join, Prefix: "p6", Count: total, Parallel: 16})
	if err != nil {
		return err
	}
	hostKey := env.Path("node_host_key")
	s, err := sim.Start(ctx, sim.Config{Fleet: fleet, Count: total, Transport: tunnel.TransportQUIC, PerSocket: 1000,
		SSHTarget: edge.SSHEmbedded, SSHHostKey: hostKey, IPBase: 30, Ramp: 2000,
		BackoffMin: simBackoffMin, BackoffMax: simBackoffMax, Logger: b.agentLog(),
		Configure: func(_ int, c *edge.Config) { c.SSHShell = nodeShell }})
	if err != nil {
		return err
	}
	defer s.Stop()
	if _, err := s.WaitConnected(ctx, total, time.Duration(total)*20*time.Millisecond+time.Minute); err != nil {
		return err
	}
	// The Ansible side: the same nodes on TCP, behind a stock bastion.
	ref, err := startOpenSSHSide(ctx, env, hostKey, total)
	if err != nil {
		return err
	}
	defer ref.nodes.Close()
	key, tcpNodes, bastion, sshConfig := ref.key, ref.nodes, ref.bastion, ref.sshConfig
	upload := env.Path("upload.bin")
	blob := make([]byte, b.sz.p6Upload)
	_, _ = rand.Read(blob)
	if err := os.WriteFile(upload, blob, 0o644); err != nil {
		return err
	}
	dest := env.Path("dest")
	if err := os.MkdirAll(dest, 0o755); err != nil {
		return err
	}
	_, ansibleErr := exec.LookPath("ansible")
	switch {
	case !b.sz.p6Ansible:
		ansibleErr = fmt.Errorf("not at size %s", b.sz.name)
	case ansibleErr != nil:
		b.report.Note("P6: ansible is not installed (apt-get install ansible; `make bench` does it): no Ansible reference")
	}
	for _, n := range b.sz.p6Nodes {
		names := make([]string, n)
		for i := range n {
			names[i] = fleet.Members[i].Name
		}
		// Side by side with Ansible: the same 50 at a time as its forks.
		// Alone (1,000 nodes), as a user would run it: 250 at a time.
		parallel := 50
		withAnsible := ansibleErr == nil && n <= b.sz.p6AnsibleMax
		if !withAnsible && n >= 1000 {
			parallel = 250
		}
		if v, err := strconv.Atoi(os.Getenv("TBENCH_P6_PARALLEL")); err == nil && v > 0 && !withAnsible {
			parallel = v // to weigh --parallel's effect on the hub's CPU per node
		}
		// On a loaded machine simulated agents drop out (missed keepalives)
		// while Ansible runs: each fan-out starts with every node online, as
		// it measures the fan-out, not the reconnects.
		if _, err := s.WaitConnected(ctx, total, 3*time.Minute); err != nil {
			return err
		}
		prof := startP6Profile(ctx, b, hub, n)
		tTrue, err := tetherRun(ctx, b.bin, hub, names, parallel, "--", "true")
		prof.report(ctx, b, n)
		if err != nil {
			return err
		}
		if os.Getenv("TBENCH_P6_UPLOAD") == "0" {
			b.report.Add(harness.Row{ID: "P6",
				What:    fmt.Sprintf("fan-out `true` on %d nodes, tether run (parallel %d, QUIC)", n, parallel),
				Value:   fmt.Sprintf("%.1f s", tTrue.wall.Seconds()),
				Comment: tTrue.comment(n) + "; upload and Ansible skipped (TBENCH_P6_UPLOAD=0)"})
			continue
		}
		if _, err := s.WaitConnected(ctx, total, 3*time.Minute); err != nil {
			return err
		}
		tUp, err := tetherRun(ctx, b.bin, hub, names, parallel, "--upload",
			upload+":"+filepath.Join(dest, "tether.bin"), "--", "true")
		if err != nil {
			// The fan-out of `true` succeeded: keep its figure.
			b.report.Note("P6 fan-out `true` on %d nodes (parallel %d) took %.1f s before the upload failed; %s", n,
				parallel, tTrue.wall.Seconds(), tTrue.comment(n))
			return err
		}
		var aTrue, aUp time.Duration
		if withAnsible {
			inv, err := writeInventory(env, names, tcpNodes, key, sshConfig, bastion)
			if err != nil {
				return err
			}
			// A failing reference is reported, not fatal: the tether rows
			// stand on their own.
			if aTrue, err = ansible(ctx, env, inv, "-m", "command", "-a", "true"); err != nil {
				b.report.Note("P6 reference on %d nodes failed, no ratio: %v", n, err)
				aTrue = 0
			}
			if aUp, err = ansible(
				ctx, env, inv, "-m", "copy", "-a", "src="+upload+" dest="+filepath.Join(dest, "ansible.bin"),
			); err != nil {
				b.report.Note("P6 reference on %d nodes failed, no ratio: %v", n, err)
				aUp = 0
			}
		}
		for _, r := range []struct {
			what     string
			run      fanOut
			ref      time.Duration
			deadline time.Duration
		}{
			{"fan-out `true`", tTrue, aTrue, 10 * time.Second},
			{fmt.Sprintf("fan-out %s upload (+ `true`)", sizeName(b.sz.p6Upload)), tUp, aUp, 0},
		} {
			row := harness.Row{ID: "P6",
				What:  fmt.Sprintf("%s on %d nodes, tether run (parallel %d, QUIC)", r.what, n, parallel),
				Value: fmt.Sprintf("%.1f s", r.run.wall.Seconds()), Comment: r.run.comment(n)}
			if r.ref > 0 {
				row.Ref = fmt.Sprintf("%.1f s Ansible ad-hoc, forks 50, ProxyJump via OpenSSH bastion", r.ref.Seconds())
				row.Ratio = fmt.Sprintf("%.1f× faster", r.ref.Seconds()/r.run.wall.Seconds())
				row.Target = "≥ 10× Ansible"
				row.Met = harness.YesNo(r.ref >= 10*r.run.wall)
			}
			if r.deadline > 0 && n >= 1000 {
				row.Target += "; 1,000 nodes ≤ 10 s"
				row.Met = harness.YesNo(row.Met != "no" && r.run.wall <= r.deadline)
			}
			row.Target = strings.TrimPrefix(row.Target, "; ")
			b.report.Add(row)
		}
	}
	return nil
}

// nodeShell is the simulated nodes' shell, on both sides of P6. The
// embedded SSH server otherwise runs the login shell of the user running
// tbench, and bash run by an SSH server reads ~/.bashrc even for `bash -c`:
// a developer's start-up (pyenv, conda, nvm) then costs each of 1,000
// simulated nodes more CPU than the hub spends on it, on the cores the hub
// shares. Real nodes run their own shell on their own CPU.
const nodeShell = "/bin/sh"

func sizeName(n int) string {
	if n >= 1<<20 {
		return fmt.Sprintf("%d MiB", n>>20)
	}
	return fmt.Sprintf("%d KiB", n>>10)
}

// tetherRun runs `tether run --nodes ... ARGS` and returns its wall time; it
// fails unless every node succeeded.
func tetherRun(
	ctx context.Context, bin string, hub *harness.Hub, names []string, parallel int, args ...string,
) (fanOut, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Minute)
	defer cancel()
	hub0, _ := harness.Stats(hub.Cmd.Process.Pid)
	self0, children0 := rusageCPU(syscall.RUSAGE_SELF), rusageCPU(syscall.RUSAGE_CHILDREN)
	start := time.Now()
	// The CLI runs here rather than through hub.Tether: its own CPU is
	// told apart from the simulated nodes' (both are this process's
	// children).
	argv := append([]string{"run", "--data-dir", hub.DataDir, "--nodes", strings.Join(names, ","), "--parallel",
		strconv.Itoa(parallel)}, args...)
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "tether"), argv...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	var out strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return fanOut{}, fmt.Errorf("P6 tether run: %w: %s", err, tail(out.String(), 2000))
	}
	f := fanOut{wall: time.Since(start), simCPU: rusageCPU(syscall.RUSAGE_SELF) - self0,
		cmdCPU: rusageCPU(syscall.RUSAGE_CHILDREN) - children0}
	if ps := cmd.ProcessState; ps != nil {
		f.cliCPU = ps.UserTime() + ps.SystemTime()
		f.cmdCPU -= f.cliCPU
	}
	if hub1, err := harness.Stats(hub.Cmd.Process.Pid); err == nil {
		f.hubCPU = hub1.CPU - hub0.CPU
	}
	return f, nil
}

// fanOut is one `tether run`: its wall time, the CPU the hub and the CLI
// spent on it, and the CPU of this process and its other reaped children:
// the simulated nodes' agents, SSH servers and the commands they ran, which
// on a real fleet run on the nodes, not beside the hub.
type fanOut struct {
	wall, hubCPU, cliCPU time.Duration
	simCPU               time.Duration // this process: the simulated agents and their SSH servers
	cmdCPU               time.Duration // its reaped children but the CLI: the commands the nodes ran
}

func (f fanOut) comment(n int) string {
	per := func(d time.Duration) float64 { return d.Seconds() * 1000 / float64(n) }
	nodes := f.simCPU + f.cmdCPU
	return fmt.Sprintf("hub CPU %.1f s (%.2f ms per node); CLI %.2f s (%.2f ms per node); simulated nodes on "+
		"the same 2 cores %.1f s (%.2f ms per node: agents and SSH servers %.2f, the commands they ran %.2f); load %s",
		f.hubCPU.Seconds(), per(f.hubCPU), f.cliCPU.Seconds(), per(f.cliCPU), nodes.Seconds(), per(nodes),
		per(f.simCPU), per(f.cmdCPU), loadAvg())
}

// loadAvg is the 1-minute load average, quoted with every figure: the
// machine is shared.
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// rusageCPU is who's user+system CPU (RUSAGE_SELF or RUSAGE_CHILDREN).
func rusageCPU(who int) time.Duration {
	var ru syscall.Rusage
	if syscall.Getrusage(who, &ru) != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// ansible runs an ad-hoc command on every host of the inventory.
func ansible(ctx context.Context, env *harness.Env, inv string, args ...string) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 20*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ansible", append([]string{"all", "-i", inv, "-f", "50", "-o"}, args...)...)
	cmd.Env = append(os.Environ(), "ANSIBLE_HOST_KEY_CHECKING=False", "ANSIBLE_LOCAL_TEMP="+env.Path("ansible-tmp"),
		"ANSIBLE_SSH_CONTROL_PATH_DIR="+env.Path("ansible-cp"), "ANSIBLE_REMOTE_TMP="+env.Path("ansible-remote"),
		"ANSIBLE_NOCOLOR=1", "ANSIBLE_DEPRECATION_WARNINGS=False",
		// Ansible at its best: pipelining runs each module over one SSH
		// command instead of several (the usual production setting), and a
		// generous timeout keeps a busy machine from failing hosts. The
		// default ControlPersist (60 s) expires between two runs on 100
		// nodes, and a client that reuses a master just as it exits fails
		// with "Data could not be sent" (seen here on 2 of 100 hosts), so
		// masters live for the whole scenario and a host gets retried.
		"ANSIBLE_PIPELINING=True", "ANSIBLE_TIMEOUT=60", "ANSIBLE_SSH_RETRIES=2",
		"ANSIBLE_SSH_ARGS=-C -o ControlMaster=auto -o ControlPersist=30m")
	start := time.Now()
	out, err := cmd.CombinedOutput()
	if err != nil {
		var bad []string
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "UNREACHABLE") || strings.Contains(l, "FAILED") {
				bad = append(bad, l)
			}
		}
		return 0, fmt.Errorf("P6 ansible %s: %w: %d hosts failed, first: %s", strings.Join(args, " "), err, len(bad),
			tail(strings.Join(bad, "\n"), 1500))
	}
	return time.Since(start), nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

func writeInventory(
	env *harness.Env, names []string, nodes *tcpNodes, key, sshConfig string, bastion *harness.SSHD,
) (string, error) {
	var b strings.Builder
	b.WriteString("[nodes]\n")
	for i, name := range names {
		h, p, _ := net.SplitHostPort(nodes.addrs[i])
		fmt.Fprintf(&b, "%s ansible_host=%s ansible_port=%s\n", name, h, p)
	}
	fmt.Fprintf(&b, "\n[nodes:vars]\nansible_user=%s\nansible_ssh_private_key_file=%s\n"+
		"ansible_python_interpreter=/usr/bin/python3\n", harness.Login(), key)
	fmt.Fprintf(&b, "ansible_ssh_common_args=-F %s -o ProxyJump=%s@%s\n", sshConfig, harness.Login(), bastion.Addr)
	p := env.Path(fmt.Sprintf("inventory-%d.ini", len(names)))
	return p, os.WriteFile(p, []byte(b.String()), 0o644)
}

// tcpNodes serves edge/sshserver (one server, the nodes' shared host key,
// trusting the operator key) on a TCP address per node.
type tcpNodes struct {
	srv   *sshserver.Server
	lns   []net.Listener
	addrs []string
	wg    sync.WaitGroup
	ctx   context.Context
	stop  context.CancelFunc
}

func newTCPNodes(ctx context.Context, hostKey, operatorPub string, n int) (*tcpNodes, error) {
	srv, err := sshserver.New(sshserver.Config{HostKeyPath: hostKey, Shell: nodeShell})
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(operatorPub)
	if err != nil {
		return nil, err
	}
	k, _, _, _, err := gossh.ParseAuthorizedKey(b)
	if err != nil {
		return nil, err
	}
	srv.SetAuthorizedKeys([]gossh.PublicKey{k})
	t := &tcpNodes{srv: srv}
	t.ctx, t.stop = context.WithCancel(ctx)
	for i := range n {
		ln, err := net.Listen("tcp", net.JoinHostPort(sim.IPFor(40, i).String(), "0"))
		if err != nil {
			t.Close()
			return nil, err
		}
		t.lns = append(t.lns, ln)
		t.addrs = append(t.addrs, ln.Addr().String())
		t.wg.Go(func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				t.wg.Go(func() { srv.ServeConn(t.ctx, c) })
			}
		})
	}
	return t, nil
}

func (t *tcpNodes) Close() {
	t.stop()
	for _, ln := range t.lns {
		ln.Close()
	}
	t.srv.Close()
	t.wg.Wait()
}

// agentLog is the simulated agents' logger: their warnings with -v, else
// nothing (thousands of agents would drown the tables).
func (b *bench) agentLog() *slog.Logger {
	if b.verbose {
		return b.log.With("component", "sim")
	}
	return slog.New(slog.DiscardHandler)
}

// opensshSide is the same-run OpenSSH reference of the fan-out and upgrade
// rows: the nodes on TCP, serving the operator's key, behind a stock
// OpenSSH bastion.
type opensshSide struct {
	key       string // the operator's private key file
	nodes     *tcpNodes
	bastion   *harness.SSHD
	sshConfig string
}

// startOpenSSHSide starts n TCP nodes with hostKey and the bastion; the
// caller closes nodes.
func startOpenSSHSide(ctx context.Context, env *harness.Env, hostKey string, n int) (*opensshSide, error) {
	key, err := env.OperatorKey(ctx)
	if err != nil {
		return nil, err
	}
	nodes, err := newTCPNodes(ctx, hostKey, key+".pub", n)
	if err != nil {
		return nil, err
	}
	bastion, err := env.StartSSHD(ctx, "bastion-sshd")
	if err != nil {
		nodes.Close()
		return nil, err
	}
	sshConfig, err := env.SSHConfig(ctx)
	if err != nil {
		nodes.Close()
		return nil, err
	}
	return &opensshSide{key: key, nodes: nodes, bastion: bastion, sshConfig: sshConfig}, nil
}

// p6Profile profiles one fan-out when the hub is hubprof (TBENCH_HUB): the
// hub's CPU over the run, and this process's (the simulated nodes' SSH
// servers and tunnels) over the same interval.
type p6Profile struct {
	hub    *hubProfiler
	self   *os.File
	name   string
	allocs chan string
}

// p6ProfileSecs bounds the hub's CPU profile: pprof needs a duration up
// front, and the fan-out of `true` at 1,000 nodes takes about 10 s.
const p6ProfileSecs = 12

func startP6Profile(ctx context.Context, b *bench, hub *harness.Hub, n int) *p6Profile {
	hp := newHubProfiler(hub, b.cache)
	if hp == nil {
		return nil
	}
	p := &p6Profile{hub: hp, name: fmt.Sprintf("p6-%d-%s", n, time.Now().UTC().Format("150405"))}
	hp.startCPU(ctx, p6ProfileSecs*time.Second, p.name+"-hub")
	// The allocations over the same interval: what the hub's GC works for.
	p.allocs = make(chan string, 1)
	go func() {
		f, err := hp.fetch(ctx, fmt.Sprintf("/debug/pprof/allocs?seconds=%d", p6ProfileSecs), p.name+"-hub-allocs.pb.gz")
		if err != nil {
			f = ""
		}
		p.allocs <- f
	}()
	if f, err := os.Create(filepath.Join(hp.dir, p.name+"-tbench-cpu.pb.gz")); err == nil {
		if pprof.StartCPUProfile(f) == nil {
			p.self = f
		} else {
			f.Close()
		}
	}
	return p
}

// report adds the profiles' top entries as P6 rows (flat share of the
// samples).
func (p *p6Profile) report(ctx context.Context, b *bench, n int) {
	if p == nil {
		return
	}
	add := func(who, file string) {
		b.log.Info("P6 CPU profile", "who", who, "file", file)
		for _, e := range pprofTop(ctx, file, "cpu", 8) {
			b.report.Add(harness.Row{ID: "P6", What: fmt.Sprintf("%d nodes, %s CPU in %s", n, who, e.fn),
				Value:   fmt.Sprintf("%.1f %%", e.pct),
				Comment: "flat share of the CPU profile's samples"})
		}
	}
	if p.self != nil {
		pprof.StopCPUProfile()
		p.self.Close()
		add("simulated nodes (tbench)", p.self.Name())
	}
	if f := <-p.hub.cpu; f != "" {
		add("hub", f)
	}
	if f := <-p.allocs; f != "" {
		b.log.Info("P6 hub allocations", "file", f)
	}
}
