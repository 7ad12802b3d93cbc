// Package sshconn is the job engine's connector: it reaches nodes over SSH
// through their tunnels (routes from the access door) as the hub's
// provisioning identity, with provisioners/runner.
package sshconn

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/provisioners/runner"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

const provisionCertTTL = 10 * time.Minute

// Door resolves a node's route and the login jobs use on it (hub/access).
type Door interface {
	Resolve(ctx context.Context, ref access.NodeRef) (store.Node, access.Route, error)
	ProvisionLoginFor(labels map[string]string) string
}

// Config is what the SSH connector uses of the hub.
type Config struct {
	Door Door
	// SignUser signs the connector's provisioning key (the hub's SSH user CA).
	SignUser func(pub gossh.PublicKey, keyID string, principals []string, ttl time.Duration) (*gossh.Certificate, error)
	// HostCAs and HostCAsFor are the host CAs nodes' certificates are
	// checked against (runner.Config).
	HostCAs    func() []gossh.PublicKey
	HostCAsFor func(node string) []gossh.PublicKey
	Logger     *slog.Logger
}

// Connector reaches nodes over SSH through their tunnels for jobs, as
// the hub's provisioning identity: an in-memory key and a short-lived user
// certificate, re-signed before it expires.
type Connector struct {
	cfg    Config
	runner *runner.Runner
	key    ed25519.PrivateKey

	mu     sync.Mutex
	signer gossh.Signer
	until  time.Time
}

// New makes a provisioning identity and the runner that uses it.
func New(cfg Config) (*Connector, error) {
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	p := &Connector{cfg: cfg, key: key}
	p.runner, err = runner.New(runner.Config{
		Dial:       p.dial,
		HostCAs:    cfg.HostCAs,
		HostCAsFor: cfg.HostCAsFor,
		Logger:     cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

// certSigner returns a signer over a provisioning certificate valid for at
// least half its lifetime.
func (p *Connector) certSigner() (gossh.Signer, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.signer != nil && time.Until(p.until) > provisionCertTTL/2 {
		return p.signer, nil
	}
	base, err := gossh.NewSignerFromKey(p.key)
	if err != nil {
		return nil, err
	}
	cert, err := p.cfg.SignUser(
		base.PublicKey(),
		"tether hub provisioning",
		[]string{access.ProvisionPrincipal},
		provisionCertTTL,
	)
	if err != nil {
		return nil, fmt.Errorf("provisioning certificate: %w", err)
	}
	if p.signer, err = gossh.NewCertSigner(cert, base); err != nil {
		return nil, fmt.Errorf("provisioning certificate: %w", err)
	}
	p.until = time.Unix(int64(cert.ValidBefore), 0)
	return p.signer, nil
}

// nodeIDKey carries, from connect to dial, the node a job targets as
// connect resolved it (a resolvedNode): the runner dials by name (the name
// is its host-certificate principal), and dial checks that the name is the
// one resolved for that ID. The route resolved with it is dialled as it is:
// the look-up was made an instant before, by the same ID, and repeating it
// cost every node of a fan-out another store read (bench P6's profile).
type nodeIDKey struct{}

// resolvedNode is what connect resolved for dial.
type resolvedNode struct {
	id, name string
	route    access.Route // nil: resolve again
}

// dial opens an ssh stream to a node through the door.
func (p *Connector) dial(ctx context.Context, name string) (net.Conn, error) {
	r, _ := ctx.Value(nodeIDKey{}).(resolvedNode)
	if r.id == "" {
		return nil, fmt.Errorf("provision: no node id for %q", name)
	}
	// A job's stream is audited as one at every hub it crosses, unless
	// the caller (the console, an upgrade) said what it is.
	if access.HopFrom(ctx).Purpose == "" {
		ctx = access.WithHop(ctx, access.Hop{Purpose: siteproto.PurposeJob, Operator: "tether-hub"})
	}
	if r.route != nil && r.name == name {
		return r.route.Dial(ctx, tunnel.Header{Service: tunnel.ServiceSSH})
	}
	n, route, err := p.cfg.Door.Resolve(ctx, access.ByID(r.id))
	if err != nil {
		return nil, err
	}
	if n.Name != name {
		return nil, fmt.Errorf("node id %s is now named %q, not %q", r.id, n.Name, name)
	}
	return route.Dial(ctx, tunnel.Header{Service: tunnel.ServiceSSH})
}

// Connect is the jobs engine's Connector: it reaches the node with this ID
// (never a newer node that took a removed node's name) as its
// provisioning login.
func (p *Connector) Connect(ctx context.Context, nodeID string) (jobs.Conn, error) {
	n, route, err := p.cfg.Door.Resolve(ctx, access.ByID(nodeID))
	if err != nil {
		return nil, err
	}
	return p.connectTo(ctx, n, route)
}

// Resolve is the jobs engine's Resolver: the one look-up of a run that
// does not wait for its node decides both that it starts (online's answer)
// and where connect goes.
func (p *Connector) Resolve(ctx context.Context, nodeID string) (func(context.Context) (jobs.Conn, error), string) {
	n, route, err := p.cfg.Door.Resolve(ctx, access.ByID(nodeID))
	if err != nil {
		return nil, offlineReason(err)
	}
	return func(ctx context.Context) (jobs.Conn, error) { return p.connectTo(ctx, n, route) }, ""
}

// connectTo reaches node n, as Resolve found it, by route.
func (p *Connector) connectTo(ctx context.Context, n store.Node, route access.Route) (jobs.Conn, error) {
	signer, err := p.certSigner()
	if err != nil {
		return nil, err
	}
	ctx = context.WithValue(ctx, nodeIDKey{}, resolvedNode{id: n.ID, name: n.Name, route: route})
	c, err := p.runner.Connect(ctx, n.Name, runner.Auth{Login: p.cfg.Door.ProvisionLoginFor(n.Labels), Signer: signer})
	if err != nil {
		return nil, err
	}
	return runnerConn{c}, nil
}

// Online is the jobs engine's presence check: "" when the node has a
// route, else why not.
func (p *Connector) Online(nodeID string) string {
	_, _, err := p.cfg.Door.Resolve(context.Background(), access.ByID(nodeID))
	return offlineReason(err)
}

// offlineReason is Online's answer for Resolve's error: "" for none.
func offlineReason(err error) string {
	if err == nil {
		return ""
	}
	var off *access.OfflineError
	if errors.As(err, &off) {
		return off.Reason()
	}
	return err.Error()
}

// runnerConn adapts a runner.Client to jobs.Conn.
type runnerConn struct{ c *runner.Client }

func (r runnerConn) Run(ctx context.Context, cmd jobs.Command, stdout, stderr io.Writer) (int, error) {
	res, err := r.c.Run(ctx, runner.Command{Line: cmd.Line, Script: cmd.Script, Env: cmd.Env}, stdout, stderr)
	return res.ExitCode, err
}

func (r runnerConn) Upload(
	ctx context.Context,
	src io.Reader,
	size int64,
	dst string,
	mode os.FileMode,
	mkdir bool,
) (string, error) {
	return r.c.Upload(ctx, src, size, dst, runner.UploadOptions{Mode: mode, MkdirParents: mkdir})
}

func (r runnerConn) Exists(ctx context.Context, path string) (bool, error) {
	return r.c.Exists(ctx, path)
}

func (r runnerConn) Close() error { return r.c.Close() }
