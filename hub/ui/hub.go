package ui

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/provisioners/runner"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// The web console's hold on the hub: who asks for a sign-in code, whether
// a stored session may still act, and the browser terminal's shell.

// HubConfig is what NewHub's hold on the hub works with.
type HubConfig struct {
	// Verify checks a client certificate against the hub's CA.
	Verify func(cert *x509.Certificate) (pki.Identity, error)
	// AuthorizeAdmin names the holder of an admin certificate chain, as
	// the API accepts it; LocalAdmin is the name it gives the hub's own
	// local admin identity, and OperatorAdminPrefix starts the ID of an
	// operator's admin certificate.
	AuthorizeAdmin      func(chain []*x509.Certificate) (string, error)
	LocalAdmin          string
	OperatorAdminPrefix string
	// AuthorizeOperator names the holder of an operator's API certificate.
	AuthorizeOperator func(chain []*x509.Certificate) (string, error)
	// AdminValidFrom is when the last `tether ca revoke-admin` was.
	AdminValidFrom func() time.Time
	Door           *access.Door
	// SignUser signs the browser terminal's short-lived user certificate.
	SignUser func(pub gossh.PublicKey, keyID string, logins []string, ttl time.Duration) (*gossh.Certificate, error)
	// HostCAs and HostCAsFor are the SSH host CAs trusted for nodes
	// (runner.Config's).
	HostCAs    func() []gossh.PublicKey
	HostCAsFor func(name string) []gossh.PublicKey
	Logger     *slog.Logger
}

// NewHub is the console's Hub for a hub with cfg.
func NewHub(cfg HubConfig) Hub { return consoleHub{cfg} }

// consoleCertTTL is the life of the user certificate the hub signs for one
// browser terminal: long enough for the SSH handshake only.
const consoleCertTTL = 2 * time.Minute

type consoleHub struct{ cfg HubConfig }

// Identify names the holder of an admin certificate or an operator's API
// certificate, each checked as the API checks it.
func (c consoleHub) Identify(r *http.Request) (Identity, error) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		return Identity{}, errors.New(
			"no client certificate: run `tether ui` with the identity `tether login` gave you " +
				"(or on the hub machine with --data-dir)",
		)
	}
	chain := r.TLS.PeerCertificates
	id, err := c.cfg.Verify(chain[0])
	if err != nil {
		return Identity{}, fmt.Errorf("client certificate: %w", err)
	}
	switch id.Kind {
	case pki.KindAdmin:
		name, err := c.cfg.AuthorizeAdmin(chain)
		if err != nil {
			return Identity{}, err
		}
		if name == c.cfg.LocalAdmin {
			return Identity{Admin: true}, nil
		}
		_, tag, _ := strings.Cut(strings.TrimPrefix(id.ID, c.cfg.OperatorAdminPrefix), ".")
		return Identity{Operator: name, KeyTag: tag, Admin: true}, nil
	case pki.KindOperator:
		name, err := c.cfg.AuthorizeOperator(chain)
		if err != nil {
			return Identity{}, err
		}
		_, tag, _ := strings.Cut(id.ID, ".")
		return Identity{Operator: name, KeyTag: tag}, nil
	}
	return Identity{}, fmt.Errorf("certificate %q is neither an admin's nor an operator's", chain[0].Subject.CommonName)
}

// Caller decides whether a console session may still act, and as whom:
// its operator must still be registered with the key the sign-in code was
// asked for with, and the session must have begun after the last `tether
// ca revoke-admin`. The admin role is read now, so granting or taking it
// changes what a live session may do at its next request.
func (c consoleHub) Caller(sess store.ConsoleSession) (access.Caller, error) {
	if vf := c.cfg.AdminValidFrom(); sess.CreatedAt.Before(vf) {
		return access.Caller{}, fmt.Errorf(
			"the session began before `tether ca revoke-admin` at %s",
			vf.UTC().Format(time.RFC3339),
		)
	}
	if sess.Operator == "" {
		if !sess.Admin {
			return access.Caller{}, errors.New("session names no operator")
		}
		return access.Caller{Admin: true, Name: "console:local-admin"}, nil
	}
	if err := c.cfg.Door.AuthorizeAPIIdentity(sess.Operator, sess.KeyTag); err != nil {
		return access.Caller{}, err
	}
	o, _ := c.cfg.Door.Snapshot().Operator(sess.Operator)
	admin := slices.ContainsFunc(o.Roles, func(r roles.Compiled) bool { return r.Name == roles.BuiltinAdmin.Name })
	return access.Caller{Operator: sess.Operator, Admin: admin, Name: "console:" + sess.Operator}, nil
}

