package sshserver

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// defaultPath is the PATH of sessions when the agent itself has none.
const defaultPath = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

// userInfo describes the OS user the agent (and so every session) runs as.
type userInfo struct {
	name  string // USER and LOGNAME
	home  string // HOME
	dir   string // working directory: home if it is a directory, else "/"
	path  string // PATH
	shell string // SHELL
}

func currentUser(shell string) userInfo {
	u := userInfo{shell: shell, path: os.Getenv("PATH")}
	// The agent's PATH, not a fixed one: images put tools in places like
	// /opt/*/bin and operators expect to find them. The rest of the agent's
	// environment is deliberately not passed on (it may hold credentials).
	if u.path == "" {
		u.path = defaultPath
	}
	cu, err := user.Current()
	if err == nil {
		u.name, u.home = cu.Username, cu.HomeDir
	}
	if h, err := os.UserHomeDir(); err == nil && h != "" {
		u.home = h
	}
	if u.name == "" {
		u.name = os.Getenv("USER")
	}
	if u.name == "" {
		u.name = strconv.Itoa(os.Getuid())
	}
	if u.home == "" {
		u.home = "/"
	}
	u.dir = "/"
	if fi, err := os.Stat(u.home); err == nil && fi.IsDir() {
		u.dir = u.home
	}
	return u
}

// sessionContext is the ssh.Context a session's handlers see. gliderlabs
// passes the connection's context to every session, so values and
// cancellation would be shared by all sessions of a connection; this gives
// each session its own values (agent forwarding is requested per session)
// and a Done channel that closes when this session's channel closes, which
// is how a handler learns the client went away without disconnecting.
type sessionContext struct {
	ssh.Context // the connection's context, for metadata and the conn

	ctx    context.Context
	cancel context.CancelFunc
	state  *connState

	mu      sync.Mutex // guards the following fields
	values  map[any]any
	channel gossh.Channel
}

func newSessionContext(parent ssh.Context, st *connState) *sessionContext {
	ctx, cancel := context.WithCancel(parent)
	return &sessionContext{Context: parent, ctx: ctx, cancel: cancel, state: st, values: make(map[any]any)}
}

// Deadline implements context.Context.
func (c *sessionContext) Deadline() (time.Time, bool) { return c.ctx.Deadline() }

// Done implements context.Context: closed when the session channel or the
// connection ends.
func (c *sessionContext) Done() <-chan struct{} { return c.ctx.Done() }

// Err implements context.Context.
func (c *sessionContext) Err() error { return c.ctx.Err() }

// Value implements context.Context, looking at this session's values first.
func (c *sessionContext) Value(key any) any {
	c.mu.Lock()
	v, ok := c.values[key]
	c.mu.Unlock()
	if ok {
		return v
	}
	return c.ctx.Value(key)
}

// SetValue implements ssh.Context, storing key for this session only.
func (c *sessionContext) SetValue(key, value any) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.values[key] = value
}

// rawChannel returns the session channel itself. gliderlabs' Session.Write
// rewrites "\n" to "\r\n" when a PTY was requested, which would corrupt
// SFTP and double-translate terminal output the kernel tty already
// translated; these paths write to the channel directly.
func (c *sessionContext) rawChannel() gossh.Channel {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.channel
}

// acceptHook records the accepted channel in the session context.
type acceptHook struct {
	gossh.NewChannel
	sctx *sessionContext
}

func (a acceptHook) Accept() (gossh.Channel, <-chan *gossh.Request, error) {
	ch, reqs, err := a.NewChannel.Accept()
	if err == nil {
		a.sctx.mu.Lock()
		a.sctx.channel = ch
		a.sctx.mu.Unlock()
	}
	return ch, reqs, err
}

// sessionChannel handles a "session" channel. gliderlabs' default handler
// returns only once the channel is closed (its request channel ends), so
// cancelling the session context afterwards tells the handlers the session
// is over.
func (s *Server) sessionChannel(srv *ssh.Server, conn *gossh.ServerConn, newChan gossh.NewChannel, ctx ssh.Context) {
	st := connStateFrom(ctx)
	if st == nil || !st.tasks.add() {
		newChan.Reject(gossh.ResourceShortage, "connection is closing")
		return
	}
	defer st.tasks.done()
	sctx := newSessionContext(ctx, st)
	defer sctx.cancel()
	ssh.DefaultSessionHandler(srv, conn, acceptHook{NewChannel: newChan, sctx: sctx}, sctx)
}

