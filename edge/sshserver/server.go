// Package sshserver is the embedded SSH server of the Tether edge agent.
//
// Many edge images ship without sshd, yet operators still need a shell, exec
// and file transfer on the node. The hub reaches the agent through the reverse
// tunnel and hands each stream for SSH to ServeConn as a net.Conn; there is no
// TCP listener, so the tunnel is the only way in. The hub also pushes the set
// of operator public keys authorized for the node (SetAuthorizedKeys) and,
// optionally, user certificate authorities (SetTrustedUserCAs). Nothing else
// is accepted: no passwords, no keyboard-interactive.
//
// The server does not switch users. Whatever login name the client presents,
// commands, shells and SFTP run as the agent's own OS user, with that user's
// home directory. Run the agent as the account operators should get.
//
// Every session runs in its own POSIX session (setsid), which is also its own
// process group. A command that exits by itself leaves its background jobs
// running, as under sshd, unless it ran on a terminal: then everything left
// in its session gets SIGHUP and SIGCONT, as from the closing terminal. When
// the session is cut short instead (the client disconnects, the channel
// closes, ServeConn's context is cancelled or Close is called) its session
// is hung up with or without a terminal, and a main process that survives
// that is killed after leaderGrace. What the user detached (nohup, setsid,
// systemd-run) survives a hangup. A client that sends KillOnEndRequest (the
// hub's job runner) gets SIGKILL for everything left in the session, however
// it ends. One that keeps
// the session's stdout or stderr open keeps the session open until the client
// disconnects, as with sshd. Reaching the whole session relies on /proc and
// is complete on Linux; elsewhere only the session's main process group is
// signalled. The package builds on Unix systems only.
//
// Supported: exec and shell sessions with or without a PTY, window changes,
// client signals, the "sftp" subsystem (which also serves OpenSSH 9's scp),
// agent forwarding (ssh -A), local and remote port forwarding to and on the
// node's loopback (forward.go). Denied: X11, forwarding anywhere else.
//
// Refused logins of known keys are told why (an SSH banner), and refusals,
// forwardings and connections closed after a trust change are reported
// through Config.OnEvent for the hub's audit. When the keys, CAs, revoked
// keys or principals change, connections whose key no longer may log in as
// their login are closed.
package sshserver

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// DefaultHandshakeTimeout bounds key exchange plus authentication when
// Config.HandshakeTimeout is zero. A stream that never completes the
// handshake would otherwise pin a goroutine and a tunnel stream forever.
const DefaultHandshakeTimeout = time.Minute

// Config configures a Server. The zero value is not usable: HostKeyPath is
// required so the node keeps a stable identity that operators can pin.
type Config struct {
	// HostKeyPath is the file holding the host private key, PEM encoded in
	// OpenSSH format. If the file does not exist an ed25519 key is generated
	// and written there atomically with mode 0600, so the node keeps the
	// same host key across restarts. An existing file that is readable by
	// group or others is used but logged as a warning. Required.
	HostKeyPath string

	// Shell runs interactive sessions (as a login shell) and commands
	// (Shell -c command). Empty means the agent user's login shell from the
	// password database, or /bin/sh if that is a nologin shell (a service
	// account's /usr/sbin/nologin or /bin/false would refuse every session)
	// or unknown; New logs which shell it chose and why.
	Shell string

	// OnEvent, if set, receives security-relevant events (refused logins,
	// port forwardings, connections closed because access was revoked) for
	// the hub's audit. It is called on the connection's goroutine and must
	// not block.
	OnEvent func(Event)

	// Logger receives connection and session events, each connection's
	// records carrying its remote address. Nil discards everything.
	Logger *slog.Logger

	// IdleTimeout, if non-zero, closes a connection once no data has moved
	// in either direction for this long. Zero means connections never idle
	// out, which suits long-running interactive sessions.
	IdleTimeout time.Duration

	// HandshakeTimeout bounds the SSH handshake and authentication of each
	// connection. Zero means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
}