// OpenTerminal opens a shell on a node for the browser terminal, deciding
// as a jump through the bastion decides: the one door resolves the node
// and the operator's roles must select it, before anything is said about
// whether it is reachable; the login must be one those roles allow there
// (access.Door.AuthorizeTerminal, which the terminal's re-checks ask too).
// The hub then logs in over the node's route with a fresh key and a user
// certificate valid two minutes, carrying only the role-scoped principals
// of this login (what `tether login` would certify), so the node decides
// on its side exactly as for the operator's own certificate.
func (c consoleHub) OpenTerminal(ctx context.Context, req TerminalRequest) (Shell, error) {
	if req.Caller.Operator == "" {
		return nil, fmt.Errorf(
			"%w: the browser terminal needs an operator identity (roles decide logins); "+
				"sign in with `tether ui` after `tether login` as an operator",
			access.ErrDenied,
		)
	}
	n, route, err := c.cfg.Door.Resolve(ctx, access.ByName(req.Node))
	var principals []string
	if err == nil || errors.Is(err, access.ErrOffline) {
		if p, aerr := c.cfg.Door.AuthorizeTerminal(req.Caller.Operator, req.Login, n); aerr != nil {
			err = aerr
		} else {
			principals = p
		}
	}
	if err != nil {
		return nil, err
	}
	_, key, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	base, err := gossh.NewSignerFromKey(key)
	if err != nil {
		return nil, err
	}
	cert, err := c.cfg.SignUser(
		base.PublicKey(),
		access.UserCertKeyIDPrefix+req.Caller.Operator,
		principals,
		consoleCertTTL,
	)
	if err != nil {
		return nil, fmt.Errorf("console terminal certificate: %w", err)
	}
	signer, err := gossh.NewCertSigner(cert, base)
	if err != nil {
		return nil, err
	}
	rn, err := runner.New(runner.Config{
		Dial: func(ctx context.Context, name string) (net.Conn, error) {
			return route.Dial(
				access.WithHop(ctx, access.Hop{Purpose: siteproto.PurposeConsole, Operator: req.Caller.Operator}),
				tunnel.Header{Service: tunnel.ServiceSSH},
			)
		},
		HostCAs:    c.cfg.HostCAs,
		HostCAsFor: c.cfg.HostCAsFor, // a node below a site: that site's host CA only
		Logger:     c.cfg.Logger,
	})
	if err != nil {
		return nil, err
	}
	client, err := rn.Connect(ctx, n.Name, runner.Auth{Login: req.Login, Signer: signer})
	if err != nil {
		return nil, err
	}
	sess, err := client.Session()
	if err != nil {
		client.Close()
		return nil, err
	}
	cols, rows := req.Cols, req.Rows
	if cols <= 0 || cols > 1000 || rows <= 0 || rows > 1000 {
		cols, rows = 80, 24
	}
	if err := sess.RequestPty("xterm-256color", rows, cols, gossh.TerminalModes{gossh.ECHO: 1}); err != nil {
		client.Close()
		return nil, fmt.Errorf("node %q: pseudo-terminal: %w", n.Name, err)
	}
	stdin, err := sess.StdinPipe()
	if err != nil {
		client.Close()
		return nil, err
	}
	pr, pw := io.Pipe()
	sess.Stdout, sess.Stderr = pw, pw
	if err := sess.Shell(); err != nil {
		client.Close()
		return nil, fmt.Errorf("node %q: shell: %w", n.Name, err)
	}
	sh := &consoleShell{sess: sess, client: client, stdin: stdin, out: pr, done: make(chan struct{})}
	go func() {
		sh.err = sess.Wait()
		pw.Close()
		close(sh.done)
	}()
	return sh, nil
}

// consoleShell is a shell session on a node for the browser terminal.
type consoleShell struct {
	sess   *gossh.Session
	client *runner.Client
	stdin  io.WriteCloser
	out    *io.PipeReader
	done   chan struct{}
	err    error
}

func (c *consoleShell) Write(p []byte) (int, error) { return c.stdin.Write(p) }
func (c *consoleShell) Output() io.Reader           { return c.out }
func (c *consoleShell) Resize(cols, rows int) error { return c.sess.WindowChange(rows, cols) }
func (c *consoleShell) Wait() error                 { <-c.done; return c.err }

// Close ends the shell and the SSH connection; the goroutine waiting on
// the session ends with it.
func (c *consoleShell) Close() error {
	_ = c.sess.Close()
	return c.client.Close()
}
