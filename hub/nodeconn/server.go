// Package nodeconn is the hub's side of nodes' tunnels: it admits a node's
// session (certificate, hello, site admission), serves it until it ends
// (the control stream's heartbeats, certificate renewals and reports; the
// streams an agent may open), keeps presence and SSH host certificates
// current, and holds the live connections (Table) through which the rest of
// the hub dials services on nodes.
package nodeconn

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// Store is what node connections read and write of the hub's state.
type Store interface {
	GetNode(ctx context.Context, id string) (store.Node, error)
	CountNodes(ctx context.Context) (int, error)
	UpdateNodeSeen(ctx context.Context, id string, seen store.Seen) error
	SetNodeFacts(ctx context.Context, id string, facts control.Facts) error
	SetReportedLabels(ctx context.Context, id string, labels map[string]string) error
	UpdateNodeCert(ctx context.Context, id, serial string, notAfter time.Time) error
}

// Audit writes audit events; Refusal and Limited stay within a per-source
// limit, so a misbehaving node cannot flood the log.
type Audit interface {
	Write(e store.AuditEvent)
	Refusal(kind, remote string, e store.AuditEvent)
	Limited(remote string, e store.AuditEvent)
}

// Access brings a connected node's SSH access (keys, trust, host
// certificate) up to date.
type Access interface {
	// CertifyHost signs the node's SSH host key and sets its renewal time
	// (Conn.HostCertRenew); it returns the key, nil if there was none.
	CertifyHost(c *Conn, log *slog.Logger) gossh.PublicKey
	// Push sends the node its access state (if unchanged, only if force);
	// it reports whether it sent anything.
	Push(c *Conn, force bool) bool
	// PushTo sends conns what changed for them; it returns how many were
	// sent something.
	PushTo(ctx context.Context, conns []*Conn) int64
}

// Sites admits and serves the sessions of site hubs below this one.
type Sites interface {
	// Admit checks a hello that announces a site: nil, nil for a node.
	Admit(ctx context.Context, node store.Node, h *control.Hello) (*siteproto.Welcome, error)
	// ServesStreams says the hub serves its sites' streams.
	ServesStreams() bool
	// Connected records a welcomed site session until the returned
	// function is called.
	Connected(ctx context.Context, c *Conn, h *control.Hello, w *siteproto.Welcome) (disconnected func())
	// Dispatch handles a site protocol message; handled is false for any
	// other message.
	Dispatch(ctx context.Context, c *Conn, m *control.Message) (handled bool, err error)
}

// Services serves service tunnels to the agents that consume them.
type Services interface {
	Connected(ctx context.Context, c *Conn) (gone func())
	// ServeConnect serves a consumer's service connect stream; on a
	// session whose streams are resumable st is a resume.Pending, and ctx
	// the hub's, not the session's.
	ServeConnect(ctx context.Context, st tunnel.Stream, consumer, remote string)
}

// Presence records which replica holds a node's tunnel (nothing on a
// single hub).
type Presence interface {
	Connected(ctx context.Context, c *Conn) store.Presence
	Disconnected(p store.Presence)
	// Hubs are the addresses agents dial for the live replicas, which the
	// welcome announces (none on a single hub).
	Hubs() []string
}

// Watcher hears of nodes' comings and what they report for the
// controllers (clusters, upgrades).
type Watcher interface {
	// Connected: the node is online with this agent version.
	Connected(ctx context.Context, nodeID, agentVersion string)
	// UpgradeStates are the node's reports on its upgrades.
	UpgradeStates(ctx context.Context, c *Conn, states []upgradeproto.NodeState, log *slog.Logger)
}

// Logins hears what nodes' embedded SSH servers report of the logins
// inside bastion jumps, and who owns the keys they name.
type Logins interface {
	// NoteOutcome settles a jump's login as the node reported it
	// (refused == "": accepted or failed).
	NoteOutcome(nodeID, operator, refused string)
	// KeyOf says whether the key with this fingerprint is one of the
	// named operator's (or the KubeOne cluster identity of that name).
	KeyOf(operator, fingerprint string) bool
}

// Config is what the node connections use of the hub.
type Config struct {
	Store Store
	Table *Table // the live connections, shared with the hub's other parts
	// IssueNode signs a node certificate for csrDER (the hub's CA or a
	// step-ca); the chain starts with the node's certificate.
	IssueNode func(ctx context.Context, csrDER []byte, id pki.Identity, cn string,
		ttl time.Duration) ([]*x509.Certificate, error)
	NodeCertTTL time.Duration
	HostCertTTL time.Duration
	Tunnel      *tunnel.Config // nil: tunnel defaults (the liveness rule)
	Metrics     *metrics.Metrics
	Audit       Audit
	Access      Access
	Sites       Sites
	Services    Services
	Presence    Presence
	Watcher     Watcher
	Logins      Logins
	// ResumeWindow is how long streams to a node whose link went down wait
	// for it to reconnect (resume.go); 0 turns resumable streams off.
	ResumeWindow time.Duration
	// ResumeEvents, if set, counts what happens to resumable streams.
	ResumeEvents ResumeEvents
	Logger       *slog.Logger
}

// Server admits nodes' tunnel sessions, serves them until they end, and
// keeps their presence and host certificates current.
type Server struct {
	cfg      Config
	log      *slog.Logger
	sessions sync.WaitGroup
}

// New returns a Server for cfg; every field but Tunnel is required.
func New(cfg Config) (*Server, error) {
	if cfg.Store == nil || cfg.Table == nil || cfg.IssueNode == nil || cfg.Metrics == nil || cfg.Audit == nil ||
		cfg.Access == nil || cfg.Sites == nil || cfg.Services == nil || cfg.Presence == nil || cfg.Watcher == nil ||
		cfg.Logins == nil || cfg.Logger == nil {
		return nil, errors.New("nodeconn: incomplete config")
	}
	return &Server{cfg: cfg, log: cfg.Logger}, nil
}

// Serve accepts node sessions from ln until ctx ends or ln closes.
func (s *Server) Serve(ctx context.Context, ln *tunnel.Listener) error {
	for {
		sess, err := ln.Accept(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return nil
			}
			return fmt.Errorf("hub: accept tunnel: %w", err)
		}
		s.sessions.Add(1)
		go func() {
			defer s.sessions.Done()
			s.serveSession(ctx, sess)
		}()
	}
}

// Wait blocks until every session served has ended; close them first.
func (s *Server) Wait() { s.sessions.Wait() }

// Liveness is the control-stream heartbeat for this hub's tunnel settings
// (the rule lives with the protocol, in control.LivenessOf).
func (s *Server) Liveness() control.Liveness { return control.LivenessOf(s.cfg.Tunnel) }

// auditSession records a tunnel session the hub refused or closed for a
// protocol violation.
func (s *Server) auditSession(sess tunnel.Session, node, detail string) {
	s.cfg.Audit.Refusal("connect", sess.RemoteAddr().String(), store.AuditEvent{Kind: "connect", Node: node,
		Result: "refused", Detail: sess.Transport().String() + ": " + detail})
}
