package nodeconn

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/validate"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

const (
	helloTimeout      = 10 * time.Second
	heartbeatInterval = 30 * time.Second
	// seenStoreInterval is how often an online node's last_seen is written:
	// connects and disconnects are stored at once, so this only bounds how
	// stale last_seen can be after a hub crash. Every heartbeat (every few
	// seconds) would be thousands of synchronous writes a second at 100k
	// nodes.
	seenStoreInterval = 5 * time.Minute
)

// serveSession authenticates a node session, registers it, and reads its
// control stream until the session ends. Any protocol violation closes only
// this session.
func (s *Server) serveSession(ctx context.Context, sess tunnel.Session) {
	start := time.Now()
	held := false // holdSession owns sess and ctrl from then on
	defer func() {
		if !held {
			sess.Close()
		}
	}()
	log := s.log.With("remote", sess.RemoteAddr().String(), "transport", sess.Transport().String())
	certs := sess.ConnectionState().PeerCertificates
	if len(certs) == 0 {
		log.Warn("session without client certificate")
		return
	}
	id, err := pki.IdentityOf(certs[0])
	if err != nil || id.Kind != pki.KindNode {
		log.Warn("session refused: not a node certificate", "subject", certs[0].Subject.CommonName, "err", err)
		s.auditSession(sess, "", fmt.Sprintf("certificate %q is not a node identity", certs[0].Subject.CommonName))
		return
	}
	log = log.With("node_id", id.ID)
	node, err := s.cfg.Store.GetNode(ctx, id.ID)
	if errors.Is(err, store.ErrNotFound) {
		log.Warn("session refused: node is not registered (removed?)")
		s.auditSession(sess, "", "node id "+id.ID+" is not registered (removed?)")
		s.refuse(sess, "this node is not registered on the hub (it was removed); re-join with a new join string")
		return
	}
	if err != nil {
		log.Error("session: load node", "err", err)
		return
	}
	log = log.With("node", node.Name)
	if !node.RevokedAt.IsZero() {
		log.Warn("session refused: node is revoked")
		s.auditSession(sess, node.Name, "revoked node tried to reconnect")
		s.refuse(sess, "this node was revoked on the hub; re-join with a new join string")
		return
	}

	hctx, cancel := context.WithTimeout(ctx, helloTimeout)
	ctrl, err := sess.AcceptStream(hctx)
	cancel()
	if err != nil {
		log.Info("session ended before control stream", "err", err)
		return
	}
	defer func() {
		if !held {
			ctrl.Close()
		}
	}()
	_ = ctrl.SetReadDeadline(time.Now().Add(helloTimeout))
	msg, err := control.Read(ctrl)
	if err != nil || msg.Type != control.TypeHello {
		log.Warn("session refused: bad hello", "err", err)
		s.auditSession(sess, node.Name, fmt.Sprintf("bad hello: %v", helloError(msg, err)))
		return
	}
	_ = ctrl.SetReadDeadline(time.Time{})
	if msg.Hello.Name != node.Name {
		// A certificate is bound to one node: node A's cert cannot claim B.
		log.Warn("session refused: hello name does not match certificate", "claimed", msg.Hello.Name)
		s.auditSession(
			sess,
			node.Name,
			fmt.Sprintf("certificate of node %q claimed to be node %.64q", node.Name, msg.Hello.Name),
		)
		_ = control.Write(ctrl, &control.Message{Type: control.TypeNotice, Fatal: true,
			Notice: fmt.Sprintf("this identity belongs to node %q, not %q", node.Name, msg.Hello.Name)})
		CloseAfterGrace(sess)
		return
	}
	siteWelcome, err := s.cfg.Sites.Admit(ctx, node, msg.Hello)
	if err != nil {
		log.Warn("session refused: site admission", "err", err)
		s.auditSession(sess, node.Name, err.Error())
		_ = control.Write(ctrl, &control.Message{Type: control.TypeNotice, Fatal: true, Notice: err.Error()})
		CloseAfterGrace(sess)
		return
	}
	// Stored before the node shows online, so a listing that shows it
	// online shows what it reported.
	s.storeReportedLabels(ctx, log, node, msg.Hello.Labels)
	s.storeFacts(ctx, log, node, msg.Hello.Facts)
	conn := NewConn(node.ID, node.Name, sess, ctrl)
	welcome := s.welcome(node.ID, node.Name)
	if s.cfg.ResumeWindow > 0 && slices.Contains(msg.Hello.Capabilities, control.CapResume) {
		s.enableResume(conn, s.cfg.ResumeWindow, siteWelcome != nil, msg.Hello.ResumeInstance)
		welcome.Capabilities = append(welcome.Capabilities, control.HubCapResume)
		if slices.Contains(msg.Hello.Capabilities, control.CapResumeConnect) {
			conn.resume.connects = true
			welcome.Capabilities = append(welcome.Capabilities, control.HubCapResumeConnect)
		}
		welcome.ResumeWindowSeconds = int((s.cfg.ResumeWindow + time.Second - 1) / time.Second)
	}
	if siteWelcome != nil {
		welcome.Site = siteWelcome
		welcome.Capabilities = append(welcome.Capabilities, siteproto.HubCapSites)
		if s.cfg.Sites.ServesStreams() {
			welcome.Capabilities = append(welcome.Capabilities, siteproto.HubCapSiteStreams)
		}
	}
	if err := conn.Send(&control.Message{Type: control.TypeWelcome, Welcome: welcome}); err != nil {
		log.Info("session ended during welcome", "err", err)
		return
	}
	conn.HostKey = msg.Hello.HostKey
	conn.StateDir = msg.Hello.StateDir
	if slices.Contains(msg.Hello.Capabilities, upgradeproto.CapUpgrade) {
		conn.Upgrade = msg.Hello.Upgrade
	}
	conn.AgentVersion, conn.Arch = msg.Hello.AgentVersion, msg.Hello.Facts.Arch
	conn.ReportsLogins = slices.Contains(msg.Hello.Capabilities, control.CapSSHLoginEvents)
	if conn.TransportLive = slices.Contains(msg.Hello.Capabilities, control.CapTransportLiveness); conn.TransportLive {
		conn.Heard.Store(time.Now().UnixNano()) // admitted: heard; the presence sweep goes on from here
	}
	conn.Labels = node.Labels
	if msg.Hello.MovedFrom != "" {
		// The agent moved transports (TCP fallback, then QUIC got
		// through): its old session drains rather than dropping the
		// operators' live streams on it.
		if old := s.cfg.Table.PutMoved(conn); old != nil {
			log.Info("node moved transport; its previous session drains", "from", msg.Hello.MovedFrom,
				"previous_remote", old.Session.RemoteAddr().String())
		}
	} else if old := s.cfg.Table.Put(conn); old != nil {
		log.Info("node reconnected; replaced its previous session", "previous_remote", old.Session.RemoteAddr().String())
	}
	// A revoke or removal between the first check and Put only closed
	// sessions already registered: look again now that this one is.
	n, err := s.cfg.Store.GetNode(ctx, node.ID)
	if err != nil || !n.RevokedAt.IsZero() {
		log.Warn("session refused: node was revoked or removed while connecting")
		s.auditSession(sess, node.Name, "node was revoked or removed while connecting")
		s.cfg.Table.Remove(conn)
		conn.CloseWithNotice("this node was revoked or removed on the hub; re-join with a new join string", true)
		return
	}
	// A label change committed before this read is in n; one after it
	// finds the registered session and updates it (api labelNodes).
	conn.PushMu.Lock()
	conn.Labels = n.Labels
	conn.PushMu.Unlock()
	// Registered first, then pushed: an operator or role change from now
	// on reaches this session too.
	s.cfg.Access.CertifyHost(conn, log)
	s.cfg.Access.Push(conn, true)
	transport := sess.Transport().String()
	s.cfg.Metrics.NodesConnected.WithLabelValues(transport).Inc()
	s.cfg.Metrics.HandshakeDuration.WithLabelValues(transport).Observe(time.Since(start).Seconds())
	shown := transport
	if why := msg.Hello.TransportWhy; why != "" {
		shown += " (" + why + ")" // `tether nodes`: "tcp (udp blocked, re-probing)"
	}
	s.markSeen(
		ctx,
		log,
		node.ID,
		store.Seen{Online: true, Transport: shown, AgentVersion: msg.Hello.AgentVersion, At: time.Now()},
	)
	presence := s.cfg.Presence.Connected(ctx, conn)
	// A cluster step may be waiting for this node; a node back on an
	// upgrade's target version has passed its health check, and one back at
	// all may be next in a rollout.
	s.cfg.Watcher.Connected(ctx, node.ID, msg.Hello.AgentVersion)
	log.Info("node connected", "agent_version", msg.Hello.AgentVersion)

	// The session lives on in a goroutine of its own, and this one, whose
	// stack grew deep while admitting the node (TLS state, the store),
	// ends: a goroutine's stack only shrinks to a quarter of what it
	// holds, so an idle session would keep that depth for its lifetime.
	held = true
	// A transport-liveness agent announces heartbeats too (for hubs of
	// earlier versions), but here neither side sends them.
	beats := !conn.TransportLive && slices.Contains(msg.Hello.Capabilities, control.CapHeartbeat)
	hello := msg.Hello
	s.sessions.Add(1) // while this goroutine's own count is held
	go func() {
		defer s.sessions.Done()
		s.holdSession(ctx, conn, ctrl, presence, beats, transport, hello, siteWelcome, log)
	}()
}

