package edge

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/edge/sshserver"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// SSHEmbedded selects the embedded SSH server as the target of ssh streams.
const SSHEmbedded = "embedded"

// Config configures the agent.
type Config struct {
	StateDir   string
	SSHTarget  string   // "embedded" or HOST:PORT of a local sshd (default 127.0.0.1:22)
	AllowPorts []uint16 // local TCP ports the hub may open streams to; empty = none
	// SSHDHostKey is the local sshd's host key (its ".pub" is read and sent
	// to the hub to be certified); used when SSHTarget is not embedded.
	// Default /etc/ssh/ssh_host_ed25519_key.
	SSHDHostKey string
	// ManageSSHD, if set, installs the host certificate, the user CAs and
	// the revoked keys from the hub into the local sshd's configuration
	// (see edge/sshdconf) and reloads it when they change.
	ManageSSHD *SSHDManager
	Transport  tunnel.Transport
	Tunnel     *tunnel.Config
	BackoffMin time.Duration // default 500ms
	BackoffMax time.Duration // cap of the exponential backoff, default 30s
	Logger     *slog.Logger

	// Identity, if set, is used instead of the one in StateDir, and StateDir
	// may then be empty: no status file is written and a renewed
	// certificate is kept in memory only. The agent simulator in bench/
	// runs thousands of agents in one process this way.
	Identity *Identity
	// SSHHostKey is the embedded SSH server's host key file (created if
	// missing). Default StateDir/ssh_host_ed25519_key.
	SSHHostKey string
	// SourceIP, if set, is the local address the tunnel is dialed from
	// (tunnel.Dialer.LocalIP).
	SourceIP net.IP
	// UDP, if set, carries the QUIC tunnel on this shared socket
	// (tunnel.Dialer.UDP) instead of a socket of its own.
	UDP *tunnel.UDPSocket
	// OnStatus, if set, is called with every status change (connecting,
	// connected, ...), after the status file is written.
	OnStatus func(Status)
	// OnControl, if set, is called with every message the hub sends on the
	// control stream once the agent has acted on it, on the stream's reader
	// (so it must not block). The agent simulator in bench/ times the key
	// pushes of an access change this way.
	OnControl func(*control.Message)
}

// CheckAndSetDefaults validates c and fills defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.StateDir == "" && c.Identity == nil {
		return errors.New("edge: StateDir is required (--state-dir)")
	}
	if c.SSHTarget == SSHEmbedded && c.SSHHostKey == "" {
		if c.StateDir == "" {
			return errors.New("edge: the embedded SSH server needs a host key file (SSHHostKey) when there is no state dir")
		}
		c.SSHHostKey = filepath.Join(c.StateDir, hostKeyFile)
	}
	if c.SSHTarget == "" {
		c.SSHTarget = "127.0.0.1:22"
	}
	if c.SSHDHostKey == "" {
		c.SSHDHostKey = "/etc/ssh/ssh_host_ed25519_key"
	}
	if c.SSHTarget != SSHEmbedded {
		if _, _, err := net.SplitHostPort(c.SSHTarget); err != nil {
			return fmt.Errorf("edge: --ssh %q: want %q or HOST:PORT of a local sshd", c.SSHTarget, SSHEmbedded)
		}
	}
	for _, p := range c.AllowPorts {
		if p == 0 {
			return errors.New("edge: allowed port 0 is invalid")
		}
	}
	if c.BackoffMin <= 0 {
		c.BackoffMin = 500 * time.Millisecond
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 30 * time.Second
	}
	if c.BackoffMax < c.BackoffMin {
		return fmt.Errorf("edge: backoff cap %s is below the minimum %s", c.BackoffMax, c.BackoffMin)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Tunnel != nil {
		if err := c.Tunnel.Validate(); err != nil {
			return fmt.Errorf("edge: %w", err)
		}
	}
	return nil
}

// Agent keeps a node connected to its hub.
type Agent struct {
	cfg  Config
	idMu sync.Mutex // guards id.Cert (replaced on renewal) and tickets
	id   *Identity
	// tickets holds the hub's TLS session tickets; replaced on renewal so
	// that the next session presents the new certificate.
	tickets tls.ClientSessionCache
	log     *slog.Logger
	sshd    *sshserver.Server // nil unless SSHTarget is embedded
	allow   map[uint16]bool

	statusMu sync.Mutex // guards status
	status   Status
}

// ErrRefused means the hub refuses this identity for good (the node was
// removed, or the identity does not match); re-join is needed.
var ErrRefused = errors.New("hub refused this node")