// CheckAndSetDefaults validates c and fills in defaults for empty optional
// fields. New calls it; it is exported so callers can validate early.
func (c *Config) CheckAndSetDefaults() error {
	if c.HostKeyPath == "" {
		return errors.New("sshserver: Config.HostKeyPath is required")
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.IdleTimeout < 0 {
		return fmt.Errorf("sshserver: Config.IdleTimeout is negative (%v)", c.IdleTimeout)
	}
	if c.HandshakeTimeout < 0 {
		return fmt.Errorf("sshserver: Config.HandshakeTimeout is negative (%v)", c.HandshakeTimeout)
	}
	if c.HandshakeTimeout == 0 {
		c.HandshakeTimeout = DefaultHandshakeTimeout
	}
	return nil
}

// Server is an SSH server for connections handed to it one at a time by
// ServeConn. It is safe for concurrent use. Create it with New and release it
// with Close.
type Server struct {
	cfg    Config
	log    *slog.Logger
	signer gossh.Signer // the plain host key; certificates wrap it
	srv    *ssh.Server
	user   userInfo // the OS user every session runs as

	authorized atomic.Pointer[keySet] // operator keys, replaced wholesale
	userCAs    atomic.Pointer[keySet] // trusted user certificate authorities
	revoked    atomic.Pointer[keySet] // keys refused with or without a certificate
	principals atomic.Pointer[certPrincipals]
	noForward  atomic.Pointer[[]string]  // certificate principals that may not forward
	scoped     atomic.Pointer[scopedCAs] // user CAs of hubs above this node's site hub

	remoteForwards ssh.ForwardedTCPHandler // ssh -R listeners, per bind address

	mu     sync.Mutex // guards the following fields
	closed bool
	conns  map[net.Conn]*connState
	wg     sync.WaitGroup // one per ServeConn call in flight; Add only under mu
}

// New loads or creates the host key and returns a Server that accepts no
// keys until SetAuthorizedKeys or SetTrustedUserCAs is called.
func New(cfg Config) (*Server, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	signer, err := loadOrCreateHostKey(cfg.HostKeyPath, cfg.Logger)
	if err != nil {
		return nil, err
	}
	hangupReachesSessions()
	if cfg.Shell == "" {
		var why string
		cfg.Shell, why = defaultShell()
		cfg.Logger.Info("embedded SSH server shell", "shell", cfg.Shell, "why", why)
	}
	s := &Server{
		cfg:    cfg,
		log:    cfg.Logger,
		signer: signer,
		user:   currentUser(cfg.Shell),
		conns:  make(map[net.Conn]*connState),
	}
	s.authorized.Store(&keySet{})
	s.revoked.Store(&keySet{})
	s.userCAs.Store(&keySet{})
	s.scoped.Store(&scopedCAs{})
	s.srv = &ssh.Server{
		HostSigners: []ssh.Signer{signer},
		Version:     "Tether",
		Handler:     s.handleSession,
		// No gliderlabs PublicKeyHandler: serverConfig installs x/crypto's
		// callback itself, to give refused logins a reason (a banner).
		ConnCallback:         s.connCallback,
		ServerConfigCallback: s.serverConfig,
		IdleTimeout:          cfg.IdleTimeout,
		// Sessions, and ssh -L to the node's loopback (forward.go); other
		// channel types (X11) are refused.
		ChannelHandlers: map[string]ssh.ChannelHandler{
			"session":      s.sessionChannel,
			"direct-tcpip": s.directTCPIP,
		},
		RequestHandlers: map[string]ssh.RequestHandler{
			"tcpip-forward":        s.forwardRequest,
			"cancel-tcpip-forward": s.forwardRequest,
		},
		SubsystemHandlers: map[string]ssh.SubsystemHandler{
			"sftp": s.handleSFTP,
		},
		// forward.go decides before gliderlabs' handlers ask these; they
		// check again so nothing reaches the handlers undecided.
		LocalPortForwardingCallback: func(ctx ssh.Context, host string, _ uint32) bool {
			return isLoopbackHost(host) && s.forwardGrant(ctx) == nil
		},
		ReversePortForwardingCallback: func(ctx ssh.Context, host string, _ uint32) bool {
			return isLoopbackHost(host) && s.forwardGrant(ctx) == nil
		},
	}
	return s, nil
}

// HostSigner returns the host key, so the agent can report it to the hub or
// have it certified (see AddHostCertificate).
func (s *Server) HostSigner() gossh.Signer { return s.signer }

// AddHostCertificate makes the server present cert, a host certificate over
// HostSigner's public key, in addition to the plain host key. Clients that
// trust the signing CA (@cert-authority in known_hosts) can then verify the
// node without trust-on-first-use. A later certificate replaces an earlier
// one. It is safe to call while connections are being served; it affects
// new connections only.
func (s *Server) AddHostCertificate(cert *gossh.Certificate) error {
	if cert == nil {
		return errors.New("sshserver: add host certificate: nil certificate")
	}
	if cert.CertType != gossh.HostCert {
		return fmt.Errorf("sshserver: add host certificate: %w", ErrNotHostCert)
	}
	cs, err := gossh.NewCertSigner(cert, s.signer)
	if err != nil {
		return fmt.Errorf("sshserver: add host certificate: %w", err)
	}
	// gliderlabs replaces the signer with the same key type, so repeated
	// renewals do not accumulate, and takes its lock, so this is safe
	// against handshakes reading the list.
	s.srv.AddHostKey(cs)
	return nil
}

// ErrNotHostCert is returned by AddHostCertificate for a certificate that is
// not a host certificate (for example a user certificate).
var ErrNotHostCert = errors.New("not a host certificate")

// ServeConn runs the SSH protocol on conn until the client disconnects, ctx
// is cancelled or Close is called, and returns once every session of the
// connection has ended and its main processes are gone (what is left in
// their sessions was hung up, see the package doc). conn is always
// closed on return. Call it once per stream, typically in its own goroutine.
func (s *Server) ServeConn(ctx context.Context, conn net.Conn) {
	st, ok := s.trackConn(conn)
	if !ok {
		conn.Close()
		return
	}
	defer s.untrackConn(conn)

	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	// A peer that stalls before authenticating is cut off; once
	// authenticated, only IdleTimeout (if any) applies.
	hsTimer := time.AfterFunc(s.cfg.HandshakeTimeout, func() {
		if !st.authenticated.Load() {
			st.log.Debug("handshake timed out")
			conn.Close()
		}
	})
	defer hsTimer.Stop()

	st.log.Debug("connection started")
	// HandleConn returns when the transport ends. Sessions and their copy
	// loops may still be winding down; wait for them so the caller (and
	// Close) know nothing of this connection is left running.
	s.srv.HandleConn(&streamConn{Conn: conn, state: st})
	conn.Close()
	st.tasks.closeAndWait()
	if !st.authenticated.Load() {
		s.emit(Event{Kind: EventLoginFailed, Detail: "the connection ended without logging in"})
	}
	st.log.Debug("connection ended")
}

// Close closes every connection being served, which ends their sessions
// (hangs them up, see the package doc), and waits until all ServeConn calls have returned.
// Later ServeConn calls close their conn immediately. Close is idempotent and
// always returns nil; the error is there to satisfy io.Closer.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

func (s *Server) trackConn(conn net.Conn) (*connState, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, false
	}
	st := &connState{log: s.log.With("remote", addrString(conn.RemoteAddr()))}
	s.conns[conn] = st
	s.wg.Add(1)
	return st, true
}

