// Package bastion is the hub's SSH server for operators. It authenticates
// operators by public key and serves exactly one thing: direct-tcpip channels
// (what `ssh -J` and ProxyJump use) to *node names*, each relayed over a
// stream through the node's tunnel. Operator-to-node SSH stays end-to-end
// encrypted: the hub only moves the bytes of the inner SSH connection.
package bastion

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gliderlabs/ssh"
	"github.com/prometheus/client_golang/prometheus"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// JumpRequest is one operator's request to reach a node.
type JumpRequest struct {
	// ID names this jump attempt among all of this bastion's, from 1; the
	// record of its end carries the same ID.
	ID             uint64
	Operator       string
	Key            gossh.PublicKey // the key or certificate that authenticated
	KeyFingerprint string          // SHA256:… of Key
	Remote         string          // operator's address
	Node           string
	Header         tunnel.Header
	// Stop ends the jump while it is live: the relay closes both sides and
	// the jump is recorded with result "ended" ("ended: access withdrawn"
	// when cause wraps ErrAccessWithdrawn) and cause as its error. A Dialer
	// keeps it to end jumps whose access is withdrawn later. Safe to call
	// at any time, more than once; calls after the first do nothing.
	Stop func(cause error)
}

// Dialer checks a jump request and opens the stream to the node. ctx is
// the jump's own: it ends when the jump does.
type Dialer interface {
	Dial(ctx context.Context, req JumpRequest) (tunnel.Stream, error)
}

// ErrAccessWithdrawn is wrapped by the cause of a jump stopped because the
// operator may no longer reach the node (operator removed, key revoked,
// roles narrowed).
var ErrAccessWithdrawn = errors.New("access withdrawn")

// endedResult is the recorded result of a jump stopped by cause.
func endedResult(cause error) string {
	if errors.Is(cause, ErrAccessWithdrawn) {
		return "ended: access withdrawn"
	}
	return "ended"
}

// JumpRecord is what the bastion reports for every jump attempt, for audit.
type JumpRecord struct {
	JumpRequest
	Start, End    time.Time
	Result        string // ok, not_a_node, dial_failed, …
	Error         string
	BytesToNode   int64
	BytesFromNode int64
}

// Authorizer decides whether key may log in as user; nil denies everyone.
type Authorizer func(user string, key gossh.PublicKey) bool

// Config configures the bastion.
type Config struct {
	Addr       string       // listen address, e.g. 127.0.0.1:2222
	HostSigner gossh.Signer // the hub's SSH host key
	// HostCertSigner, if set, presents a host certificate for HostSigner's
	// key too, so clients that trust the host CA need no known_hosts entry.
	HostCertSigner gossh.Signer
	Authorize      Authorizer   // operator check; nil denies all
	Dialer         Dialer       // reaches nodes
	NodeSuffix     string       // optional DNS-ish suffix stripped from targets, default ".tether"
	Logger         *slog.Logger // nil discards
	// OnJump, if set, is called once per jump attempt when it ends.
	OnJump  func(JumpRecord)
	Metrics *metrics.Metrics // nil disables
	// HandshakeTimeout bounds the time from TCP accept to successful auth
	// (slowloris); default 20s.
	HandshakeTimeout time.Duration
	// Limiter, if set, counts connections that end without authenticating
	// per source address and refuses sources that fail too often.
	Limiter *ratelimit.Limiter
	// OnLoginFailure, if set, is called for every connection that ended
	// without authenticating and for reported rate-limit refusals.
	OnLoginFailure func(LoginFailure)
	// RateLimited, if set, counts every connection the Limiter refused.
	RateLimited prometheus.Counter
	// IsSite, if set, reports whether name is one of this hub's child
	// sites: a dotted target whose last label is one ("n7.berlin",
	// "n7.sub.berlin") is a node below it (SiteTarget). Nil accepts node
	// names only.
	IsSite func(name string) bool
	// Ciphers are the SSH ciphers offered to operators, in order; empty:
	// DefaultCiphers.
	Ciphers []string
}