// New loads the identity from the state dir and prepares services.
func New(cfg Config) (*Agent, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	id := cfg.Identity
	if id == nil {
		var err error
		if id, err = LoadIdentity(cfg.StateDir); err != nil {
			return nil, err
		}
	}
	a := &Agent{cfg: cfg, id: id, log: cfg.Logger.With("node", id.Config.Name), allow: map[uint16]bool{}}
	for _, p := range cfg.AllowPorts {
		a.allow[p] = true
	}
	if cfg.SSHTarget == SSHEmbedded {
		var err error
		a.sshd, err = sshserver.New(sshserver.Config{
			HostKeyPath: cfg.SSHHostKey,
			Logger:      a.log.With("component", "sshd"),
		})
		if err != nil {
			return nil, err
		}
	}
	a.status = Status{Name: id.Config.Name, NodeID: id.Config.NodeID, State: "connecting", Since: time.Now().UTC(),
		CertExpires: id.Cert.Leaf.NotAfter, PID: os.Getpid(), Version: Version}
	return a, nil
}

func (a *Agent) setStatus(f func(*Status)) {
	a.statusMu.Lock()
	f(&a.status)
	st := a.status
	a.statusMu.Unlock()
	if a.cfg.StateDir != "" {
		if err := writeStatus(a.cfg.StateDir, st); err != nil {
			a.log.Warn("write status file", "err", err)
		}
	}
	if a.cfg.OnStatus != nil {
		a.cfg.OnStatus(st)
	}
}

