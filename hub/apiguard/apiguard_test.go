package apiguard

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/control"
)

type memAuditor struct {
	mu  sync.Mutex
	evs []store.AuditEvent
}

func (m *memAuditor) Write(e store.AuditEvent) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.evs = append(m.evs, e)
}

func (m *memAuditor) Limited(remote string, e store.AuditEvent) {
	e.Remote = remote
	m.Write(e)
}

func (m *memAuditor) Refusal(_, remote string, e store.AuditEvent) { m.Limited(remote, e) }

func newGuard(t *testing.T, status int) (http.Handler, *memAuditor, prometheus.Counter) {
	t.Helper()
	limits := ratelimit.NewLimits(prometheus.NewRegistry())
	audit := &memAuditor{}
	limited := limits.Refused.WithLabelValues("join")
	g := New(Config{Join: limits.Join, RateLimited: limited, Audit: audit,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil))})
	return g.Wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(status)
		_, _ = io.WriteString(w, `{"error":"no"}`)
	})), audit, limited
}

func post(h http.Handler, path, remote string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodPost, path, strings.NewReader(`{"token":"x","name":"n1"}`))
	r.RemoteAddr = remote
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

// TestJoinFailuresRateLimited: a source whose joins keep failing gets 429
// with Retry-After once its burst is spent; each failure is audited; other
// sources still reach the handler.
func TestJoinFailuresRateLimited(t *testing.T) {
	h, audit, limited := newGuard(t, http.StatusForbidden)
	for i := range ratelimit.JoinFailBurst {
		if w := post(h, control.JoinPath, "192.0.2.1:1000"); w.Code != http.StatusForbidden {
			t.Fatalf("join %d: %d, want 403", i+1, w.Code)
		}
	}
	w := post(h, control.JoinPath, "192.0.2.1:1000")
	if w.Code != http.StatusTooManyRequests || w.Header().Get("Retry-After") == "" {
		t.Fatalf("join after %d failures: %d (Retry-After %q), want 429 with Retry-After",
			ratelimit.JoinFailBurst, w.Code, w.Header().Get("Retry-After"))
	}
	if n := testutil.ToFloat64(limited); n != 1 {
		t.Errorf("rate-limited counter %v, want 1", n)
	}
	if w := post(h, control.JoinPath, "198.51.100.7:1000"); w.Code != http.StatusForbidden {
		t.Errorf("another source's join: %d, want 403 from the handler", w.Code)
	}
	refused := 0
	for _, e := range audit.evs {
		if e.Kind == "join" && e.Result == "refused" && e.Node == "n1" {
			refused++
		}
	}
	if refused != ratelimit.JoinFailBurst+1 {
		t.Errorf("%d refused joins audited, want %d", refused, ratelimit.JoinFailBurst+1)
	}
}

// TestAPIRefusalAudited: a refused credential on another endpoint is
// audited; login endpoints are left to the login service.
func TestAPIRefusalAudited(t *testing.T) {
	h, audit, _ := newGuard(t, http.StatusUnauthorized)
	post(h, "/v1/nodes/x/revoke", "192.0.2.1:1000")
	post(h, "/v1/login", "192.0.2.1:1000")
	if len(audit.evs) != 1 || audit.evs[0].Kind != "api" || audit.evs[0].Result != "refused" {
		t.Fatalf("audited %+v, want one refused api event", audit.evs)
	}
}
