package nodeconn

import (
	"fmt"
	"log/slog"
	"time"

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
func (s *Server) recordSSHEvent(conn *Conn, ev *control.SSHEvent, log *slog.Logger) {
	switch ev.Kind {
	case "login-accepted", "login-failed":
		// An outcome for the jump that carried the connection: the
		// node's own log has the details, the jump row the result.
		log.Debug("ssh login outcome from node", "kind", ev.Kind, "login", ev.Login, "key", ev.KeyFingerprint)
		s.cfg.Logins.NoteOutcome(conn.NodeID, "", "")
		return
	}
	m, ok := sshEventAudit[ev.Kind]
	if !ok {
		m.kind, m.result = "ssh_event", ev.Kind
	}
	e := store.AuditEvent{
		At:             time.Now(),
		Kind:           m.kind,
		Node:           conn.Name,
		KeyFingerprint: ev.KeyFingerprint,
		Result:         m.result,
	}
	detail := ev.Detail
	if ev.Login != "" {
		detail = fmt.Sprintf("login %q: %s", ev.Login, detail)
	}
	if ev.Operator != "" && s.cfg.Logins.KeyOf(ev.Operator, ev.KeyFingerprint) {
		e.Operator = ev.Operator // an operator's key, or a KubeOne cluster's identity
	} else if ev.Operator != "" {
		detail += fmt.Sprintf(" (node reports operator %q)", ev.Operator)
	}
	e.Detail = detail
	if ev.Kind == "login-refused" && e.Operator != "" {
		s.cfg.Logins.NoteOutcome(conn.NodeID, e.Operator, detail)
	}
	log.Info("ssh event from node", "kind", ev.Kind, "login", ev.Login, "operator", e.Operator, "key", ev.KeyFingerprint)
	s.cfg.Audit.Limited(conn.Session.RemoteAddr().String(), e)
}
