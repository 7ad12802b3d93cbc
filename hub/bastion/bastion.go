// Package bastion is the hub's SSH server for operators. It authenticates
// operators by public key and serves exactly one thing: direct-tcpip channels
// (what `ssh -J` and ProxyJump use) to *node names*, each relayed over a
// stream through the node's tunnel. Operator-to-node SSH stays end-to-end
// encrypted: the hub only moves the bytes of the inner SSH connection.
// Jumps (jumps.go) decide each jump through the access door, audit it, and
// end the live jumps an access change no longer allows.
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
	"github.com/tether-dev/tether/internal/validate"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/resume"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// JumpRequest is one operator's request to reach a node.
type JumpRequest struct {
	// ID names this jump attempt among all of this bastion's, from 1; the
	// record of its end carries the same ID.
	ID       uint64
	Operator string
	Key      gossh.PublicKey // the key or certificate that authenticated
	// KeyFingerprint is SHA256:… of the key, for a certificate of the key
	// it certifies: what `tether operator list` shows for the operator.
	KeyFingerprint string
	// Cert names a certificate that authenticated by serial and key id;
	// "" for a plain key.
	Cert   string
	Remote string // operator's address
	Node   string
	Header tunnel.Header
	// Stop ends the jump while it is live: the relay closes both sides and
	// the jump is recorded with result "ended" ("ended: access withdrawn"
	// when cause wraps ErrAccessWithdrawn) and cause as its error. A Dialer
	// keeps it to end jumps whose access is withdrawn later. Safe to call
	// at any time, more than once; calls after the first do nothing.
	Stop func(cause error)
	// Withdraw ends the jump for cause as Stop does, but lets the node have
	// the last word: from the call on nothing more the operator sends is
	// relayed, while what the node sends (its SSH server telling the
	// operator's client why the session ends) still reaches the operator
	// until the node closes the stream, grace at the latest. A jump not yet
	// relaying is stopped at once.
	Withdraw func(cause error, grace time.Duration)
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
	// Ciphers are the SSH ciphers offered to every operator's client, in
	// order (--ssh-ciphers); empty: chosen per client (ciphers.go): on a CPU
	// with AES-GCM instructions, AES-GCM alone to an OpenSSH client that has
	// it, x/crypto's list to everyone else.
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
	// perClientCiphers: the cipher offer depends on the client's hello.
	perClientCiphers bool
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
	b := &Bastion{cfg: cfg, perClientCiphers: len(cfg.Ciphers) == 0 && hasAESGCMHardware()}
	b.ctx, b.cancel = context.WithCancel(context.Background())
	b.srv = &ssh.Server{
		Version:     serverVersion,
		HostSigners: hostSigners(cfg),
		// accept refuses rate-limited sources and arms the handshake
		// deadline (handshake.go); connCallback then reads the client's
		// hello when the cipher offer depends on it (ciphers.go).
		ConnCallback: b.connCallback,
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
				Config:          gossh.Config{Ciphers: b.ciphersFor(ctx)},
				MaxAuthTries:    6,
				AuthLogCallback: g.authLog,
				BannerCallback:  g.banner,
			}
		},
		// The example names the node with the suffix: the @cert-authority
		// line `tether login` and `tether config ssh` write vouches for
		// *.SUFFIX only, so that is the name an operator's ssh verifies.
		Handler: func(s ssh.Session) {
			fmt.Fprintf(s.Stderr(), "tether: this is a jump host; it has no shell. "+
				"Use it with ssh -J %s@HUB LOGIN@NODE%s, e.g. `ssh -J %s@%s root@NODE%s`\n",
				s.User(), cfg.NodeSuffix, s.User(), cfg.Addr, cfg.NodeSuffix)
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
		return nil, fmt.Errorf("bastion: %w", err) // it names the address: "listen tcp ADDR: …"
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
// Only node names (optionally with the suffix) are accepted: addresses
// (validate.Address: IP addresses in any notation, localhost and its kin,
// numbers) and anything else that is not a valid node name are refused, so
// the bastion can never be used to reach the hub's own network. Node names
// are refused at join by the same rule, so no node has a name refused here.
func Target(host string, port uint32, suffix string) (string, tunnel.Header, error) {
	name := strings.TrimSuffix(strings.ToLower(host), suffix)
	is, ok := validate.Address(host)
	if !ok {
		is, ok = validate.Address(name)
	}
	if ok {
		return "", tunnel.Header{}, fmt.Errorf("%w: %q is an address (%s); tether forwards only to node names",
			ErrNotANode, host, is)
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
	if i < 0 || siteproto.ValidNodePath(name) != nil || !isSite(name[i+1:]) {
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
	// withdrawal is the cause given to Withdraw while the node has its last
	// word; operator is the operator's side of the relay, once relaying.
	var (
		withdrawal atomic.Pointer[error]
		operator   atomic.Pointer[relayedChannel]
	)
	withdraw := func(cause error, grace time.Duration) {
		if !withdrawal.CompareAndSwap(nil, &cause) {
			return
		}
		op := operator.Load()
		if op == nil || grace <= 0 {
			stop(cause)
			return
		}
		op.mute()
		time.AfterFunc(grace, func() { stop(cause) })
	}
	rec := JumpRecord{Start: time.Now(), JumpRequest: JumpRequest{ID: b.jumps.Add(1), Operator: conn.User(),
		Remote: conn.RemoteAddr().String(), Stop: stop, Withdraw: withdraw}}
	key, _ := ctx.Value(ssh.ContextKeyPublicKey).(ssh.PublicKey)
	if key != nil {
		rec.Key, rec.KeyFingerprint, rec.Cert = key, keyFingerprint(key), certName(key)
	}
	stopped := func() error {
		if w := withdrawal.Load(); w != nil {
			return *w
		}
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
	log := b.cfg.Logger.With("operator", conn.User(), "remote", conn.RemoteAddr().String(),
		"target", fmt.Sprintf("%s:%d", d.DestAddr, d.DestPort))
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
	op := &relayedChannel{Channel: ch}
	operator.Store(op)
	if w := withdrawal.Load(); w != nil {
		// Withdrawn between the dial and now, before there was a relay to mute.
		stop(*w)
	}
	counts := tunnel.Pipe(op, st, onBytes)
	rec.BytesToNode, rec.BytesFromNode = counts.AtoB, counts.BtoA
	if cause := stopped(); cause != nil {
		finish(endedResult(cause), cause)
		log.Info("jump stopped", "node", node, "reason", cause)
		return
	}
	if lost := linkLost(st); lost != nil {
		// x/crypto cannot send the operator's client a disconnect message
		// (golang/go#37913): the reason is in the audit row and the log.
		finish("link_lost", lost)
		log.Info("jump ended: the node's link stayed down", "node", node, "reason", lost)
		return
	}
	finish("ok", nil)
	log.Info("jump ended", "node", node, "bytes_to_node", counts.AtoB, "bytes_from_node", counts.BtoA,
		"duration", rec.End.Sub(rec.Start).Round(time.Millisecond))
}

// keyFingerprint is the SHA256 fingerprint of k, or for a certificate of
// the key it certifies: a certificate from `tether login` is new each
// time, the key under it is the one registered for the operator.
func keyFingerprint(k gossh.PublicKey) string {
	if c, ok := k.(*gossh.Certificate); ok {
		k = c.Key
	}
	return gossh.FingerprintSHA256(k)
}

// certName names a certificate by serial and key id, "" for a plain key.
func certName(k gossh.PublicKey) string {
	c, ok := k.(*gossh.Certificate)
	if !ok {
		return ""
	}
	return fmt.Sprintf("certificate serial %d, key id %.128q", c.Serial, c.KeyId)
}

// relayedChannel is the operator's side of a relay: an SSH channel as an
// io.ReadWriteCloser with CloseWrite (EOF to the operator) so Pipe can
// half-close it, which Withdraw can mute.
type relayedChannel struct {
	gossh.Channel
	muted atomic.Bool
}

func (c *relayedChannel) CloseWrite() error { return c.Channel.CloseWrite() }

// mute makes Read swallow what the operator sends from now on: it still
// reads (the operator's window stays open, their EOF still ends the relay)
// but returns only the channel's end.
func (c *relayedChannel) mute() { c.muted.Store(true) }

func (c *relayedChannel) Read(p []byte) (int, error) {
	for {
		n, err := c.Channel.Read(p)
		if !c.muted.Load() {
			return n, err
		}
		if err != nil {
			return 0, err
		}
	}
}

var _ io.ReadWriteCloser = (*relayedChannel)(nil)

// linkLost is why a resumable stream to a node ended because its other
// side is gone (tunnel/resume): the node did not come back within the
// resume window, its agent restarted, or it ended the stream itself (its
// agent stopping); or nil.
func linkLost(st tunnel.Stream) error {
	rs, ok := st.(*resume.Stream)
	if !ok {
		return nil
	}
	if err := rs.Err(); errors.Is(err, resume.ErrExpired) || errors.Is(err, resume.ErrRefused) ||
		errors.Is(err, resume.ErrAborted) {
		return err
	}
	return nil
}
