package hub

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/bastion"
	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/hub/registry"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
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
	src := ratelimit.Source(remote)
	if ok, _ := s.guard.audit.Allow(src); ok {
		s.guard.audit.Fail(src)
	} else if r := s.guard.audit.Refused(src); r.Report {
		e.Detail = withSuppressed(e.Detail, r.Suppressed)
	} else {
		return
	}
	if e.At.IsZero() {
		e.At = time.Now()
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

// verifyNodeCerts makes the tunnel's TLS config verify client certificates
// itself, exactly as crypto/tls would with RequireAndVerifyClientCert and
// ClientCAs, so that a refused certificate (another CA's, an expired one)
// leaves an audit event. The tunnel listener does not tell the hub about
// failed handshakes, so the remote address is not known here; the event
// names the certificate instead.
func (s *Server) verifyNodeCerts(cfg *tls.Config) {
	roots := cfg.ClientCAs
	cfg.ClientAuth = tls.RequireAnyClientCert
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("tether: a client certificate is required")
		}
		leaf := cs.PeerCertificates[0]
		opts := x509.VerifyOptions{Roots: roots, Intermediates: x509.NewCertPool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
		for _, c := range cs.PeerCertificates[1:] {
			opts.Intermediates.AddCert(c)
		}
		if _, err := leaf.Verify(opts); err != nil {
			s.auditRefusal("tls", "tls-handshake", store.AuditEvent{Kind: "connect", Result: "refused",
				Detail: fmt.Sprintf("TLS client certificate %q (issuer %q, serial %s) refused: %v",
					leaf.Subject.CommonName, leaf.Issuer.CommonName, leaf.SerialNumber.Text(16), err)})
			return fmt.Errorf("tether: client certificate refused: %w", err)
		}
		return nil
	}
}

// guardAPI wraps the API handler. Join requests are rate limited per source
// (failed ones count; a source that failed too often gets 429 with
// Retry-After until it may try again) and every failed join is audited
// (refused tokens are audited by the join handler itself). On the other
// endpoints, a refused credential (401, 403) or a rejected change (4xx on
// anything but GET) is audited, at most a burst per source.
func (s *Server) guardAPI(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && r.URL.Path == control.JoinPath {
			s.guardJoin(next, w, r)
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
			s.auditRefusal("api", r.RemoteAddr, store.AuditEvent{Kind: "api", Result: joinResult(rec.status),
				Detail: fmt.Sprintf("%s %.256s: %d: %.512s", r.Method, r.URL.Path, rec.status, e.Error)})
		}
	})
}

func (s *Server) guardJoin(next http.Handler, w http.ResponseWriter, r *http.Request) {
	src := ratelimit.Source(r.RemoteAddr)
	attempt, retry := s.guard.join.Begin(src)
	if attempt == nil {
		s.guard.rateLimited.WithLabelValues("join").Inc()
		msg := fmt.Sprintf("join refused: too many failed join attempts from %s; try again in %s", src, retry.Round(time.Second))
		if rf := s.guard.join.Refused(src); rf.Report {
			s.audit(store.AuditEvent{At: time.Now(), Kind: "join", Remote: r.RemoteAddr, Result: "rate_limited", Detail: withSuppressed(msg, rf.Suppressed)})
			s.log.Warn("join attempts rate limited", "remote", r.RemoteAddr, "retry_in", retry)
		}
		w.Header().Set("Retry-After", strconv.Itoa(int(retry.Round(time.Second)/time.Second)))
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusTooManyRequests)
		_ = json.NewEncoder(w).Encode(control.ErrorResponse{Error: msg})
		return
	}
	body := &teeBody{ReadCloser: r.Body}
	r.Body = body
	rec := &recorder{ResponseWriter: w, status: http.StatusOK}
	succeeded := false
	defer func() { attempt.Done(!succeeded) }() // also when the handler panics
	next.ServeHTTP(rec, r)
	if succeeded = rec.status < 400; succeeded {
		return
	}
	var e control.ErrorResponse
	_ = json.Unmarshal(rec.body.Bytes(), &e)
	if tokenRefusal(e.Error) {
		return // audited by the join handler with the token id
	}
	// Name the node and the token id (never the secret) if the body had
	// them.
	var req struct{ Token, Name string }
	_ = json.Unmarshal(body.buf.Bytes(), &req)
	detail := e.Error
	if id, _, err := pki.SplitToken(req.Token); err == nil {
		detail = "token " + id + ": " + detail
	}
	s.audit(store.AuditEvent{At: time.Now(), Kind: "join", Node: fmt.Sprintf("%.64s", req.Name), Remote: r.RemoteAddr,
		Result: joinResult(rec.status), Detail: fmt.Sprintf("%.512s", detail)})
}

// tokenRefusal tells the refusals the join handler audits itself.
func tokenRefusal(msg string) bool {
	for _, err := range []error{store.ErrTokenUnknown, store.ErrTokenExpired, store.ErrTokenUsedUp} {
		if strings.Contains(msg, err.Error()) {
			return true
		}
	}
	return false
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

// helloError says what was wrong with a first control message.
func helloError(m *control.Message, err error) error {
	if err != nil {
		return err
	}
	return fmt.Errorf("first control message is %q, want hello", m.Type)
}

// livenessTimes say how often the hub and its agents heartbeat on the
// control stream and how long a silent peer is given.
type livenessTimes struct{ every, deadline time.Duration }

// liveness derives the control-stream heartbeat from the tunnel's
// keepalive: a heartbeat every keepalive interval (whole seconds, at least
// one), and a peer silent for IdleTimeout (the dead-peer timeout) is dead.
// The transport's own idle timeout does not cover this on QUIC: an endpoint
// that still receives packets never times out, so a half-open link (one
// direction lost) would otherwise go unnoticed on one side. A whole
// IdleTimeout (three heartbeats by default) rather than less: a peer on a
// CPU-starved machine is late, not dead, and closing its session kills
// whatever runs through it.
func (s *Server) liveness() livenessTimes {
	ka, idle := tunnel.DefaultKeepAliveInterval, tunnel.DefaultIdleTimeout
	if c := s.cfg.Tunnel; c != nil {
		if c.KeepAliveInterval > 0 {
			ka = c.KeepAliveInterval
		}
		if c.IdleTimeout > 0 {
			idle = c.IdleTimeout
		}
	}
	every := max(time.Second, ka.Truncate(time.Second))
	// Half a heartbeat before the transport's idle timeout: both count from
	// the node's last word, and an idle timeout that wins ends a QUIC
	// session silently, so an agent whose direction of a half-open link
	// still works would never hear of it.
	return livenessTimes{every: every, deadline: max(idle-every/2, 2*every)}
}

// sendHeartbeats tells an agent that announced capHeartbeat that the hub
// still hears it: one heartbeat at once (it arms the agent's watchdog), then
// one every liveness().every until a send fails or stop is called.
func (s *Server) sendHeartbeats(c *registry.Conn) (stop func()) {
	beat := func() bool { return c.Send(&control.Message{Type: control.TypeHeartbeat}) == nil }
	if !beat() {
		return func() {}
	}
	return repeat(s.liveness().every, beat)
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

// capHeartbeat is the hello capability of agents that take heartbeats from
// the hub (edge announces the same string).
const capHeartbeat = "heartbeat"
