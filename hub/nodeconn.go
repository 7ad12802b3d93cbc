package hub

import (
	"context"
	"log/slog"
	"slices"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// Adapters that hand hub/nodeconn the parts of the hub it uses. A session
// is served only once Run has started the services, attached the
// controllers' job engine and joined the peers.

func (s *Server) newNodeConns() (*nodeconn.Server, error) {
	s.metrics.RegisterResume(s.conns.ResumeStreams, s.conns.ResumeBuffered)
	return nodeconn.New(nodeconn.Config{Store: s.store, Table: s.conns, IssueNode: s.issueNode,
		NodeCertTTL: s.cfg.NodeCertTTL, HostCertTTL: s.cfg.HostCertTTL, Tunnel: s.cfg.Tunnel, Metrics: s.metrics,
		Audit: s.auditLog, Access: s.pusher, Sites: connSites{s}, Services: connServices{s},
		Presence: s.replicas, Watcher: connWatcher{s}, Logins: connLogins{s}, Logger: s.log,
		ResumeWindow: max(s.cfg.ResumeWindow, 0), ResumeEvents: resumeEvents{s.metrics}})
}

// resumeEvents counts resumable streams' events in the hub's metrics.
type resumeEvents struct{ m *metrics.Metrics }

func (e resumeEvents) Event(kind string) { e.m.ResumeEvents.WithLabelValues(kind).Inc() }

type connSites struct{ s *Server }

func (n connSites) Admit(ctx context.Context, node store.Node, h *control.Hello) (*siteproto.Welcome, error) {
	return n.s.children.AdmitHello(ctx, node, h)
}
func (n connSites) ServesStreams() bool { return n.s.children.ServesStreams() }
func (n connSites) Connected(ctx context.Context, c *nodeconn.Conn, h *control.Hello,
	w *siteproto.Welcome) func() {
	return n.s.children.Connected(ctx, c, h.Site, w)
}
func (n connSites) Dispatch(ctx context.Context, c *nodeconn.Conn, m *control.Message) (bool, error) {
	return n.s.children.Dispatch(ctx, c, m)
}

type connServices struct{ s *Server }

func (n connServices) Connected(ctx context.Context, c *nodeconn.Conn) func() {
	return n.s.services.Connected(ctx, c)
}
func (n connServices) ServeConnect(ctx context.Context, st tunnel.Stream, consumer, remote string) {
	n.s.services.ServeConnect(ctx, st, consumer, remote)
}

type connWatcher struct{ s *Server }

func (w connWatcher) Connected(ctx context.Context, nodeID, agentVersion string) {
	w.s.cluster.Wake(nodeID)
	w.s.upgrades.Connected(ctx, nodeID, agentVersion)
}
func (w connWatcher) UpgradeStates(ctx context.Context, c *nodeconn.Conn, states []upgradeproto.NodeState,
	log *slog.Logger) {
	w.s.recordUpgradeStates(ctx, c, states, log)
}

type connLogins struct{ s *Server }

func (l connLogins) NoteOutcome(nodeID, operator, refused string) {
	l.s.jumps.NoteOutcome(nodeID, operator, refused)
}

// KeyOf: the operator's registered key, or the key of the KubeOne cluster
// identity of that name.
func (l connLogins) KeyOf(operator, fingerprint string) bool {
	snap := l.s.door.Snapshot()
	if o, ok := snap.Operator(operator); ok && slices.ContainsFunc(o.Keys, func(k gossh.PublicKey) bool {
		return gossh.FingerprintSHA256(k) == fingerprint
	}) {
		return true
	}
	k, ok := snap.KubeOneKey(operator)
	return ok && gossh.FingerprintSHA256(k) == fingerprint
}

// jumpNodes are the connected nodes as bastion jumps use them.
type jumpNodes struct{ s *Server }

func (n jumpNodes) ReportsLogins(node string) bool { return n.s.conns.ReportsLogins(node) }

func (n jumpNodes) ReportingID(node string) (string, bool) {
	c, ok := n.s.conns.Get(node)
	if !ok || !c.ReportsLogins {
		return "", false
	}
	return c.NodeID, true
}

func (n jumpNodes) SendAccess(node, nodeID string) {
	if c, ok := n.s.conns.Get(node); ok && c.NodeID == nodeID {
		n.s.pusher.Push(c, false)
	}
}
