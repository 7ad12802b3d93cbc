package sshserver

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/validate"
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
	proc   procState // receives the session's signals and window changes

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

// acceptHook records the accepted channel in the session context and puts
// filterRequests between the channel and gliderlabs' request loop.
type acceptHook struct {
	gossh.NewChannel
	sctx     *sessionContext
	filtered chan struct{} // closed when filterRequests is done
}

// Accept implements gossh.NewChannel.
func (a acceptHook) Accept() (gossh.Channel, <-chan *gossh.Request, error) {
	ch, reqs, err := a.NewChannel.Accept()
	if err != nil {
		close(a.filtered)
		return ch, reqs, err
	}
	a.sctx.mu.Lock()
	a.sctx.channel = ch
	a.sctx.mu.Unlock()
	out := make(chan *gossh.Request)
	go func() {
		defer close(a.filtered)
		a.sctx.filterRequests(reqs, out)
	}()
	return ch, out, nil
}

// filterRequests handles "window-change" and "signal" itself and passes the
// other session requests on. gliderlabs delivers those two with blocking
// channel sends from its request loop, to readers that only exist while a
// handler runs: a client sending a window change without ever starting a
// shell would wedge the loop, and with it Close. Here they are applied to
// the session's process state without blocking.
func (c *sessionContext) filterRequests(in <-chan *gossh.Request, out chan<- *gossh.Request) {
	defer close(out)
	for req := range in {
		switch req.Type {
		case "window-change":
			var p struct{ Cols, Rows, WidthPx, HeightPx uint32 }
			err := gossh.Unmarshal(req.Payload, &p)
			if err == nil {
				c.proc.resize(ssh.Window{Width: int(p.Cols), Height: int(p.Rows)})
			}
			if req.WantReply {
				req.Reply(err == nil, nil)
			}
		case KillOnEndRequest:
			c.proc.setKillOnEnd()
			if req.WantReply {
				req.Reply(true, nil)
			}
		case "signal":
			var p struct{ Signal string }
			err := gossh.Unmarshal(req.Payload, &p)
			if err == nil {
				c.proc.signal(ssh.Signal(p.Signal))
			}
			if req.WantReply {
				req.Reply(err == nil, nil)
			}
		default:
			out <- req
		}
	}
}

// sessionChannel handles a "session" channel. gliderlabs' default handler
// returns only once the channel is closed (its request channel ends), so
// cancelling the session context afterwards tells the handlers the session
// is over.
func (s *Server) sessionChannel(srv *ssh.Server, conn *gossh.ServerConn, newChan gossh.NewChannel, ctx ssh.Context) {
	// gliderlabs fixes ctx.User() at the first auth attempt; conn.User()
	// is the login that actually authenticated. Check the key against it.
	key, _ := ctx.Value(ssh.ContextKeyPublicKey).(ssh.PublicKey)
	if !s.allowedLogin(conn.User(), key) {
		newChan.Reject(gossh.Prohibited, "key not authorized for this login")
		return
	}
	st := connStateFrom(ctx)
	if st == nil || !st.tasks.add() {
		newChan.Reject(gossh.ResourceShortage, "connection is closing")
		return
	}
	defer st.tasks.done()
	sctx := newSessionContext(ctx, st)
	defer sctx.cancel()
	hook := acceptHook{NewChannel: newChan, sctx: sctx, filtered: make(chan struct{})}
	ssh.DefaultSessionHandler(srv, conn, hook, sctx)
	<-hook.filtered
}

// handleSession serves "shell" and "exec" requests.
func (s *Server) handleSession(sess ssh.Session) {
	sctx, ok := sess.Context().(*sessionContext)
	if !ok || !sctx.state.tasks.add() {
		return
	}
	st := sctx.state
	defer st.tasks.done()
	defer st.addSession(sess)()

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
	if res.err != nil {
		log.Warn("session failed", "err", res.err)
	}
	log.Info("session ended", "status", res.status, "signal", res.signal, "client_gone", sctx.Err() != nil)
	res.send(sess)
}

func (s *Server) runSession(sctx *sessionContext, sess ssh.Session, raw string, log *slog.Logger) exitResult {
	st := sctx.state
	// Window changes never reach gliderlabs (see filterRequests), so the
	// size in ptyReq is the one from the pty request.
	ptyReq, _, isPty := sess.Pty()
	log.Info("session started", "pty", isPty)

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
		return s.runPTY(sctx, cmd, ptyReq)
	}
	return s.runPipes(sctx, sess, cmd)
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
		if key == "LANG" || (strings.HasPrefix(key, "LC_") && validate.EnvName(key) == nil) {
			env = append(env, kv)
		}
	}
	return env
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
