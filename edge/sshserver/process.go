package sshserver

import (
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// exitResult is how a session's process ended, as reported to the client.
type exitResult struct {
	status     int    // exit status; 128+n for a process killed by signal n
	signal     string // RFC 4254 signal name if killed by a standard signal
	coreDumped bool
	err        error // why the process could not be started, for the log
}

// send reports r to the client and closes the channel. A process killed
// by a signal RFC 4254 names is reported as sshd does, with exit-signal
// only (name without "SIG", core-dumped flag) and no exit-status: OpenSSH's
// client then exits 255, and x/crypto reports the signal with status 128+n.
func (r exitResult) send(sess ssh.Session) {
	_ = sess.CloseWrite()
	if r.signal != "" {
		msg := struct {
			Signal     string
			CoreDumped bool
			Error      string
			Lang       string
		}{Signal: r.signal, CoreDumped: r.coreDumped}
		_, _ = sess.SendRequest("exit-signal", false, gossh.Marshal(&msg))
		_ = sess.Close()
		return
	}
	_ = sess.Exit(r.status)
}

// runPipes runs cmd without a terminal, stdin/stdout/stderr on pipes.
// The pipes are *os.File on both ends, so os/exec starts no copy goroutines
// of its own and Wait returns when the process exits; the copying is ours.
func (s *Server) runPipes(sctx *sessionContext, sess ssh.Session, cmd *exec.Cmd) exitResult {
	var pipes [3][2]*os.File // [stdin, stdout, stderr][read, write]
	for i := range pipes {
		r, w, err := os.Pipe()
		if err != nil {
			for _, p := range pipes[:i] {
				p[0].Close()
				p[1].Close()
			}
			return startFailed(sess.Stderr(), "\n", err)
		}
		pipes[i] = [2]*os.File{r, w}
	}
	stdinW, stdoutR, stderrR := pipes[0][1], pipes[1][0], pipes[2][0]
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pipes[0][0], pipes[1][1], pipes[2][1]
	// A new session is also a new process group, so killSession reaches
	// the command and everything it starts.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	err := cmd.Start()
	pipes[0][0].Close()
	pipes[1][1].Close()
	pipes[2][1].Close()
	if err != nil {
		stdinW.Close()
		stdoutR.Close()
		stderrR.Close()
		return startFailed(sess.Stderr(), "\n", err)
	}
	// Closing stdinW on return also unblocks a copy stuck writing to a pipe
	// nobody reads any more.
	defer stdinW.Close()
	// Stdin is not waited for: a client may keep its stdin open after the
	// command exited. The copy ends at client EOF (passed on as EOF) or when
	// the channel closes, and the connection's tracker waits for it.
	if !sctx.state.tasks.goTracked(func() {
		io.Copy(stdinW, sess)
		stdinW.Close()
	}) {
		stdinW.Close()
	}
	var out sync.WaitGroup
	out.Add(2)
	go func() {
		defer out.Done()
		io.Copy(sess, stdoutR)
	}()
	go func() {
		defer out.Done()
		io.Copy(sess.Stderr(), stderrR)
	}()
	res := supervise(sctx, cmd, false)
	drainOutput(sctx, &out, stdoutR, stderrR)
	return res
}

// drainOutput waits until the output copies hit EOF, which (with the session
// killed) is once everything buffered reached the client, or until the
// session is gone and nobody would receive it. The read ends are closed
// either way, which also unblocks copies still reading.
func drainOutput(sctx *sessionContext, out *sync.WaitGroup, readers ...*os.File) {
	done := make(chan struct{})
	go func() {
		out.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-sctx.Done():
	}
	for _, r := range readers {
		r.Close()
	}
	<-done
}

// startFailed tells the client why its session could not start and returns
// the status shells use for a command that cannot be run. newline is
// "\r\n" on a terminal, whose output is not translated by a tty here.
func startFailed(stderr io.Writer, newline string, err error) exitResult {
	err = fmt.Errorf("sshserver: start session: %w", err)
	fmt.Fprint(stderr, err.Error()+newline)
	return exitResult{status: 127, err: err}
}

// leaderGrace is how long a session's main process has to exit after the
// hangup once its client is gone. One that ignores SIGHUP is then killed:
// sshd would leave it running, but the agent must not keep a connection
// (and a tunnel stream) open for a session nobody can reach any more.
const leaderGrace = 2 * time.Second

// supervise waits for the session's process to exit, reaps it and returns
// its status. If the session context ends first (client gone, Close,
// ServeConn's context), the session is ended (endSession) right away, and
// the main process, should it survive that, is killed after leaderGrace.
// When the process exits by itself, what it left in its session is ended
// only on a terminal (the hangup of its closing terminal, as under sshd) or
// after a KillOnEndRequest: without a terminal sshd sends nothing, and
// `nohup cmd &` or `setsid cmd &` must not race a hangup sent the moment
// the shell exits.
func supervise(sctx *sessionContext, cmd *exec.Cmd, terminal bool) exitResult {
	pid := cmd.Process.Pid
	proc := &sctx.proc
	proc.started(pid)
	stop := make(chan struct{})
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		select {
		case <-sctx.Done():
			proc.endSession(pid)
		case <-stop:
			return
		}
		t := time.NewTimer(leaderGrace)
		defer t.Stop()
		select {
		case <-t.C:
			// Still a live process: the leader is not reaped before stop.
			syscall.Kill(pid, syscall.SIGKILL)
		case <-stop:
		}
	}()
	// Where possible, wait without reaping: while the exited leader is a
	// zombie its pid, and with it the session and group id, cannot be
	// reused, so the kills below cannot hit an unrelated process.
	reaped := false
	if !waitExitedNoReap(pid) {
		cmd.Wait()
		reaped = true
	}
	close(stop)
	<-watcherDone
	proc.exited()
	if terminal || proc.killsOnEnd() {
		proc.endSession(pid)
	}
	if !reaped {
		cmd.Wait()
	}
	return resultOf(cmd.ProcessState)
}

