// Package harness starts and measures the processes of the bench scenarios
// (hub, agents, OpenSSH daemons, load tools) on loopback, and writes the
// result tables. Every process it starts is in its own process group and is
// killed by Env.Close, also when a scenario fails half-way.
package harness

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// Env is one scenario's working directory and the processes it started.
type Env struct {
	Bin  string // directory with tether and tether-edge
	Work string // scratch directory, removed by Close unless Keep
	Keep bool
	// HubBin, if set, runs the hub from this binary (bench/cmd/hubprof, the
	// same hub with pprof) instead of `tether hub`.
	HubBin string

	mu    sync.Mutex
	procs []*Proc
}

// NewEnv creates a scratch directory under /tmp.
func NewEnv(bin string) (*Env, error) {
	if err := testenv.CheckBinaries(bin); err != nil {
		return nil, err
	}
	w, err := os.MkdirTemp("", "tether-bench-")
	if err != nil {
		return nil, err
	}
	return &Env{Bin: bin, Work: w, HubBin: os.Getenv("TBENCH_HUB")}, nil
}

// Close stops every process still running (SIGTERM, then SIGKILL) and
// removes the scratch directory.
func (e *Env) Close() {
	e.mu.Lock()
	procs := e.procs
	e.procs = nil
	e.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Stop(5 * time.Second)
	}
	if !e.Keep {
		_ = os.RemoveAll(e.Work)
	}
}

// Path is a path inside the scratch directory.
func (e *Env) Path(elem ...string) string { return filepath.Join(append([]string{e.Work}, elem...)...) }

// Proc is a started process whose output goes to a log file (the shared
// test environment's process, stopped the way bench stops things).
type Proc struct {
	*testenv.Proc
}

// Start runs bin with args, output to Work/NAME.log.
func (e *Env) Start(name, bin string, args ...string) (*Proc, error) {
	return e.StartCmd(name, exec.Command(bin, args...))
}

// StartCmd starts cmd (Stdout/Stderr go to the log unless already set).
func (e *Env) StartCmd(name string, cmd *exec.Cmd) (*Proc, error) {
	tp, err := testenv.StartProc(name, e.Path(name+".log"), cmd)
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	p := &Proc{tp}
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	return p, nil
}

// Stop sends SIGTERM to the process group, then SIGKILL after grace.
func (p *Proc) Stop(grace time.Duration) { p.Proc.Stop(syscall.SIGTERM, grace) }

// ProcStats is what /proc says about a process.
type ProcStats struct {
	RSS     int64         // resident set, bytes
	CPU     time.Duration // user+system so far
	Threads int
}

// clkTck is USER_HZ, 100 on every Linux architecture Go supports.
const clkTck = 100

// Stats reads /proc/PID/{stat,status}.
func Stats(pid int) (ProcStats, error) {
	var st ProcStats
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return st, fmt.Errorf("harness: read stats of pid %d: %w", pid, err)
	}
	// Fields after the command name, which is in parentheses and may
	// contain spaces.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 20 {
		return st, fmt.Errorf("harness: short /proc/%d/stat", pid)
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	stm, _ := strconv.ParseInt(f[12], 10, 64)
	st.CPU = time.Duration(ut+stm) * time.Second / clkTck
	st.Threads, _ = strconv.Atoi(f[17])
	sf, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return st, err
	}
	defer sf.Close()
	sc := bufio.NewScanner(sf)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			st.RSS = kb << 10
		}
	}
	return st, nil
}

// SelfCPU is this process's user+system CPU so far.
func SelfCPU() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// FreePort returns a TCP port on 127.0.0.1 that is free right now (and
// free on UDP too, for the hub's shared port).
func FreePort() (int, error) { return testenv.PickPort() }

// WaitFor polls cond until it holds or timeout passes.
func WaitFor(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	return testenv.Poll(ctx, timeout, what, cond)
}

// Run runs a command to completion and returns its combined output.
func Run(ctx context.Context, name string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) }
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, tailString(string(out), 2000))
	}
	return string(out), nil
}

func tailString(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
