package testenv

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"
)

// Proc is a started process whose stdout and stderr go to a log file. It
// leads its own process group, so Stop reaches whatever it started in
// that group, and dies with the process that started it.
type Proc struct {
	Name    string
	Cmd     *exec.Cmd
	LogPath string
	done    chan struct{}
	err     error
}

// StartProc starts cmd with its output appended to logPath (stdout and
// stderr the caller set are kept).
func StartProc(name, logPath string, cmd *exec.Cmd) (*Proc, error) {
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return nil, fmt.Errorf("testenv: log of %s: %w", name, err)
	}
	if cmd.Stdout == nil {
		cmd.Stdout = f
	}
	if cmd.Stderr == nil {
		cmd.Stderr = f
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("testenv: start %s: %w", name, err)
	}
	p := &Proc{Name: name, Cmd: cmd, LogPath: logPath, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); f.Close(); close(p.done) }()
	return p, nil
}

// Start runs bin for the test, its log in the test's temporary directory.
// At cleanup it is stopped (SIGTERM, SIGKILL after 10 s) and, if the test
// failed, the end of its log is shown.
func Start(t T, name, bin string, args ...string) *Proc {
	t.Helper()
	p, err := StartProc(name, filepath.Join(t.TempDir(), name+".log"), exec.Command(bin, args...))
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() {
		p.Stop(syscall.SIGTERM, 10*time.Second)
		if t.Failed() {
			t.Logf("---- %s log ----\n%s", name, p.Tail(6000))
		}
	})
	return p
}

// PID is the process id.
func (p *Proc) PID() int { return p.Cmd.Process.Pid }

// Done is closed once the process has exited.
func (p *Proc) Done() <-chan struct{} { return p.done }

// Exited reports whether the process has exited.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Err is how the process ended (valid once Done is closed).
func (p *Proc) Err() error {
	<-p.done
	return p.err
}

// Stop sends sig to the process group and waits; SIGKILL after grace.
func (p *Proc) Stop(sig syscall.Signal, grace time.Duration) {
	if p.Exited() {
		return
	}
	_ = syscall.Kill(-p.PID(), sig)
	select {
	case <-p.done:
	case <-time.After(grace):
		_ = syscall.Kill(-p.PID(), syscall.SIGKILL)
		<-p.done
	}
}

// Kill sends SIGKILL to the process group and waits.
func (p *Proc) Kill() { p.Stop(syscall.SIGKILL, time.Minute) }

// Log is the whole log so far.
func (p *Proc) Log() string {
	b, _ := os.ReadFile(p.LogPath)
	return string(b)
}

// Tail is the last n bytes of the log, for failure messages.
func (p *Proc) Tail(n int) string {
	s := p.Log()
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}

// LogCount counts the log lines that contain sub.
func (p *Proc) LogCount(sub string) int {
	n := 0
	for _, line := range strings.Split(p.Log(), "\n") {
		if strings.Contains(line, sub) {
			n++
		}
	}
	return n
}

// WaitLog waits until n log lines contain sub; it gives up when the
// process exits or timeout passes.
func (p *Proc) WaitLog(sub string, n int, timeout time.Duration) error {
	deadline := time.Now().Add(timeout)
	for p.LogCount(sub) < n {
		if p.Exited() {
			return fmt.Errorf("testenv: %s exited waiting for %q in its log:\n%s", p.Name, sub, p.Tail(4000))
		}
		if time.Now().After(deadline) {
			return fmt.Errorf(
				"testenv: %w after %v waiting for %q in the log of %s:\n%s",
				ErrTimeout, timeout, sub, p.Name, p.Tail(4000),
			)
		}
		time.Sleep(20 * time.Millisecond)
	}
	return nil
}
