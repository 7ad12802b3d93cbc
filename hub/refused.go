package hub

import (
	"fmt"
	"log/slog"
	"slices"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/registry"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/control"
)

// What a node's embedded SSH server reports for the audit (control's
// ssh_event): refused logins, port forwardings, connections it closed when
// access was taken away. The operator's SSH traffic is end-to-end
// encrypted through the bastion, so the hub cannot see which login was
// asked for; the node's report, linked to the node and (when the key
// matches a registered operator) to the operator, is audited on its own and
// marks the operator's live jump to that node (auditJump), whose row then
// reads "login_refused" with the reason.

// welcome is the hub's answer to a node's hello: the liveness rule and the
// hub's capabilities.
func (s *Server) welcome(nodeID, name string) *control.Welcome {
	w := s.liveness().Welcome(nodeID, name)
	w.Capabilities = []string{control.HubCapSSHEvents, control.HubCapTransportLiveness}
	if s.upgrades != nil {
		w.Capabilities = append(w.Capabilities, control.HubCapUpgrades)
	}
	return w
}

// reportsLogins says whether node's connected agent reports the outcome of
// every SSH login, so a jump's audit row may wait for it.
func (s *Server) reportsLogins(node string) bool {
	c, ok := s.reg.Get(node)
	return ok && c.ReportsLogins
}

// sshEventAudit maps a reported event kind to the audit row's kind and
// result.
var sshEventAudit = map[string]struct{ kind, result string }{
	"login-refused":   {"login_refused", "refused"},
	"forward":         {"ssh_forward", "ok"},
	"forward-refused": {"ssh_forward", "refused"},
	"access-revoked":  {"ssh_session_revoked", "closed"},
}

// recordSSHEvent audits one report of conn's embedded SSH server, within
// the per-source audit limit (a node cannot flood the log). The operator is
// named only if the reported key fingerprint is one of that operator's
// registered keys (or the key of the KubeOne cluster identity of that
// name); otherwise the node's claim stays in the detail.
func (s *Server) recordSSHEvent(conn *registry.Conn, ev *control.SSHEvent, log *slog.Logger) {
	switch ev.Kind {
	case "login-accepted", "login-failed":
		// An outcome for the jump that carried the connection: the
		// node's own log has the details, the jump row the result.
		log.Debug("ssh login outcome from node", "kind", ev.Kind, "login", ev.Login, "key", ev.KeyFingerprint)
		s.jumps.noteOutcome(conn.NodeID, "", "")
		return
	}
	m, ok := sshEventAudit[ev.Kind]
	if !ok {
		m.kind, m.result = "ssh_event", ev.Kind
	}
	e := store.AuditEvent{At: time.Now(), Kind: m.kind, Node: conn.Name, KeyFingerprint: ev.KeyFingerprint, Result: m.result}
	detail := ev.Detail
	if ev.Login != "" {
		detail = fmt.Sprintf("login %q: %s", ev.Login, detail)
	}
	snap := s.door.Snapshot()
	if o, ok := snap.Operator(ev.Operator); ok && slices.ContainsFunc(o.Keys, func(k gossh.PublicKey) bool {
		return gossh.FingerprintSHA256(k) == ev.KeyFingerprint
	}) {
		e.Operator = o.Name
	} else if k, ok := snap.KubeOneKey(ev.Operator); ok && gossh.FingerprintSHA256(k) == ev.KeyFingerprint {
		e.Operator = ev.Operator // a KubeOne cluster's identity
	} else if ev.Operator != "" {
		detail += fmt.Sprintf(" (node reports operator %q)", ev.Operator)
	}
	e.Detail = detail
	if ev.Kind == "login-refused" && e.Operator != "" {
		s.jumps.noteOutcome(conn.NodeID, e.Operator, detail)
	}
	log.Info("ssh event from node", "kind", ev.Kind, "login", ev.Login, "operator", e.Operator, "key", ev.KeyFingerprint)
	s.auditLimited(conn.Session.RemoteAddr().String(), e)
}