// holdSession serves an admitted node's session until it ends: it serves
// the streams the agent may open (service connects) or a site's streams,
// renews its host certificate, answers its heartbeats and reads its
// control stream; then it unregisters the node and closes the session.
func (s *Server) holdSession(ctx context.Context, conn *Conn, ctrl tunnel.Stream, presence store.Presence,
	beats bool, transport string, hello *control.Hello, siteWelcome *siteproto.Welcome, log *slog.Logger) {
	sess := conn.Session
	defer sess.Close()
	defer ctrl.Close()
	defer s.cfg.Presence.Disconnected(presence)

	// An agent may open service connect streams only (streams.go); a
	// site's streams are its children's (hub/site).
	serviceConnect := siteWelcome == nil && slices.Contains(hello.Capabilities, siteproto.CapServiceConnect)
	sctx, stopStreams := context.WithCancel(ctx)
	waitStreams, consumerGone := func() {}, func() {}
	if siteWelcome != nil {
		defer s.cfg.Sites.Connected(ctx, conn, hello, siteWelcome)()
	} else {
		waitStreams = s.serveAgentStreams(sctx, ctx, conn, serviceConnect, log)
		if serviceConnect {
			consumerGone = s.cfg.Services.Connected(ctx, conn)
		}
	}
	if !beats || heartbeat(conn) == nil {
		s.readControl(ctx, conn, ctrl, beats, log)
	}
	consumerGone()
	stopStreams()
	waitStreams()

	s.cfg.Metrics.NodesConnected.WithLabelValues(transport).Dec()
	conn.SeenMu.Lock()
	if s.cfg.Table.Remove(conn) {
		s.markSeen(context.Background(), log, conn.NodeID, store.Seen{Online: false, At: time.Now()})
	}
	conn.SeenMu.Unlock()
	log.Info("node disconnected", "connected_for", time.Since(conn.Connected).Round(time.Second))
}