// Run connects and reconnects forever (capped exponential backoff with full
// jitter) until ctx is cancelled or the hub says this node was removed.
func (a *Agent) Run(ctx context.Context) error {
	if a.sshd != nil {
		defer a.sshd.Close()
	}
	attempt := 0
	for {
		if err := a.checkExpiry(); err != nil {
			a.setStatus(func(s *Status) { s.State = "rejoin-needed"; s.LastError = err.Error(); s.Since = time.Now().UTC() })
			return err
		}
		connected, err := a.runOnce(ctx)
		if ctx.Err() != nil {
			a.setStatus(func(s *Status) { s.State = "stopped"; s.Since = time.Now().UTC() })
			return nil
		}
		if errors.Is(err, ErrRefused) {
			a.setStatus(func(s *Status) { s.State = "refused"; s.LastError = err.Error(); s.Since = time.Now().UTC() })
			return err
		}
		if connected {
			attempt = 0
		}
		wait := backoff(attempt, a.cfg.BackoffMin, a.cfg.BackoffMax)
		attempt++
		a.log.Warn("hub connection lost; retrying", "err", err, "in", wait.Round(time.Millisecond))
		a.setStatus(func(s *Status) {
			s.State, s.LastError, s.Transport, s.Since = "connecting", errString(err), "", time.Now().UTC()
		})
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// backoff is "full jitter": uniform in [0, min(cap, base*2^attempt)], with
// the base as a floor so a flapping hub is not hammered.
func backoff(attempt int, base, max time.Duration) time.Duration {
	d := base
	for i := 0; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return base/2 + time.Duration(rand.Int64N(int64(d)))
}

// runOnce makes one connection and serves it until it ends. connected
// reports whether the hub accepted the session.
func (a *Agent) runOnce(ctx context.Context) (connected bool, err error) {
	tc := pki.ClientTLSConfig(a.cert(), a.id.CA)
	// Resume the last session's TLS state when the hub allows it: after a
	// hub restart the whole fleet reconnects at once, and a resumed
	// handshake costs both sides far less than a full one.
	tc.ClientSessionCache = a.sessionCache()
	d := &tunnel.Dialer{TLSConfig: tc, Config: a.cfg.Tunnel, Transport: a.cfg.Transport, Logger: a.log,
		LocalIP: a.cfg.SourceIP, UDP: a.cfg.UDP}
	var sess tunnel.Session
	var hub string
	var errs []error
	for _, addr := range a.id.Config.Hubs {
		dctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		sess, err = d.Dial(dctx, addr)
		cancel()
		if err == nil {
			hub = addr
			break
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	if sess == nil {
		return false, errors.Join(errs...)
	}
	defer sess.Close()
	log := a.log.With("hub", hub, "transport", sess.Transport().String())

	// Stop everything of this session when ctx ends.
	stop := context.AfterFunc(ctx, func() { sess.Close() })
	defer stop()

	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	ctrl, err := sess.OpenStream(octx)
	cancel()
	if err != nil {
		return false, fmt.Errorf("open control stream: %w", err)
	}
	defer ctrl.Close()
	caps := []string{"tcp", capHeartbeat}
	if a.sshd != nil {
		caps = append(caps, "ssh-embedded")
	} else {
		caps = append(caps, "ssh-local")
	}
	hello := &control.Message{Type: control.TypeHello, Hello: &control.Hello{ProtocolVersion: control.ProtocolVersion,
		Name: a.id.Config.Name, AgentVersion: Version, Facts: GatherFacts(), Capabilities: caps, HostKey: a.hostKeyLine(log), StateDir: absStateDir(a.cfg.StateDir)}}
	var sendMu sync.Mutex
	send := func(m *control.Message) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		_ = ctrl.SetWriteDeadline(time.Now().Add(10 * time.Second))
		return control.Write(ctrl, m)
	}
	if err := send(hello); err != nil {
		return false, err
	}
	_ = ctrl.SetReadDeadline(time.Now().Add(15 * time.Second))
	msg, err := control.Read(ctrl)
	if err != nil {
		return false, fmt.Errorf("waiting for welcome: %w", err)
	}
	if msg.Type == control.TypeNotice {
		if msg.Fatal {
			return false, fmt.Errorf("%w: %s", ErrRefused, msg.Notice)
		}
		return false, fmt.Errorf("hub: %s", msg.Notice)
	}
	if msg.Type != control.TypeWelcome {
		return false, fmt.Errorf("hub sent %s instead of welcome", msg.Type)
	}
	_ = ctrl.SetReadDeadline(time.Time{})
	log.Info("connected to hub")
	a.setStatus(func(s *Status) {
		s.State, s.Hub, s.Transport, s.LastError, s.Since = "connected", hub, sess.Transport().String(), "", time.Now().UTC()
	})

	var wg sync.WaitGroup
	defer wg.Wait()
	sctx, scancel := context.WithCancel(ctx)
	defer scancel()

	renewed := make(chan struct{}, 1)
	wg.Add(3)
	go func() {
		defer wg.Done()
		a.acceptStreams(sctx, sess, log, &wg)
		scancel()
	}()
	go func() {
		defer wg.Done()
		a.renewLoop(sctx, send, renewed, log)
	}()
	go func() {
		defer wg.Done()
		hb := time.Duration(msg.Welcome.HeartbeatSeconds) * time.Second
		if hb <= 0 {
			hb = 30 * time.Second
		}
		t := time.NewTicker(hb)
		defer t.Stop()
		for {
			select {
			case <-sctx.Done():
				return
			case <-t.C:
				if err := send(&control.Message{Type: control.TypeHeartbeat}); err != nil {
					sess.Close()
					return
				}
			}
		}
	}()
	hubBeats := false // set by the hub's first heartbeat
	silent := a.silentLimit(time.Duration(msg.Welcome.HeartbeatSeconds) * time.Second)
	for {
		if hubBeats {
			// A hub that heartbeats and falls silent is gone, or the link
			// is half-open: close explicitly (the hub hears of it if its
			// direction still works) before QUIC's idle timeout, which
			// never fires while packets still arrive, would end it silently.
			_ = ctrl.SetReadDeadline(time.Now().Add(silent))
		}
		msg, err := control.Read(ctrl)
		if err != nil {
			scancel()
			sess.Close()
			if errors.Is(err, io.EOF) {
				return true, errors.New("hub closed the control stream")
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return true, fmt.Errorf("no heartbeat from the hub for %s: the hub is gone or the link is half-open", silent)
			}
			return true, fmt.Errorf("control stream: %w", err)
		}
		switch msg.Type {
		case control.TypeHeartbeat:
			hubBeats = true
		case control.TypeAuthorizedKeys:
			a.setAuthorizedKeys(msg.AuthorizedKeys, log)
		case control.TypeSSHTrust:
			a.applySSHTrust(msg.SSHTrust, log)
		case control.TypeRenewed:
			if err := a.applyRenewed(msg.Cert); err != nil {
				log.Error("renewed certificate rejected", "err", err)
				continue
			}
			leaf := a.cert().Leaf
			log.Info("node certificate renewed", "valid_until", leaf.NotAfter.UTC().Format(time.RFC3339))
			a.setStatus(func(s *Status) { s.CertExpires = leaf.NotAfter })
			select {
			case renewed <- struct{}{}:
			default:
			}
		case control.TypeNotice:
			log.Warn("hub notice", "notice", msg.Notice)
			if msg.Fatal {
				scancel()
				sess.Close()
				return true, fmt.Errorf("%w: %s", ErrRefused, msg.Notice)
			}
		default:
			log.Warn("unexpected control message from hub", "type", msg.Type)
		}
		if a.cfg.OnControl != nil {
			a.cfg.OnControl(msg)
		}
	}
}

// hostKeyLine is the SSH host public key the hub should certify: the
// embedded server's, or the local sshd's read from SSHDHostKey.pub.
func (a *Agent) hostKeyLine(log *slog.Logger) string {
	if a.sshd != nil {
		return string(gossh.MarshalAuthorizedKey(a.sshd.HostSigner().PublicKey()))
	}
	path := a.cfg.SSHDHostKey
	if a.cfg.ManageSSHD != nil {
		path = a.cfg.ManageSSHD.Paths.HostKey
	}
	b, err := os.ReadFile(path + ".pub")
	if err != nil {
		log.Info("no local sshd host key to certify; operators must verify it themselves", "err", err)
		return ""
	}
	if _, _, _, _, err := gossh.ParseAuthorizedKey(b); err != nil {
		log.Warn("unreadable sshd host public key", "path", a.cfg.SSHDHostKey+".pub", "err", err)
		return ""
	}
	return string(b)
}

// applySSHTrust installs the host certificate and user CAs the hub sent.
func (a *Agent) applySSHTrust(t *control.SSHTrust, log *slog.Logger) {
	cas := make([]gossh.PublicKey, 0, len(t.UserCAs))
	for _, l := range t.UserCAs {
		k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(l))
		if err != nil {
			log.Warn("ignoring unreadable user CA from hub", "err", err)
			continue
		}
		cas = append(cas, k)
	}
	var cert *gossh.Certificate
	if t.HostCert != "" {
		k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(t.HostCert))
		c, ok := k.(*gossh.Certificate)
		if err != nil || !ok {
			log.Warn("ignoring unreadable host certificate from hub", "err", err)
		} else {
			cert = c
		}
	}
	if a.sshd != nil {
		a.sshd.SetTrustedUserCAs(cas)
		a.sshd.SetRevokedKeys(parseKeys(t.RevokedKeys, log))
		// Always role-scoped: an empty map means no certificate logs in.
		a.sshd.SetCertPrincipals(nonNil(t.Principals), t.AnyLogin)
		if cert != nil {
			if err := a.sshd.AddHostCertificate(cert); err != nil {
				log.Warn("host certificate from hub not usable", "err", err)
				return
			}
			log.Info("SSH host certificate installed", "principals", cert.ValidPrincipals,
				"valid_until", time.Unix(int64(cert.ValidBefore), 0).UTC().Format(time.RFC3339))
		}
		return
	}
	if a.cfg.ManageSSHD != nil {
		if err := a.cfg.ManageSSHD.apply(cert, cas, parseKeys(t.RevokedKeys, log), t.Principals, log); err != nil {
			log.Error("configure local sshd", "err", err)
		}
		return
	}
	if cert != nil {
		log.Info("received an SSH host certificate for the local sshd; run with --manage-sshd to install it")
	}
}

func parseKeys(lines []string, log *slog.Logger) []gossh.PublicKey {
	out := make([]gossh.PublicKey, 0, len(lines))
	for _, l := range lines {
		k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(l))
		if err != nil {
			log.Warn("ignoring unreadable key from hub", "err", err)
			continue
		}
		out = append(out, k)
	}
	return out
}

