package hub

import (
	"context"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
)

// countingIssuer wraps the hub's node certificate issuer: it counts every
// issuance asked for (each would be a signature, or an outbound one-time-
// token issuance at a step-ca) and fails while down is set.
type countingIssuer struct {
	calls atomic.Int64
	down  atomic.Bool
}

func (c *countingIssuer) install(s *Server) {
	real := s.issueNode
	s.issueNode = func(
		ctx context.Context, csr []byte, id pki.Identity, cn string, ttl time.Duration,
	) ([]*x509.Certificate, error) {
		c.calls.Add(1)
		if c.down.Load() {
			return nil, errors.New("stepca: sign: dial tcp 10.0.0.1:9000: connect: connection refused")
		}
		return real(ctx, csr, id, cn, ttl)
	}
}

// postJoin posts a join request as tether-edge would and returns the
// status, Retry-After and error message.
func postJoin(t *testing.T, hc *http.Client, js pki.JoinString, token, name string, csr []byte) (int, string, string) {
	t.Helper()
	body, _ := json.Marshal(control.JoinRequest{Token: token, Name: name, CSR: csr})
	resp, err := hc.Post("https://"+js.Addrs[0]+control.JoinPath, "application/json", strings.NewReader(string(body)))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var e control.ErrorResponse
	_ = json.Unmarshal(b, &e)
	return resp.StatusCode, resp.Header.Get("Retry-After"), e.Error
}

// TestJoinAuthenticatesBeforeSigning: a join with a wrong secret, or for a
// token id that does not exist, is refused without a single issuance;
// only the right secret gets a certificate signed.
func TestJoinAuthenticatesBeforeSigning(t *testing.T) {
	var iss countingIssuer
	_, c := testHubWith(t, iss.install)
	ctx := context.Background()
	tok, err := c.CreateToken(ctx, apitype.TokenCreateRequest{TTLSeconds: 600, Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	js, hc, csr := joinerClient(t, tok.JoinString, "n1")
	id, secret, err := pki.SplitToken(js.Token)
	if err != nil {
		t.Fatal(err)
	}
	_, otherSecret, _ := pki.NewToken()
	otherID, _, _ := pki.NewToken()
	for _, tc := range []struct{ name, token string }{
		{"wrong secret", id + "." + otherSecret},
		{"unknown token id", otherID + "." + secret},
	} {
		status, _, msg := postJoin(t, hc, js, tc.token, "n1", csr)
		if status != http.StatusForbidden || !strings.Contains(msg, "join refused") {
			t.Errorf("%s: %d %q, want 403 join refused", tc.name, status, msg)
		}
		if n := iss.calls.Load(); n != 0 {
			t.Fatalf("%s: the hub asked its certificate authority to sign %d time(s) before checking the token", tc.name, n)
		}
	}
	if status, _, msg := postJoin(t, hc, js, js.Token, "n1", csr); status != http.StatusOK {
		t.Fatalf("join with the right secret: %d %q", status, msg)
	}
	if n := iss.calls.Load(); n != 1 {
		t.Errorf("one valid join made %d issuances, want 1", n)
	}
	// The single use is spent: refused, again without a signature.
	if status, _, msg := postJoin(t, hc, js, js.Token, "n2", csr); status != http.StatusForbidden ||
		!strings.Contains(msg, "no uses left") {
		t.Errorf("second join on a single-use token: %d %q, want 403 no uses left", status, msg)
	}
	if n := iss.calls.Load(); n != 1 {
		t.Errorf("a join on a spent token made an issuance (%d in all)", n)
	}
}

// TestJoinIssuerOutage: when the certificate authority fails, a valid
// join is answered 503 with Retry-After, keeps its token use, and is not
// charged to its source's failed-join limit; once the authority is back
// the same single-use token joins.
func TestJoinIssuerOutage(t *testing.T) {
	var iss countingIssuer
	iss.down.Store(true)
	s, c := testHubWith(t, iss.install)
	ctx := context.Background()
	tok, err := c.CreateToken(ctx, apitype.TokenCreateRequest{TTLSeconds: 600, Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	js, hc, csr := joinerClient(t, tok.JoinString, "n1")
	// More attempts than the failure burst: if they were charged, the
	// last would be 429.
	for i := range ratelimit.JoinFailBurst + 5 {
		status, retry, msg := postJoin(t, hc, js, js.Token, "n1", csr)
		if status != http.StatusServiceUnavailable || retry == "" || !strings.Contains(msg, "certificate authority") {
			t.Fatalf("join %d while the CA is down: %d Retry-After %q %q; want 503 with Retry-After", i+1, status, retry, msg)
		}
		if strings.Contains(msg, "stepca:") || strings.Contains(msg, "10.0.0.1") {
			t.Errorf("the answer leaks the CA's internal error: %q", msg)
		}
	}
	if n := testutil.ToFloat64(s.limits.Refused.WithLabelValues("join")); n != 0 {
		t.Errorf("%v joins were rate limited: CA outages were charged to the joining source", n)
	}
	if ok, _ := s.limits.Join.Allow("127.0.0.1"); !ok {
		t.Error("the join limiter refuses 127.0.0.1 after CA outages")
	}
	toks, err := c.ListTokens(ctx)
	if err != nil || len(toks) != 1 || toks[0].UsesLeft != 1 {
		t.Fatalf("token after the outage: %+v %v; want its one use left", toks, err)
	}
	iss.down.Store(false)
	if status, _, msg := postJoin(t, hc, js, js.Token, "n1", csr); status != http.StatusOK {
		t.Fatalf("join once the CA is back: %d %q", status, msg)
	}
	waitAudit(t, c, "CA outage audited", func(e apitype.AuditEvent) bool {
		return e.Kind == "join" && e.Result == "error" && strings.Contains(e.Detail, "certificate authority")
	})
}

// TestJoinRaceForLastUse: many valid joins racing for one use get one
// node; the rest are refused (no uses left) and none reaches the store.
func TestJoinRaceForLastUse(t *testing.T) {
	_, c := testHub(t)
	ctx := context.Background()
	tok, err := c.CreateToken(ctx, apitype.TokenCreateRequest{TTLSeconds: 600, Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	js, hc, csr := joinerClient(t, tok.JoinString, "n")
	var wg sync.WaitGroup
	var ok atomic.Int64
	for i := range 8 {
		wg.Go(func() {
			if status, _, _ := postJoin(t, hc, js, js.Token, fmt.Sprintf("race-%d", i), csr); status == http.StatusOK {
				ok.Add(1)
			}
		})
	}
	wg.Wait()
	nodes, err := c.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if ok.Load() != 1 || len(nodes) != 1 {
		t.Errorf("%d joins succeeded and %d nodes exist on a single-use token, want 1 and 1", ok.Load(), len(nodes))
	}
}
