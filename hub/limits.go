package hub

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/ratelimit"
)

// guards hold what protects the hub from floods of bad attempts: per
// source rate limits of failed SSH logins and joins, and a bound on how
// many refusals per source reach the audit log.
type guards struct {
	ssh   *ratelimit.Limiter // failed bastion logins per source
	join  *ratelimit.Limiter // failed join requests per source
	audit *ratelimit.Limiter // audited refusals (sessions, TLS) per source

	loginFailures *prometheus.CounterVec // result
	rateLimited   *prometheus.CounterVec // endpoint
	refusals      *prometheus.CounterVec // kind: connect, stream, renew, tls
}

// Defaults for the limits. A person mistyping a key or a join string many
// times in a row stays well within them; a script does not.
const (
	sshFailBurst  = 20
	sshFailEvery  = 2 * time.Second // 30 failures a minute, sustained
	joinFailBurst = 20
	joinFailEvery = time.Second
	// joinMaxInflight: joins under way per source. A whole site behind one
	// NAT address may boot at once; a join is short (one CSR signature).
	joinMaxInflight = 512
	auditBurst      = 20
	auditEvery      = time.Second
	maxJoinAuditIn  = 64 << 10 // request body kept to name the token in an audit event
)

func newGuards(reg *prometheus.Registry) *guards {
	g := &guards{
		ssh:   ratelimit.New(ratelimit.Config{Burst: sshFailBurst, Every: sshFailEvery}),
		join:  ratelimit.New(ratelimit.Config{Burst: joinFailBurst, Every: joinFailEvery, MaxInflight: joinMaxInflight}),
		audit: ratelimit.New(ratelimit.Config{Burst: auditBurst, Every: auditEvery}),
		loginFailures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_ssh_login_failures_total", Help: "Bastion connections that ended without authenticating, by result (refused, timeout), and reported rate-limit refusals (rate_limited).",
		}, []string{"result"}),
		rateLimited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_rate_limited_total", Help: "Attempts refused because their source failed too often, by endpoint (ssh, join).",
		}, []string{"endpoint"}),
		refusals: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_tunnel_refusals_total", Help: "Tunnel sessions, agent streams, renewals and TLS handshakes the hub refused, by kind.",
		}, []string{"kind"}),
	}
	reg.MustRegister(g.loginFailures, g.rateLimited, g.refusals)
	for _, e := range []string{"ssh", "join"} {
		g.rateLimited.WithLabelValues(e)
	}
	return g
}