func (s *Server) untrackConn(conn net.Conn) {
	s.mu.Lock()
	delete(s.conns, conn)
	s.mu.Unlock()
	s.wg.Done()
}

// streamConn carries the connection's state through gliderlabs' HandleConn
// to connCallback, which is the first place the ssh.Context exists.
type streamConn struct {
	net.Conn
	state *connState
}

// connState is what the server keeps per connection.
type connState struct {
	log           *slog.Logger
	authenticated atomic.Bool // set once user authentication succeeded
	tasks         tracker     // sessions and their helper goroutines

	mu       sync.Mutex          // guards the following fields
	login    login               // who authenticated, for recheckConns
	reported map[string]struct{} // events already reported (firstReport)
	sessions liveSessions        // shell and exec sessions; whether access was withdrawn (events.go)
}

type connStateKey struct{}

func connStateFrom(ctx context.Context) *connState {
	st, _ := ctx.Value(connStateKey{}).(*connState)
	return st
}

func (s *Server) connCallback(ctx ssh.Context, conn net.Conn) net.Conn {
	sc, ok := conn.(*streamConn)
	if !ok {
		// Only ServeConn feeds HandleConn, so this cannot happen; refuse
		// rather than serve a connection nobody tracks.
		return nil
	}
	ctx.SetValue(connStateKey{}, sc.state)
	return sc.Conn
}

