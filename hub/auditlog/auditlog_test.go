package auditlog

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/hub/store"
)

type memAudit struct {
	mu   sync.Mutex
	evs  []store.AuditEvent
	fail error
}

func (m *memAudit) AppendAudit(_ context.Context, e store.AuditEvent) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.fail != nil {
		return m.fail
	}
	m.evs = append(m.evs, e)
	return nil
}

func (m *memAudit) ListAudit(context.Context, store.AuditFilter) ([]store.AuditEvent, error) {
	return nil, nil
}

func newWriter(st store.AuditStore) *Writer {
	return New(Config{Store: st, Log: slog.New(slog.NewTextHandler(io.Discard, nil)),
		Limit: ratelimit.NewLimits(prometheus.NewRegistry()).Audit, Registry: prometheus.NewRegistry()})
}

// TestRefusalsBoundedPerSource: a flood of refusals from one source leaves
// a burst of events (and at most one report); other sources are
// unaffected.
func TestRefusalsBoundedPerSource(t *testing.T) {
	st := &memAudit{}
	w := newWriter(st)
	const flood = 200
	for range flood {
		w.Refusal("connect", "192.0.2.1:4000", store.AuditEvent{Kind: "connect", Result: "refused", Detail: "bad"})
	}
	w.Refusal("connect", "198.51.100.7:4000", store.AuditEvent{Kind: "connect", Result: "refused", Detail: "bad"})
	var flooder, other int
	for _, e := range st.evs {
		switch e.Remote {
		case "192.0.2.1:4000":
			flooder++
		case "198.51.100.7:4000":
			other++
		}
	}
	if flooder > ratelimit.AuditBurst+1 || flooder < ratelimit.AuditBurst {
		t.Errorf("%d refusals from one source left %d events; want %d or %d", flood, flooder,
			ratelimit.AuditBurst, ratelimit.AuditBurst+1)
	}
	if other != 1 {
		t.Errorf("another source's refusal left %d events, want 1", other)
	}
}

// TestWriteNeverFails: a store that cannot append does not fail the action.
func TestWriteNeverFails(t *testing.T) {
	w := newWriter(&memAudit{fail: errors.New("disk full")})
	w.Write(store.AuditEvent{Kind: "login", Result: "ok"})
}

func TestWithSuppressed(t *testing.T) {
	if got := WithSuppressed("refused", 0); got != "refused" {
		t.Errorf("WithSuppressed(_, 0) = %q", got)
	}
	if got := WithSuppressed("refused", 3); got != "refused (3 more refused since the last report)" {
		t.Errorf("WithSuppressed(_, 3) = %q", got)
	}
}