// welcome is the hub's answer to a node's hello: the liveness rule and the
// hub's capabilities.
func (s *Server) welcome(nodeID, name string) *control.Welcome {
	w := s.Liveness().Welcome(nodeID, name)
	w.Capabilities = []string{control.HubCapSSHEvents, control.HubCapTransportLiveness, upgradeproto.HubCapUpgrades}
	w.Hubs = s.cfg.Presence.Hubs() // the live replicas' addresses: the agent fails over to any of them
	return w
}

func (s *Server) refuse(sess tunnel.Session, why string) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if st, err := sess.AcceptStream(ctx); err == nil {
		_ = st.SetDeadline(time.Now().Add(2 * time.Second))
		if _, err := control.Read(st); err == nil {
			_ = control.Write(st, &control.Message{Type: control.TypeNotice, Notice: why, Fatal: true})
			CloseAfterGrace(sess)
		}
		st.Close()
	}
}

func (s *Server) markSeen(ctx context.Context, log *slog.Logger, id string, seen store.Seen) {
	if err := s.cfg.Store.UpdateNodeSeen(ctx, id, seen); err != nil && !errors.Is(err, store.ErrNotFound) {
		log.Error("record node status", "err", err)
	}
}

// helloError says what was wrong with a first control message.
func helloError(m *control.Message, err error) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("first control message is %q, want hello", m.Type)
}

// storeFacts records the facts of the agent's hello, if they changed (the
// control layer has validated their bounds).
func (s *Server) storeFacts(ctx context.Context, log *slog.Logger, n store.Node, facts control.Facts) {
	if facts == n.Facts {
		return
	}
	if err := s.cfg.Store.SetNodeFacts(ctx, n.ID, facts); err != nil && !errors.Is(err, store.ErrNotFound) {
		log.Error("record node facts", "err", err)
	}
}

// storeReportedLabels records the labels the agent reported in its hello,
// if they changed. Labels outside the hub's label rules are refused as a
// whole (logged, the stored ones kept): reported labels are only ever
// shown, so nothing depends on them being current.
func (s *Server) storeReportedLabels(ctx context.Context, log *slog.Logger, n store.Node, labels map[string]string) {
	if labels == nil {
		labels = map[string]string{}
	}
	if maps.Equal(labels, n.ReportedLabels) {
		return
	}
	if err := validate.Labels(labels); err != nil {
		log.Warn("agent reported invalid labels; keeping the previous ones", "err", err)
		return
	}
	if err := s.cfg.Store.SetReportedLabels(ctx, n.ID, labels); err != nil && !errors.Is(err, store.ErrNotFound) {
		log.Error("record reported labels", "err", err)
	}
}