// serverConfig adds what gliderlabs does not expose to the x/crypto config.
func (s *Server) serverConfig(ctx ssh.Context) *gossh.ServerConfig {
	return &gossh.ServerConfig{
		PublicKeyCallback: func(md gossh.ConnMetadata, key gossh.PublicKey) (*gossh.Permissions, error) {
			return s.publicKeyCallback(ctx, md, key)
		},
		// With no gliderlabs auth handler set, gliderlabs sets
		// NoClientAuth; this callback is what then refuses the "none"
		// method (TestNoneAuthRefused).
		NoClientAuthCallback: func(gossh.ConnMetadata) (*gossh.Permissions, error) {
			return nil, errors.New("sshserver: public key authentication required")
		},
		// AuthLogCallback is the one hook that fires after a signature
		// was verified (the public key callback also runs for mere
		// queries), so it is where the handshake counts as done.
		AuthLogCallback: func(md gossh.ConnMetadata, method string, err error) {
			st := connStateFrom(ctx)
			if st == nil {
				return
			}
			if err != nil {
				if method != "none" {
					st.log.Debug("authentication attempt failed", "user", md.User(), "method", method, "err", err)
				}
				return
			}
			st.authenticated.Store(true)
			attrs := []any{"user", md.User(), "method", method}
			if key, ok := ctx.Value(ssh.ContextKeyPublicKey).(ssh.PublicKey); ok {
				attrs = append(attrs, "key", keyDescription(key))
				st.setLogin(login{user: md.User(), key: key, operator: s.operatorOf(key)})
				s.emit(Event{
					Kind: EventLoginAccepted, Login: md.User(), Operator: s.operatorOf(key),
					KeyFingerprint: fingerprint(key),
				})
			}
			st.log.Info("authenticated", attrs...)
		},
	}
}

// tracker counts goroutines so their owner can wait for them, and refuses
// new ones once closing, which makes Add-after-Wait impossible.
type tracker struct {
	mu     sync.Mutex // guards closed and serializes wg.Add with it
	closed bool
	wg     sync.WaitGroup
}

// add registers one unit of work; false means the tracker is closing and the
// work must not start.
func (t *tracker) add() bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.closed {
		return false
	}
	t.wg.Add(1)
	return true
}

func (t *tracker) done() { t.wg.Done() }

// goTracked runs f in a tracked goroutine, or not at all if closing.
func (t *tracker) goTracked(f func()) bool {
	if !t.add() {
		return false
	}
	go func() {
		defer t.done()
		f()
	}()
	return true
}

func (t *tracker) closeAndWait() {
	t.mu.Lock()
	t.closed = true
	t.mu.Unlock()
	t.wg.Wait()
}

func addrString(a net.Addr) string {
	if a == nil {
		return ""
	}
	return a.String()
}