func (a *Agent) setAuthorizedKeys(lines []string, log *slog.Logger) {
	if a.sshd == nil {
		return
	}
	keys := make([]sshserver.AuthorizedKey, 0, len(lines))
	for _, l := range lines {
		k, _, options, _, err := gossh.ParseAuthorizedKey([]byte(l))
		if err != nil {
			log.Warn("ignoring unreadable authorized key from hub", "err", err)
			continue
		}
		ak := sshserver.AuthorizedKey{Key: k}
		for _, o := range options {
			// tether-logins="root,ubuntu": the logins the operator's roles
			// allow on this node; absent means any login.
			if v, ok := strings.CutPrefix(o, "tether-logins="); ok {
				ak.Logins = strings.Split(strings.Trim(v, `"`), ",")
			}
		}
		keys = append(keys, ak)
	}
	a.sshd.SetAuthorizedKeyLogins(keys)
	log.Debug("authorized keys updated", "count", len(keys))
}

// absStateDir is the state dir as an absolute, clean path for the hub ("" if
// it cannot be made absolute).
func absStateDir(dir string) string {
	if dir == "" {
		return ""
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	return abs
}

// capHeartbeat in the hello asks the hub for heartbeats on the control
// stream (the hub announces nothing: its first heartbeat arms the watchdog).
const capHeartbeat = "heartbeat"

// silentLimit is how long the hub may be silent on the control stream once
// it heartbeats: IdleTimeout (the dead-peer timeout), as the hub's own
// limit, but at least two of the hub's heartbeat intervals (every, from the
// welcome) should the two be configured differently.
func (a *Agent) silentLimit(every time.Duration) time.Duration {
	idle := tunnel.DefaultIdleTimeout
	if c := a.cfg.Tunnel; c != nil && c.IdleTimeout > 0 {
		idle = c.IdleTimeout
	}
	return max(idle, 2*every, 2*time.Second)
}
