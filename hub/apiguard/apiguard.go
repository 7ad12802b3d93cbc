// Package apiguard is the middleware in front of the hub's HTTP API that
// limits failed joins and onboardings per source and audits refused
// requests.
package apiguard

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/auditlog"
	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// maxJoinAuditIn is how much of a join request's body is kept to name the
// token in an audit event.
const maxJoinAuditIn = 64 << 10

// Auditor writes the audit log (hub/auditlog).
type Auditor interface {
	Write(e store.AuditEvent)
	// Limited and Refusal write within the per-source limit of refusals.
	Limited(remote string, e store.AuditEvent)
	Refusal(kind, remote string, e store.AuditEvent)
}

// Config is what the guard uses.
type Config struct {
	// Join bounds failed joins and onboardings per source.
	Join *ratelimit.Limiter
	// RateLimited counts the attempts Join refuses.
	RateLimited prometheus.Counter
	Audit       Auditor
	Log         *slog.Logger
}

// Guard wraps the API handler. Join and onboarding requests are rate
// limited per source, together (failed ones count; a source that failed too
// often gets 429 with Retry-After until it may try again) and every failed
// join is audited (refused tokens are audited by the join handler itself,
// every failed onboarding by the onboarding handler). On the other
// endpoints, a refused credential (401, 403) or a rejected change (4xx on
// anything but GET) is audited, at most a burst per source.
type Guard struct{ cfg Config }

// New makes a Guard.
func New(cfg Config) *Guard { return &Guard{cfg: cfg} }

// Wrap returns next behind the guard.
func (g *Guard) Wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && (r.URL.Path == control.JoinPath || r.URL.Path == onboardproto.Path) {
			g.join(next, w, r)
			return
		}
		rec := &recorder{ResponseWriter: w, status: http.StatusOK}
		next.ServeHTTP(rec, r)
		switch {
		case strings.HasPrefix(r.URL.Path, "/v1/login"): // audited by the login service
		case rec.status == http.StatusUnauthorized || rec.status == http.StatusForbidden,
			r.Method != http.MethodGet && rec.status >= 400 && rec.status < 500 && rec.status != http.StatusNotFound:
			var e control.ErrorResponse
			_ = json.Unmarshal(rec.body.Bytes(), &e)
			g.cfg.Audit.Refusal("api", r.RemoteAddr, store.AuditEvent{Kind: "api", Result: joinResult(rec.status),
				Detail: fmt.Sprintf("%s %.256s: %d: %.512s", r.Method, r.URL.Path, rec.status, e.Error)})
		}
	})
}

func (g *Guard) join(next http.Handler, w http.ResponseWriter, r *http.Request) {
	src := ratelimit.Source(r.RemoteAddr)
	attempt, retry := g.cfg.Join.Begin(src)
	if attempt == nil {
		g.cfg.RateLimited.Inc()
		what, attempts := "join", "join"
		if r.URL.Path == onboardproto.Path {
			what, attempts = "onboard", "onboarding or join"
		}
		msg := fmt.Sprintf(
			"%s refused: too many failed %s attempts from %s; try again in %s",
			what,
			attempts,
			src,
			retry.Round(time.Second),
		)
		if rf := g.cfg.Join.Refused(src); rf.Report {
			g.cfg.Audit.Write(
				store.AuditEvent{
					At:     time.Now(),
					Kind:   what,
					Remote: r.RemoteAddr,
					Result: "rate_limited",
					Detail: auditlog.WithSuppressed(msg, rf.Suppressed),
				},
			)
			g.cfg.Log.Warn("join attempts rate limited", "remote", r.RemoteAddr, "retry_in", retry)
		}
		w.Header().Set("Retry-After", strconv.Itoa(int(retry.Round(time.Second)/time.Second)))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_ = json.NewEncoder(w).Encode(control.ErrorResponse{Error: msg})
		return
	}
	body := &teeBody{ReadCloser: r.Body}
	r.Body = body
	r, outcome := api.WithOutcome(r)
	rec := &recorder{ResponseWriter: w, status: http.StatusOK}
	failed := true
	defer func() { attempt.Done(failed) }() // also when the handler panics
	next.ServeHTTP(rec, r)
	// Only the client's failures (4xx) count against its source: a 503
	// (the certificate authority is down) or 500 is the hub's.
	if failed = rec.status >= 400 && rec.status < 500; rec.status < 400 {
		return
	}
	if errors.Is(outcome.Err(), api.ErrJoinRefused) || errors.Is(outcome.Err(), api.ErrOnboardRefused) {
		return // audited by the join or onboarding handler with the token or credential id
	}
	var e control.ErrorResponse
	_ = json.Unmarshal(rec.body.Bytes(), &e)
	// Name the node and the token id (never the secret) if the body had
	// them.
	var req struct{ Token, Name string }
	_ = json.Unmarshal(body.buf.Bytes(), &req)
	detail := e.Error
	if id, _, err := pki.SplitToken(req.Token); err == nil {
		detail = "token " + id + ": " + detail
	}
	ev := store.AuditEvent{At: time.Now(), Kind: "join", Node: fmt.Sprintf("%.64s", req.Name), Remote: r.RemoteAddr,
		Result: joinResult(rec.status), Detail: fmt.Sprintf("%.512s", detail)}
	if !failed {
		// Not charged to the source, so bounded by the audit limiter.
		g.cfg.Audit.Limited(r.RemoteAddr, ev)
		return
	}
	g.cfg.Audit.Write(ev)
}

func joinResult(status int) string {
	switch {
	case status == http.StatusForbidden || status == http.StatusUnauthorized:
		return "refused"
	case status == http.StatusConflict:
		return "conflict"
	case status >= 500:
		return "error"
	}
	return "bad_request"
}

// teeBody keeps the first maxJoinAuditIn bytes read from a request body.
type teeBody struct {
	io.ReadCloser
	buf bytes.Buffer
}

func (t *teeBody) Read(p []byte) (int, error) {
	n, err := t.ReadCloser.Read(p)
	if room := maxJoinAuditIn - t.buf.Len(); room > 0 {
		t.buf.Write(p[:min(n, room)])
	}
	return n, err
}

// recorder notes the status and the start of an error body.
type recorder struct {
	http.ResponseWriter
	status int
	body   bytes.Buffer
}

func (r *recorder) WriteHeader(code int) {
	r.status = code
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status >= 400 && r.body.Len() < 4096 {
		r.body.Write(p[:min(len(p), 4096-r.body.Len())])
	}
	return r.ResponseWriter.Write(p)
}

// Flush and Unwrap keep streaming responses (job events) working through
// the recorder.
func (r *recorder) Flush() {
	if f, ok := r.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }
