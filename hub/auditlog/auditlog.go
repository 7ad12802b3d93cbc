// Package auditlog writes the hub's audit log: every event goes through a
// Writer, which never fails the action it records, and refusals from one
// source are bounded (a burst, then one event per interval that counts the
// ones left out), so a misbehaving client cannot flood the log.
package auditlog

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/bastion"
	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
)

// Config is what a Writer uses.
type Config struct {
	Store store.AuditStore
	Log   *slog.Logger
	// Limit bounds the refusals audited per source.
	Limit *ratelimit.Limiter
	// Registry gets the Writer's counters of refusals and failed logins.
	Registry prometheus.Registerer
}

// Writer appends to the audit log.
type Writer struct {
	cfg           Config
	loginFailures *prometheus.CounterVec // result
	refusals      *prometheus.CounterVec // kind: connect, stream, renew, tls, api
}

// New makes a Writer and registers its counters.
func New(cfg Config) *Writer {
	w := &Writer{
		cfg: cfg,
		loginFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_ssh_login_failures_total",
			Help: "Bastion connections that ended without authenticating, by result (refused, timeout), " +
				"and reported rate-limit refusals (rate_limited).",
		}, []string{"result"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_tunnel_refusals_total",
			Help: "Tunnel sessions, agent streams, renewals and TLS handshakes the hub refused, by kind.",
		}, []string{"kind"}),
	}
	cfg.Registry.MustRegister(w.loginFailures, w.refusals)
	return w
}

// Write appends an event (the store stamps an event given no time); a
// failure is logged, never fatal to the action.
func (w *Writer) Write(e store.AuditEvent) {
	if err := w.cfg.Store.AppendAudit(context.Background(), e); err != nil {
		w.cfg.Log.Error("audit", "kind", e.Kind, "err", err)
	}
}

// Limited writes e for remote within the per-source audit limit: each
// source gets a burst of events, then one per interval; beyond that,
// events are counted into the next one written.
func (w *Writer) Limited(remote string, e store.AuditEvent) {
	src := ratelimit.Source(remote)
	if ok, _ := w.cfg.Limit.Allow(src); ok {
		w.cfg.Limit.Fail(src)
	} else if r := w.cfg.Limit.Refused(src); r.Report {
		e.Detail = WithSuppressed(e.Detail, r.Suppressed)
	} else {
		return
	}
	e.Remote = remote
	w.Write(e)
}

// Refusal records a refused tunnel session, agent stream, renewal, TLS
// handshake or API request, within the per-source limit (see Limited).
func (w *Writer) Refusal(kind, remote string, e store.AuditEvent) {
	w.refusals.WithLabelValues(kind).Inc()
	w.Limited(remote, e)
}

// Session records a tunnel session the hub refused or closed for a
// protocol violation.
func (w *Writer) Session(sess tunnel.Session, node, detail string) {
	w.Refusal("connect", sess.RemoteAddr().String(), store.AuditEvent{Kind: "connect", Node: node, Result: "refused",
		Detail: sess.Transport().String() + ": " + detail})
}

// LoginFailure records a bastion connection that never authenticated.
func (w *Writer) LoginFailure(f bastion.LoginFailure) {
	w.loginFailures.WithLabelValues(f.Result).Inc()
	w.Write(store.AuditEvent{At: time.Now(), Kind: "ssh_login", Operator: f.User, Remote: f.Remote, Result: f.Result,
		Detail: WithSuppressed(f.Reason, f.Suppressed)})
}

// WithSuppressed adds to detail how many like events were left out.
func WithSuppressed(detail string, n int) string {
	if n > 0 {
		return fmt.Sprintf("%s (%d more refused since the last report)", detail, n)
	}
	return detail
}
