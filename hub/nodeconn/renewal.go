package nodeconn

import (
	"context"
	"time"

	"github.com/tether-dev/tether/internal/tick"
)

// RenewHostCerts re-issues connected nodes' SSH host certificates at two
// thirds of their lifetime (Conn.HostCertRenew) and pushes them,
// until ctx ends. One ticker for the hub, not a timer per session: at
// 10,000 idle QUIC sessions a renewal timer each doubled the runtime's
// timer heap, and every ACK alarm quic-go arms makes the runtime walk that
// whole heap (the idle hub's CPU profile: timers.adjust).
func (s *Server) RenewHostCerts(ctx context.Context) {
	tick.Every(ctx, renewSweepEvery(s.cfg.HostCertTTL), func(now time.Time) { s.RenewDue(ctx, now) })
}

// RenewDue re-issues the certificates due at now and pushes them to their
// nodes only; it returns how many it re-issued.
func (s *Server) RenewDue(ctx context.Context, now time.Time) int {
	var due []*Conn
	for _, c := range s.cfg.Table.All() {
		if at := c.HostCertRenew.Load(); at != 0 && at <= now.UnixNano() {
			s.cfg.Access.CertifyHost(c, s.log.With("node", c.Name))
			due = append(due, c)
		}
	}
	if len(due) > 0 {
		sent := s.cfg.Access.PushTo(ctx, due)
		s.log.Info("host certificates renewed", "nodes", len(due), "pushed", sent)
	}
	return len(due)
}

// renewSweepEvery is how often the renewal sweep looks: a sixteenth of the
// time to renewal, between 100 ms and a minute. A certificate is thus
// re-issued at most a minute late, with a third of its lifetime left.
func renewSweepEvery(ttl time.Duration) time.Duration {
	return min(max(ttl*2/3/16, 100*time.Millisecond), time.Minute)
}

// RenewRetry is when a certificate whose signing failed is tried again: four
// more tries before the one still in use expires.
func RenewRetry(ttl time.Duration) time.Duration {
	return max(ttl/12, renewSweepEvery(ttl))
}
