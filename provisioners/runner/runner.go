package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/validate"
)

// Sentinel errors. Errors returned by this package wrap one of them where
// the caller has a decision to make, and always name the node.
var (
	// ErrHostKey: the node did not prove its identity: no host
	// certificate, a certificate from an untrusted CA, for another node,
	// expired, or no trusted host CA configured. Never retry blindly: it is
	// either a misconfigured node (re-enroll it) or an impostor.
	ErrHostKey = errors.New("SSH host key verification failed")
	// ErrAuth: the node refused the hub's user certificate.
	ErrAuth = errors.New("SSH authentication refused by the node")
	// ErrTimeout: the context's deadline (or the handshake timeout) passed.
	// The error also wraps context.DeadlineExceeded. A command that was
	// running has been killed.
	ErrTimeout = errors.New("timed out")
	// ErrCanceled: the context was cancelled. The error also wraps
	// context.Canceled. A command that was running has been killed.
	ErrCanceled = errors.New("canceled")
	// ErrBadPath: a remote path is not absolute, not clean, contains
	// "." or ".." components, NUL or other control characters.
	ErrBadPath = errors.New("invalid remote path")
	// ErrInvalid: a Command or option is malformed (no command, both a
	// line and a script, a bad environment variable name, ...). Nothing
	// was sent to the node.
	ErrInvalid = errors.New("invalid request")
	// ErrConnLost: the SSH connection to the node ended while the
	// operation was in flight. Remote commands are killed by the wrapper
	// when this happens (see the package documentation).
	ErrConnLost = errors.New("connection to the node lost")
	// ErrChecksum: an uploaded file's SHA-256 on the node differs from
	// what was sent. The destination was not replaced.
	ErrChecksum = errors.New("checksum mismatch")
)

// DialFunc opens a byte stream to the SSH endpoint of node, typically a
// stream through the node's tunnel. The runner owns and closes the conn.
type DialFunc func(ctx context.Context, node string) (net.Conn, error)

// Defaults for zero Config fields.
const (
	DefaultHandshakeTimeout = 30 * time.Second
	DefaultKillGrace        = 5 * time.Second
)

// Config configures a Runner.
type Config struct {
	// Dial opens the stream to a node. Required.
	Dial DialFunc
	// HostCAs returns the trusted SSH host CA public keys. It is called on
	// every Connect, so CA rotation (which adds keys) needs no restart.
	// Required; an empty result refuses every node (ErrHostKey).
	HostCAs func() []ssh.PublicKey
	// HostCAsFor, if set, returns the host CAs trusted for node instead
	// of HostCAs: a hub trusts a site hub's host CA for names below that
	// site only.
	HostCAsFor func(node string) []ssh.PublicKey
	// HandshakeTimeout bounds Dial plus the SSH handshake and
	// authentication. Zero means DefaultHandshakeTimeout.
	HandshakeTimeout time.Duration
	// KillGrace is how long Run waits, after asking a cancelled command
	// to die, for the node to close the channel before closing it itself
	// (and, after as long again, the whole connection). Zero means
	// DefaultKillGrace.
	KillGrace time.Duration
	// Logger receives connection and command events. Nil discards.
	Logger *slog.Logger
	// OnDial, if set, is called after every Connect attempt with the time
	// dial, handshake and authentication took and the resulting error (a
	// metrics hook for SSH connect latency).
	OnDial func(node string, took time.Duration, err error)
}

// Runner connects to nodes. It is safe for concurrent use and holds no
// connections itself; each Connect returns an independent Client.
type Runner struct {
	cfg Config
	log *slog.Logger
}

