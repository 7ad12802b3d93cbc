package hub

import (
	"context"
	"fmt"
	"time"

	"github.com/tether-dev/tether/hub/bastion"
	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
)

// auditLoginFailure records a bastion connection that never authenticated.
func (s *Server) auditLoginFailure(f bastion.LoginFailure) {
	s.guard.loginFailures.WithLabelValues(f.Result).Inc()
	s.audit(store.AuditEvent{At: time.Now(), Kind: "ssh_login", Operator: f.User, Remote: f.Remote, Result: f.Result,
		Detail: withSuppressed(f.Reason, f.Suppressed)})
}

func withSuppressed(detail string, n int) string {
	if n > 0 {
		return fmt.Sprintf("%s (%d more refused since the last report)", detail, n)
	}
	return detail
}

// auditRefusal records a refused tunnel session, agent stream, renewal or
// TLS handshake. Each source gets auditBurst events, then one per
// auditEvery; beyond that, refusals are counted into the next event, so a
// misbehaving agent cannot flood the audit log.
func (s *Server) auditRefusal(kind, remote string, e store.AuditEvent) {
	s.guard.refusals.WithLabelValues(kind).Inc()
	s.auditLimited(remote, e)
}

// auditLimited writes e for remote within the per-source audit limit
// (see auditRefusal).
func (s *Server) auditLimited(remote string, e store.AuditEvent) {
	src := ratelimit.Source(remote)
	if ok, _ := s.guard.audit.Allow(src); ok {
		s.guard.audit.Fail(src)
	} else if r := s.guard.audit.Refused(src); r.Report {
		e.Detail = withSuppressed(e.Detail, r.Suppressed)
	} else {
		return
	}
	e.Remote = remote
	s.audit(e)
}

// auditSession records a tunnel session the hub refused or closed for a
// protocol violation.
func (s *Server) auditSession(sess tunnel.Session, node, detail string) {
	s.auditRefusal("connect", sess.RemoteAddr().String(), store.AuditEvent{Kind: "connect", Node: node, Result: "refused",
		Detail: sess.Transport().String() + ": " + detail})
}

func joinDetail(parts ...string) string {
	out := ""
	for _, p := range parts {
		if p == "" {
			continue
		}
		if out != "" {
			out += "; "
		}
		out += p
	}
	return out
}

// audit appends an event (the store stamps an event given no time); a
// failure is logged, never fatal to the action.
func (s *Server) audit(e store.AuditEvent) {
	if err := s.store.AppendAudit(context.Background(), e); err != nil {
		s.log.Error("audit", "kind", e.Kind, "err", err)
	}
}