// exitResult is how a session's process ended, as reported to the client.
type exitResult struct {
	status     int    // exit status; 128+n for a process killed by signal n
	signal     string // RFC 4254 signal name if killed by a standard signal
	coreDumped bool
}

// send reports r to the client and closes the channel. For a signal it
// sends exit-signal and then exit-status 128+n: RFC 4254 clients (such as
// x/crypto) see the signal, and OpenSSH's client, which ignores exit-signal,
// exits with the shell convention 128+n instead of 255.
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
	}
	_ = sess.Exit(r.status)
}

// handleSession serves "shell" and "exec" requests.
func (s *Server) handleSession(sess ssh.Session) {
	sctx, ok := sess.Context().(*sessionContext)
	if !ok || !sctx.state.tasks.add() {
		return
	}
	st := sctx.state
	defer st.tasks.done()

	raw := sess.RawCommand()
	kind := "exec"
	if raw == "" {
		kind = "shell"
	}
	log := st.log.With("user", sess.User(), "kind", kind)
	log.Debug("session command", "command", raw)
	// Everything, including the agent socket, is cleaned up before the
	// client learns the exit status.
	res := s.runSession(sctx, sess, raw, log)
	log.Info("session ended", "status", res.status, "signal", res.signal, "client_gone", sctx.Err() != nil)
	res.send(sess)
}

func (s *Server) runSession(sctx *sessionContext, sess ssh.Session, raw string, log *slog.Logger) exitResult {
	st := sctx.state
	ptyReq, winch, isPty := sess.Pty()
	log.Info("session started", "pty", isPty)

	// Client signals and window changes must be consumed for as long as the
	// channel lives: gliderlabs delivers both with blocking sends from its
	// request loop.
	proc := &procState{}
	sigs := make(chan ssh.Signal, 128) // gliderlabs buffers at most 128 early signals
	sess.Signals(sigs)
	st.tasks.goTracked(func() { proc.pump(sctx, sigs, winch) })

	env := s.sessionEnv(sess)
	if ssh.AgentRequested(sess) {
		if sock, cleanup, err := s.forwardAgent(sess, st); err != nil {
			log.Warn("agent forwarding unavailable", "err", err)
		} else {
			defer cleanup()
			env = append(env, "SSH_AUTH_SOCK="+sock)
		}
	}

	cmd := s.command(raw, env)
	if isPty {
		return s.runPTY(sctx, cmd, ptyReq, proc)
	}
	return s.runPipes(sctx, sess, cmd, proc)
}

// command builds the process for a session: a login shell when raw is
// empty (argv[0] prefixed with "-", as sshd and login do), else Shell -c raw.
func (s *Server) command(raw string, env []string) *exec.Cmd {
	var cmd *exec.Cmd
	if raw == "" {
		cmd = exec.Command(s.cfg.Shell)
		cmd.Args[0] = "-" + filepath.Base(s.cfg.Shell)
	} else {
		cmd = exec.Command(s.cfg.Shell, "-c", raw)
	}
	cmd.Env = env
	cmd.Dir = s.user.dir
	return cmd
}

// sessionEnv is the environment of a session's process: a fixed base plus
// the client's LANG and LC_* (what OpenSSH clients send by default); other
// client variables are ignored so a client cannot set LD_PRELOAD and the like.
func (s *Server) sessionEnv(sess ssh.Session) []string {
	u := s.user
	env := []string{
		"HOME=" + u.home,
		"USER=" + u.name,
		"LOGNAME=" + u.name,
		"SHELL=" + u.shell,
		"PATH=" + u.path,
	}
	if rh, rp, err := net.SplitHostPort(addrString(sess.RemoteAddr())); err == nil {
		if lh, lp, err := net.SplitHostPort(addrString(sess.LocalAddr())); err == nil {
			env = append(env,
				"SSH_CLIENT="+rh+" "+rp+" "+lp,
				"SSH_CONNECTION="+rh+" "+rp+" "+lh+" "+lp)
		}
	}
	for _, kv := range sess.Environ() {
		key, val, ok := strings.Cut(kv, "=")
		if !ok || strings.ContainsRune(val, 0) {
			continue
		}
		if key == "LANG" || (strings.HasPrefix(key, "LC_") && validEnvName(key)) {
			env = append(env, kv)
		}
	}
	return env
}