// New checks cfg and returns a Runner.
func New(cfg Config) (*Runner, error) {
	if cfg.Dial == nil {
		return nil, fmt.Errorf("runner: Config.Dial is required: %w", ErrInvalid)
	}
	if cfg.HostCAs == nil {
		return nil, fmt.Errorf("runner: Config.HostCAs is required: %w", ErrInvalid)
	}
	if cfg.HandshakeTimeout < 0 || cfg.KillGrace < 0 {
		return nil, fmt.Errorf("runner: negative HandshakeTimeout or KillGrace: %w", ErrInvalid)
	}
	if cfg.HandshakeTimeout == 0 {
		cfg.HandshakeTimeout = DefaultHandshakeTimeout
	}
	if cfg.KillGrace == 0 {
		cfg.KillGrace = DefaultKillGrace
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Runner{cfg: cfg, log: cfg.Logger}, nil
}

// Auth is how the hub logs in to a node.
type Auth struct {
	// Login is the remote user name.
	Login string
	// Signer is a certificate signer (ssh.NewCertSigner) over the hub's
	// short-lived user certificate for this job.
	Signer ssh.Signer
}

// Connect dials node, verifies its host certificate and logs in. ctx bounds
// only the connection set-up; the Client lives until Close. The returned
// Client is meant for the steps of one job: every Run, Upload and Exists
// reuses its single SSH connection.
func (r *Runner) Connect(ctx context.Context, node string, auth Auth) (*Client, error) {
	start := time.Now()
	c, err := r.connect(ctx, node, auth)
	took := time.Since(start)
	if r.cfg.OnDial != nil {
		r.cfg.OnDial(node, took, err)
	}
	if err != nil {
		r.log.Debug("ssh connect failed", "node", node, "took", took, "err", err)
		return nil, err
	}
	r.log.Debug("ssh connected", "node", node, "login", auth.Login, "took", took)
	return c, nil
}

func (r *Runner) connect(ctx context.Context, node string, auth Auth) (*Client, error) {
	if err := checkNodeName(node); err != nil {
		return nil, err
	}
	if auth.Login == "" || auth.Signer == nil {
		return nil, fmt.Errorf("runner: connect to node %q: Auth needs a Login and a Signer: %w", node, ErrInvalid)
	}
	if err := validate.Login(auth.Login); err != nil {
		return nil, fmt.Errorf("runner: connect to node %q: %w: %w", node, err, ErrInvalid)
	}
	cas := r.cfg.HostCAs()
	if r.cfg.HostCAsFor != nil {
		cas = r.cfg.HostCAsFor(node)
	}
	if len(cas) == 0 {
		return nil, fmt.Errorf(
			"runner: connect to node %q: %w: no trusted SSH host CA is configured; "+
				"the hub must load its SSH host CA before it can provision",
			node, ErrHostKey,
		)
	}
	if err := ctx.Err(); err != nil {
		return nil, ctxError(node, "connect", err)
	}

	hctx, cancel := context.WithTimeout(ctx, r.cfg.HandshakeTimeout)
	defer cancel()
	conn, err := r.cfg.Dial(hctx, node)
	if err != nil {
		if cerr := hctx.Err(); cerr != nil {
			return nil, fmt.Errorf("%w: dial: %w", ctxError(node, "connect", cerr), err)
		}
		return nil, fmt.Errorf("runner: dial node %q: %w; check that the node's agent is connected", node, err)
	}
	// Close the stream if ctx ends or the timeout passes mid-handshake:
	// x/crypto has no other way to abort a handshake in progress.
	stop := context.AfterFunc(hctx, func() { conn.Close() })

	hk := &hostKeyCheck{node: node, cas: cas}
	sc, chans, reqs, err := ssh.NewClientConn(conn, net.JoinHostPort(node, "22"), &ssh.ClientConfig{
		User:            auth.Login,
		Auth:            []ssh.AuthMethod{ssh.PublicKeys(auth.Signer)},
		HostKeyCallback: hk.check,
		ClientVersion:   "SSH-2.0-Tether-runner",
	})
	if !stop() {
		// The AfterFunc ran: the stream is closed, whatever the
		// handshake reported.
		if err == nil {
			sc.Close()
		}
		return nil, ctxError(node, "SSH handshake", hctx.Err())
	}
	if err != nil {
		conn.Close()
		var hkErr *hostKeyError
		switch {
		case errors.As(err, &hkErr):
			return nil, fmt.Errorf("runner: node %q: %w: %w; %s", node, ErrHostKey, hkErr.err, hkErr.hint)
		case hk.verified && strings.Contains(err.Error(), "unable to authenticate"):
			return nil, fmt.Errorf(
				"runner: node %q: %w for login %q: %w; check that the node trusts the hub's SSH user CA for that login",
				node, ErrAuth, auth.Login, err,
			)
		}
		return nil, fmt.Errorf("runner: SSH handshake with node %q: %w", node, err)
	}
	return newClient(r, node, ssh.NewClient(sc, chans, reqs)), nil
}

// checkNodeName rejects names that cannot be a node name; the name is also
// the host certificate principal, so it must be compared exactly.
func checkNodeName(node string) error {
	if node == "" || strings.ContainsFunc(node, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
		return fmt.Errorf("runner: node name %q is empty or contains blanks or control characters: %w", node, ErrInvalid)
	}
	return nil
}

// hostKeyCheck verifies a node's host certificate.
type hostKeyCheck struct {
	node     string
	cas      []ssh.PublicKey
	verified bool // the host key passed; a later failure is about us
}

// hostKeyError carries why a host key was refused through x/crypto's
// handshake error.
type hostKeyError struct {
	err  error
	hint string
}

func (e *hostKeyError) Error() string { return e.err.Error() }
func (e *hostKeyError) Unwrap() error { return e.err }

const reenrollHint = "the node must present an SSH host certificate issued by the hub's SSH host CA for its name; " +
	"re-enroll the node or renew its host certificate"

func (h *hostKeyCheck) check(addr string, remote net.Addr, key ssh.PublicKey) error {
	cert, ok := key.(*ssh.Certificate)
	if !ok {
		return &hostKeyError{
			err: fmt.Errorf(
				"the node presented a plain %s host key (%s), not a host certificate",
				key.Type(), ssh.FingerprintSHA256(key),
			),
			hint: reenrollHint,
		}
	}
	// x/crypto treats a certificate without principals as valid for any
	// host. The hub's CA always names the node, so such a certificate is
	// not one of ours to honour.
	if len(cert.ValidPrincipals) == 0 {
		return &hostKeyError{err: errors.New("the host certificate names no principals"), hint: reenrollHint}
	}
	trusted := false
	for _, ca := range h.cas {
		if ca != nil && bytes.Equal(ca.Marshal(), cert.SignatureKey.Marshal()) {
			trusted = true
			break
		}
	}
	if !trusted {
		return &hostKeyError{
			err: fmt.Errorf(
				"the host certificate is signed by %s %s, which is not a trusted SSH host CA",
				cert.SignatureKey.Type(), ssh.FingerprintSHA256(cert.SignatureKey),
			),
			hint: "if the hub's host CA was rotated, the node needs a certificate from the new CA; " +
				"otherwise this is not the node it claims to be",
		}
	}
	checker := ssh.CertChecker{
		IsHostAuthority: func(ssh.PublicKey, string) bool { return true }, // checked above
	}
	// CheckHostKey checks the type, the validity window, the principal
	// (the host part of addr, that is the node name) and the signature.
	if err := checker.CheckHostKey(addr, remote, key); err != nil {
		return &hostKeyError{
			err:  fmt.Errorf("host certificate (principals %q): %w", cert.ValidPrincipals, err),
			hint: reenrollHint,
		}
	}
	h.verified = true
	return nil
}

// ctxError maps a context error to ErrTimeout or ErrCanceled, wrapping the
// context error as well.
func ctxError(node, op string, err error) error {
	if errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("runner: %s on node %q: %w: %w", op, node, ErrTimeout, err)
	}
	return fmt.Errorf("runner: %s on node %q: %w: %w", op, node, ErrCanceled, err)
}