func resultOf(ps *os.ProcessState) exitResult {
	if ps == nil {
		return exitResult{status: 255}
	}
	if ws, ok := ps.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
		sig := ws.Signal()
		return exitResult{status: 128 + int(sig), signal: signalName(sig), coreDumped: ws.CoreDump()}
	}
	return exitResult{status: ps.ExitCode()}
}

// signals maps the RFC 4254 section 6.10 signal names to their numbers.
var signals = map[ssh.Signal]syscall.Signal{
	ssh.SIGABRT: syscall.SIGABRT,
	ssh.SIGALRM: syscall.SIGALRM,
	ssh.SIGFPE:  syscall.SIGFPE,
	ssh.SIGHUP:  syscall.SIGHUP,
	ssh.SIGILL:  syscall.SIGILL,
	ssh.SIGINT:  syscall.SIGINT,
	ssh.SIGKILL: syscall.SIGKILL,
	ssh.SIGPIPE: syscall.SIGPIPE,
	ssh.SIGQUIT: syscall.SIGQUIT,
	ssh.SIGSEGV: syscall.SIGSEGV,
	ssh.SIGTERM: syscall.SIGTERM,
	ssh.SIGUSR1: syscall.SIGUSR1,
	ssh.SIGUSR2: syscall.SIGUSR2,
}

// signalName is the RFC 4254 name of sig, or "" for signals the RFC does
// not name (those are reported by exit status only).
func signalName(sig syscall.Signal) string {
	for name, s := range signals {
		if s == sig {
			return string(name)
		}
	}
	return ""
}

// procState is the session's process as far as client requests (signals,
// window changes) need it.
type procState struct {
	mu      sync.Mutex       // guards the following fields
	pid     int              // the running process; 0 before start and once it exited
	done    bool             // the process exited; signals are dropped
	pending []syscall.Signal // signals that arrived before the process started
	pty     *os.File         // PTY master, nil without a PTY or once closed
	win     *ssh.Window      // latest requested window size
	// killOnEnd: the client asked (KillOnEndRequest) that everything left
	// in the session be killed when it ends, not only hung up.
	killOnEnd bool
}

// hangupReachesSessions makes the processes of sessions start with SIGHUP at
// its default, as under sshd, so that a session's hangup (a terminal
// session's end, a client gone) ends its plain background jobs. An agent
// started with SIGHUP ignored (nohup, some supervisors) would otherwise pass
// that on through exec, and every background job would outlive a hangup. A
// handler of the agent's own is reset to the default by exec instead. The
// agent keeps ignoring hangups itself: nothing reads the channel, and a
// signal that finds it full is dropped.
func hangupReachesSessions() {
	hangupOnce.Do(func() {
		if signal.Ignored(syscall.SIGHUP) {
			signal.Notify(make(chan os.Signal, 1), syscall.SIGHUP)
		}
	})
}

var hangupOnce sync.Once

// KillOnEndRequest is the session request ("want reply" optional, no
// payload) by which a client asks that, when the session ends, everything
// still in its POSIX session is killed with SIGKILL rather than sent SIGHUP.
// The hub's job runner (provisioners/runner) sends it before its exec
// request: a cancelled or finished provisioning step must not leave
// processes behind, nohup'ed or not. OpenSSH's sshd refuses the unknown
// request, and the runner's wrapper does that work there.
const KillOnEndRequest = "kill-on-end@tether.dev"

// setKillOnEnd records a KillOnEndRequest.
func (p *procState) setKillOnEnd() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.killOnEnd = true
}

// killsOnEnd reports whether the client sent KillOnEndRequest.
func (p *procState) killsOnEnd() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.killOnEnd
}

// endSession ends what is left in session sid: SIGKILL to all of it if
// the client sent KillOnEndRequest, else SIGHUP (and SIGCONT, so stopped
// jobs see it), as a terminal's hangup does. A process that ignores SIGHUP
// (nohup) or left the session (setsid, systemd-run) keeps running.
func (p *procState) endSession(sid int) {
	if p.killsOnEnd() {
		killSession(sid)
		return
	}
	hangupSession(sid)
}

// maxPendingSignals bounds signals queued before the process starts.
const maxPendingSignals = 16

// started records the process and delivers signals the client sent before
// it existed (a client may signal right after its exec request is accepted).
func (p *procState) started(pid int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pid = pid
	for _, sig := range p.pending {
		syscall.Kill(pid, sig)
	}
	p.pending = nil
}

// exited stops signal delivery; it is called before the process is reaped
// so a signal can never reach a recycled pid.
func (p *procState) exited() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pid = 0
	p.done = true
}

// signal delivers sig to the process, like sshd: to the session's process
// only, which decides what to do with its children.
func (p *procState) signal(sig ssh.Signal) {
	n, ok := signals[sig]
	if !ok {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	switch {
	case p.pid != 0:
		syscall.Kill(p.pid, n)
	case !p.done && len(p.pending) < maxPendingSignals:
		p.pending = append(p.pending, n)
	}
}

// setPTY attaches (or, with nil, detaches) the PTY master and applies the
// latest window size requested so far.
func (p *procState) setPTY(f *os.File) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.pty = f
	if f != nil && p.win != nil {
		setWinsize(f, *p.win)
	}
}

// resize applies a client window change to the terminal, or remembers it
// until the terminal exists.
func (p *procState) resize(w ssh.Window) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.win = &w
	if p.pty != nil {
		setWinsize(p.pty, w)
	}
}