func validEnvName(k string) bool {
	for _, r := range k {
		if !(r == '_' || r >= 'A' && r <= 'Z' || r >= 'a' && r <= 'z' || r >= '0' && r <= '9') {
			return false
		}
	}
	return k != ""
}

// forwardAgent exposes the client's agent on a fresh Unix socket in a 0700
// temp directory; cleanup removes both.
func (s *Server) forwardAgent(sess ssh.Session, st *connState) (sock string, cleanup func(), err error) {
	l, err := ssh.NewAgentListener()
	if err != nil {
		return "", nil, fmt.Errorf("sshserver: agent listener: %w", err)
	}
	sock = l.Addr().String()
	cleanup = func() {
		l.Close()
		os.RemoveAll(filepath.Dir(sock))
	}
	if !st.tasks.goTracked(func() { ssh.ForwardAgentConnections(l, sess) }) {
		cleanup()
		return "", nil, fmt.Errorf("sshserver: agent forwarding: connection closing")
	}
	return sock, cleanup, nil
}

// runPipes runs cmd without a terminal, stdin/stdout/stderr on pipes.
// The pipes are *os.File on both ends, so os/exec starts no copy goroutines
// of its own and Wait returns when the process exits; the copying is ours.
func (s *Server) runPipes(sctx *sessionContext, sess ssh.Session, cmd *exec.Cmd, proc *procState) exitResult {
	var pipes [3][2]*os.File // [stdin, stdout, stderr][read, write]
	for i := range pipes {
		r, w, err := os.Pipe()
		if err != nil {
			for _, p := range pipes[:i] {
				p[0].Close()
				p[1].Close()
			}
			return startFailed(sess.Stderr(), err)
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
		return startFailed(sess.Stderr(), err)
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
	res := supervise(sctx, cmd, proc)
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

// startFailed reports a process that could not be started, with the status
// shells use for a command that cannot be run.
func startFailed(stderr io.Writer, err error) exitResult {
	fmt.Fprintf(stderr, "sshserver: start session: %v\r\n", err)
	return exitResult{status: 127}
}

// supervise waits for the session's process to exit, kills whatever is left
// in its session, reaps it and returns its status. If the session context
// ends first (client gone, Close, ServeConn's context), the whole session is
// killed right away.
func supervise(sctx *sessionContext, cmd *exec.Cmd, proc *procState) exitResult {
	pid := cmd.Process.Pid
	proc.started(pid)
	stop := make(chan struct{})
	watcherDone := make(chan struct{})
	go func() {
		defer close(watcherDone)
		select {
		case <-sctx.Done():
			killSession(pid)
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
	killSession(pid)
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

// procState is what the request pump needs to act on a session's process.
type procState struct {
	mu      sync.Mutex       // guards the following fields
	pid     int              // the running process; 0 before start and once it exited
	done    bool             // the process exited; signals are dropped
	pending []syscall.Signal // signals that arrived before the process started
	pty     *os.File         // PTY master, nil without a PTY or once closed
	win     *ssh.Window      // latest requested window size
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

// pump delivers client signals and window changes until the session ends.
func (p *procState) pump(ctx context.Context, sigs <-chan ssh.Signal, winch <-chan ssh.Window) {
	for {
		select {
		case sig := <-sigs:
			p.signal(sig)
		case w, ok := <-winch:
			if !ok {
				winch = nil
				continue
			}
			p.mu.Lock()
			p.win = &w
			if p.pty != nil {
				setWinsize(p.pty, w)
			}
			p.mu.Unlock()
		case <-ctx.Done():
			return
		}
	}
}