// Bastion is the operators' SSH server.
type Bastion struct {
	cfg    Config
	srv    *ssh.Server
	ln     net.Listener
	wg     sync.WaitGroup
	ctx    context.Context
	cancel context.CancelFunc
	jumps  atomic.Uint64 // the last JumpRequest.ID given
}

// New validates cfg and builds the server.
func New(cfg Config) (*Bastion, error) {
	if cfg.HostSigner == nil || cfg.Dialer == nil {
		return nil, errors.New("bastion: HostSigner and Dialer are required")
	}
	if cfg.NodeSuffix == "" {
		cfg.NodeSuffix = ".tether"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.HandshakeTimeout <= 0 {
		cfg.HandshakeTimeout = 20 * time.Second
	}
	if len(cfg.Ciphers) == 0 {
		cfg.Ciphers = DefaultCiphers()
	}
	b := &Bastion{cfg: cfg}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.srv = &ssh.Server{
		Version:     "Tether",
		HostSigners: hostSigners(cfg),
		// accept refuses rate-limited sources and arms the handshake
		// deadline (handshake.go).
		ConnCallback: b.accept,
		// gliderlabs fixes ctx.User() at the first auth attempt, while a
		// client may name another user in later attempts; the user that
		// finally authenticated is re-checked against the key in
		// directTCPIP (conn.User()), so this check alone is not trusted.
		PublicKeyHandler: func(ctx ssh.Context, key ssh.PublicKey) bool {
			if g := guardOf(ctx); g == nil || g.limited > 0 {
				return false
			}
			return cfg.Authorize != nil && cfg.Authorize(ctx.User(), key)
		},
		ServerConfigCallback: func(ctx ssh.Context) *gossh.ServerConfig {
			g := guardOf(ctx)
			return &gossh.ServerConfig{
				Config:          gossh.Config{Ciphers: cfg.Ciphers},
				MaxAuthTries:    6,
				AuthLogCallback: g.authLog,
				BannerCallback:  g.banner,
			}
		},
		Handler: func(s ssh.Session) {
			fmt.Fprintf(s.Stderr(), "tether: this is a jump host; it has no shell. Use it with ssh -J %s@HUB NODE, e.g. `ssh -J %s@%s root@NODE`\n",
				s.User(), s.User(), cfg.Addr)
			_ = s.Exit(1)
		},
		ChannelHandlers: map[string]ssh.ChannelHandler{
			"session":      ssh.DefaultSessionHandler,
			"direct-tcpip": b.directTCPIP,
		},
	}
	return b, nil
}

func hostSigners(cfg Config) []ssh.Signer {
	out := []ssh.Signer{cfg.HostSigner}
	if cfg.HostCertSigner != nil {
		out = append([]ssh.Signer{cfg.HostCertSigner}, out...)
	}
	return out
}

// Listen binds the address; Serve then accepts.
func (b *Bastion) Listen() (net.Addr, error) {
	ln, err := net.Listen("tcp", b.cfg.Addr)
	if err != nil {
		return nil, fmt.Errorf("bastion: listen on %s: %w", b.cfg.Addr, err)
	}
	b.ln = ln
	return ln.Addr(), nil
}

// Serve accepts operator connections until Close.
func (b *Bastion) Serve() error {
	err := b.srv.Serve(b.ln)
	if errors.Is(err, ssh.ErrServerClosed) {
		return nil
	}
	return err
}

// Close stops the listener, closes all operator connections and waits for
// relays to finish.
func (b *Bastion) Close() error {
	b.cancel()
	err := b.srv.Close()
	b.wg.Wait()
	return err
}

// directTCPIPData is RFC 4254 7.2's channel-open payload.
type directTCPIPData struct {
	DestAddr   string
	DestPort   uint32
	OriginAddr string
	OriginPort uint32
}

// ErrNotANode is returned for any target that is not a node name.
var ErrNotANode = errors.New("not a node")

// ErrDenied is wrapped by Dialer errors that refuse a jump by policy (roles,
// revocation), reported to the client as "administratively prohibited".
var ErrDenied = errors.New("access denied")

// Target turns a direct-tcpip destination into a node name and stream header.
// Only node names (optionally with the suffix) are accepted: IP addresses,
// localhost and anything else that is not a valid node name are refused, so
// the bastion can never be used to reach the hub's own network.
func Target(host string, port uint32, suffix string) (string, tunnel.Header, error) {
	name := strings.TrimSuffix(strings.ToLower(host), suffix)
	if net.ParseIP(strings.Trim(host, "[]")) != nil || name == "localhost" {
		return "", tunnel.Header{}, fmt.Errorf("%w: %q is an address; tether forwards only to node names", ErrNotANode, host)
	}
	if err := pki.ValidateName(name); err != nil {
		return "", tunnel.Header{}, fmt.Errorf("%w: %v", ErrNotANode, err)
	}
	switch {
	case port == 22:
		return name, tunnel.Header{Service: tunnel.ServiceSSH}, nil
	case port >= 1 && port <= 65535:
		return name, tunnel.Header{Service: tunnel.ServiceTCP, Port: uint16(port)}, nil
	default:
		return "", tunnel.Header{}, fmt.Errorf("%w: port %d out of range", ErrNotANode, port)
	}
}

// SiteTarget is Target for a node below one of this hub's sites: a node
// path ("n7.berlin", "n7.sub.berlin", each label a node name) whose last
// label isSite names. Anything else is refused as Target refuses it.
func SiteTarget(host string, port uint32, suffix string, isSite func(string) bool) (string, tunnel.Header, error) {
	name := strings.TrimSuffix(strings.ToLower(host), suffix)
	i := strings.LastIndexByte(name, '.')
	if i < 0 || control.ValidNodePath(name) != nil || !isSite(name[i+1:]) {
		return Target(host, port, suffix)
	}
	_, hdr, err := Target(name[:strings.IndexByte(name, '.')], port, suffix)
	if err != nil {
		return "", tunnel.Header{}, err
	}
	return name, hdr, nil
}

func (b *Bastion) result(r string) {
	if b.cfg.Metrics != nil {
		b.cfg.Metrics.JumpAttempts.WithLabelValues(r).Inc()
	}
}

func (b *Bastion) directTCPIP(_ *ssh.Server, conn *gossh.ServerConn, newChan gossh.NewChannel, ctx ssh.Context) {
	// The jump's own context: Stop ends it with a cause, the bastion's
	// Close with context.Canceled.
	jctx, stop := context.WithCancelCause(b.ctx)
	defer stop(nil)
	rec := JumpRecord{Start: time.Now(), JumpRequest: JumpRequest{ID: b.jumps.Add(1), Operator: conn.User(), Remote: conn.RemoteAddr().String(), Stop: stop}}
	key, _ := ctx.Value(ssh.ContextKeyPublicKey).(ssh.PublicKey)
	if key != nil {
		rec.Key, rec.KeyFingerprint = key, gossh.FingerprintSHA256(key)
	}
	stopped := func() error {
		if cause := context.Cause(jctx); cause != nil && !errors.Is(cause, context.Canceled) {
			return cause
		}
		return nil
	}
	finish := func(result string, err error) {
		b.result(result)
		rec.Result, rec.End = result, time.Now()
		if err != nil {
			rec.Error = err.Error()
		}
		if b.cfg.OnJump != nil {
			b.cfg.OnJump(rec)
		}
	}
	// conn.User() is the user that authenticated; the key must belong to it.
	if key == nil || b.cfg.Authorize == nil || !b.cfg.Authorize(conn.User(), key) {
		finish("denied", fmt.Errorf("%w: key not authorized for %q", ErrDenied, conn.User()))
		_ = newChan.Reject(gossh.Prohibited, "tether: authentication does not match the user")
		return
	}
	var d directTCPIPData
	if err := gossh.Unmarshal(newChan.ExtraData(), &d); err != nil {
		finish("bad_request", err)
		_ = newChan.Reject(gossh.ConnectionFailed, "tether: malformed direct-tcpip request")
		return
	}
	rec.Node = fmt.Sprintf("%.64s", d.DestAddr)
	log := b.cfg.Logger.With("operator", conn.User(), "remote", conn.RemoteAddr().String(), "target", fmt.Sprintf("%s:%d", d.DestAddr, d.DestPort))
	node, hdr, err := Target(d.DestAddr, d.DestPort, b.cfg.NodeSuffix)
	if err != nil && b.cfg.IsSite != nil {
		if n, h, serr := SiteTarget(d.DestAddr, d.DestPort, b.cfg.NodeSuffix, b.cfg.IsSite); serr == nil {
			node, hdr, err = n, h, nil
		}
	}
	if err != nil {
		finish("not_a_node", err)
		log.Info("jump refused", "reason", err)
		_ = newChan.Reject(gossh.Prohibited, "tether: "+err.Error())
		return
	}
	rec.Node, rec.Header = node, hdr
	b.wg.Add(1)
	defer b.wg.Done()
	st, err := b.cfg.Dialer.Dial(jctx, rec.JumpRequest)
	if err != nil {
		result := "dial_failed"
		reason := gossh.ConnectionFailed
		if errors.Is(err, ErrDenied) {
			result, reason = "denied", gossh.Prohibited
		} else if cause := stopped(); cause != nil {
			result, reason, err = endedResult(cause), gossh.Prohibited, cause
		}
		finish(result, err)
		log.Info("jump refused", "result", result, "err", err)
		_ = newChan.Reject(reason, "tether: "+err.Error())
		return
	}
	ch, reqs, err := newChan.Accept()
	if err != nil {
		st.Close()
		finish("accept_failed", err)
		return
	}
	go gossh.DiscardRequests(reqs)
	log.Info("jump started", "node", node, "service", hdr.Service.String())
	m := b.cfg.Metrics
	if m != nil {
		m.StreamsActive.Inc()
		defer m.StreamsActive.Dec()
	}
	// Stop closes both sides, which ends the relay at once; if it was
	// called already, this runs now.
	unwatch := context.AfterFunc(jctx, func() {
		ch.Close()
		st.Close()
	})
	defer unwatch()
	var onBytes func(bool, int)
	if m != nil {
		// The counters are looked up once per jump, not per chunk: the
		// label lookup hashes and locks, on every 64 KiB relayed.
		toNode, fromNode := m.RelayedBytes.WithLabelValues("to_node"), m.RelayedBytes.WithLabelValues("from_node")
		onBytes = func(up bool, n int) {
			if up {
				toNode.Add(float64(n))
			} else {
				fromNode.Add(float64(n))
			}
		}
	}
	counts := tunnel.Pipe(channelConn{ch}, st, onBytes)
	rec.BytesToNode, rec.BytesFromNode = counts.AtoB, counts.BtoA
	if cause := stopped(); cause != nil {
		finish(endedResult(cause), cause)
		log.Info("jump stopped", "node", node, "reason", cause)
		return
	}
	finish("ok", nil)
	log.Info("jump ended", "node", node, "bytes_to_node", counts.AtoB, "bytes_from_node", counts.BtoA, "duration", rec.End.Sub(rec.Start).Round(time.Millisecond))
}

// channelConn adapts an SSH channel to io.ReadWriteCloser with CloseWrite
// (EOF to the operator) so Pipe can half-close it.
type channelConn struct{ gossh.Channel }

func (c channelConn) CloseWrite() error { return c.Channel.CloseWrite() }

var _ io.ReadWriteCloser = channelConn{}
