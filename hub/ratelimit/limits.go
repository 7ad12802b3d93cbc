package ratelimit

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Limits are the hub's per-source limits: failed SSH logins at the
// bastion, failed joins and onboardings, and refusals written to the audit
// log, with one counter of the attempts they refused.
type Limits struct {
	SSH   *Limiter // failed bastion logins per source
	Join  *Limiter // failed join and onboarding requests per source
	Audit *Limiter // audited refusals (sessions, TLS, API) per source
	// Refused counts attempts refused because their source failed too
	// often, by endpoint (ssh, join, login).
	Refused *prometheus.CounterVec
}

// The hub's limits. A person mistyping a key or a join string many times
// in a row stays well within them; a script does not.
const (
	sshFailBurst  = 20
	sshFailEvery  = 2 * time.Second // 30 failures a minute, sustained
	JoinFailBurst = 20
	joinFailEvery = time.Second
	// joinMaxInflight: joins under way per source. A whole site behind one
	// NAT address may boot at once; a join is short (one CSR signature).
	joinMaxInflight = 512
	AuditBurst      = 20
	auditEvery      = time.Second
)

// NewLimits makes the hub's limits and registers their counter with reg.
func NewLimits(reg prometheus.Registerer) *Limits {
	l := &Limits{
		SSH:   New(Config{Burst: sshFailBurst, Every: sshFailEvery}),
		Join:  New(Config{Burst: JoinFailBurst, Every: joinFailEvery, MaxInflight: joinMaxInflight}),
		Audit: New(Config{Burst: AuditBurst, Every: auditEvery}),
		Refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_rate_limited_total",
			Help: "Attempts refused because their source failed too often, by endpoint (ssh, join).",
		}, []string{"endpoint"}),
	}
	reg.MustRegister(l.Refused)
	for _, e := range []string{"ssh", "join"} {
		l.Refused.WithLabelValues(e)
	}
	return l
}
