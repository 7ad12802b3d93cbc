package hub

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/provisioners/runner"
	"github.com/tether-dev/tether/tunnel"
)

// ProvisionPrincipal is the user-certificate principal of the hub's own
// provisioning certificate. Nodes accept it for their provisioning login
// only (pushed with the SSH trust), so a leaked provisioning certificate
// grants nothing else; it expires within provisionCertTTL anyway.
const ProvisionPrincipal = "tether-hub"

// ProvisionLoginLabel on a node overrides the hub's --provision-login.
const ProvisionLoginLabel = "provision-login"

const provisionCertTTL = 10 * time.Minute

var loginRE = regexp.MustCompile(`^[a-z_][a-z0-9_.-]{0,31}$`)

// ValidLogin reports whether s is a plausible Unix login name.
func ValidLogin(s string) bool { return loginRE.MatchString(s) }

// provisionLoginFor is the login jobs use on a node with these labels.
func (s *Server) provisionLoginFor(labels map[string]string) string {
	if l := labels[ProvisionLoginLabel]; ValidLogin(l) {
		return l
	}
	return s.cfg.ProvisionLogin
}

// provisioner holds the hub's provisioning identity: an in-memory key and
// a short-lived user certificate, re-signed before it expires.
type provisioner struct {
	s      *Server
	runner *runner.Runner
	key    ed25519.PrivateKey

	mu     sync.Mutex
	signer gossh.Signer
	until  time.Time
}

func newProvisioner(s *Server) (*provisioner, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	p := &provisioner{s: s, key: key}
	p.runner, err = runner.New(runner.Config{
		Dial:    p.dial,
		HostCAs: s.hostCA.TrustedKeys,
		Logger:  s.log.With("component", "provision"),
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// certSigner returns a signer over a provisioning certificate valid for at
// least half its lifetime.
func (p *provisioner) certSigner() (gossh.Signer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.signer != nil && time.Until(p.until) > provisionCertTTL/2 {
		return p.signer, nil
	}
	base, err := gossh.NewSignerFromKey(p.key)
	if err != nil {
		return nil, err
	}
	cert, err := p.s.userCA.SignUser(base.PublicKey(), "tether hub provisioning", []string{ProvisionPrincipal}, provisionCertTTL)
	if err != nil {
		return nil, fmt.Errorf("provisioning certificate: %w", err)
	}
	if p.signer, err = gossh.NewCertSigner(cert, base); err != nil {
		return nil, fmt.Errorf("provisioning certificate: %w", err)
	}
	p.until = time.Unix(int64(cert.ValidBefore), 0)
	return p.signer, nil
}

// dial opens an ssh stream to a registered, unrevoked, online node.
func (p *provisioner) dial(ctx context.Context, node string) (net.Conn, error) {
	n, err := p.s.store.GetNodeByName(ctx, node)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("no node named %q is registered", node)
	}
	if err != nil {
		return nil, err
	}
	if !n.RevokedAt.IsZero() {
		return nil, fmt.Errorf("node %q was revoked", node)
	}
	c, ok := p.s.reg.Get(node)
	if !ok || c.NodeID != n.ID {
		return nil, fmt.Errorf("node %q is offline", node)
	}
	st, err := c.Dial(ctx, tunnel.Header{Service: tunnel.ServiceSSH})
	result := "ok"
	if err != nil {
		result = "error"
	}
	p.s.metrics.StreamsOpened.WithLabelValues(tunnel.ServiceSSH.String(), result).Inc()
	return st, err
}

// connect is the jobs engine's Connector: it reaches the node with this ID
// and no other machine that holds its name.
func (p *provisioner) connect(ctx context.Context, nodeID string) (jobs.Conn, error) {
	n, err := p.s.store.GetNode(ctx, nodeID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("node %s was removed from the hub", nodeID)
	}
	if err != nil {
		return nil, err
	}
	signer, err := p.certSigner()
	if err != nil {
		return nil, err
	}
	c, err := p.runner.Connect(ctx, n.Name, runner.Auth{Login: p.s.provisionLoginFor(n.Labels), Signer: signer})
	if err != nil {
		return nil, err
	}
	// dial went by name; the node still holding its ID now means the name
	// was never free in between, so the session reached was this node's.
	if now, err := p.s.store.GetNode(ctx, nodeID); err != nil || now.Name != n.Name {
		c.Close()
		return nil, fmt.Errorf("node %q (%s) was removed while connecting", n.Name, nodeID)
	}
	return runnerConn{c}, nil
}

// online is the jobs engine's and the cluster controller's presence check,
// by node ID.
func (s *Server) online(nodeID string) string {
	n, err := s.store.GetNode(context.Background(), nodeID)
	if err != nil {
		return "removed from the hub"
	}
	if c, ok := s.reg.Get(n.Name); ok && c.NodeID == n.ID {
		return ""
	}
	if !n.LastSeen.IsZero() {
		return fmt.Sprintf("offline (last seen %s ago)", time.Since(n.LastSeen).Round(time.Second))
	}
	return "offline (never connected)"
}

// stateDir is the state directory the connected agent of the node with
// this ID reported.
func (s *Server) stateDir(nodeID string) string {
	n, err := s.store.GetNode(context.Background(), nodeID)
	if err != nil {
		return ""
	}
	if c, ok := s.reg.Get(n.Name); ok && c.NodeID == n.ID {
		return c.StateDir
	}
	return ""
}

// runnerConn adapts a runner.Client to jobs.Conn.
type runnerConn struct{ c *runner.Client }

func (r runnerConn) Run(ctx context.Context, cmd jobs.Command, stdout, stderr io.Writer) (int, error) {
	res, err := r.c.Run(ctx, runner.Command{Line: cmd.Line, Script: cmd.Script, Env: cmd.Env}, stdout, stderr)
	return res.ExitCode, err
}

func (r runnerConn) Upload(ctx context.Context, src io.Reader, size int64, dst string, mode os.FileMode, mkdir bool) (string, error) {
	return r.c.Upload(ctx, src, size, dst, runner.UploadOptions{Mode: mode, MkdirParents: mkdir})
}

func (r runnerConn) Exists(ctx context.Context, path string) (bool, error) {
	return r.c.Exists(ctx, path)
}

func (r runnerConn) Close() error { return r.c.Close() }
