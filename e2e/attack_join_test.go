package e2e

import (
	"encoding/json"
	"io"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
)

// TestAttackJoinRefusalsAudited: a reused, expired or unknown join token, a
// wrong secret, a malformed token and malformed requests are each refused
// with a clear error and leave an audit event naming the token id — never
// the secret.
func TestAttackJoinRefusalsAudited(t *testing.T) {
	t.Parallel()
	h := startHubArgs(t, 0)
	edgeBin := filepath.Join(binDir, "tether-edge")
	join := func(js, name string) (string, int) {
		_, errOut, code := runCmd(t, 30*time.Second, edgeBin, "join", js, "--name", name,
			"--state-dir", filepath.Join(t.TempDir(), name))
		return errOut, code
	}
	once := h.token("--uses", "1")
	if out, code := join(once, "first"); code != 0 {
		t.Fatalf("first join: %d %s", code, out)
	}
	short := h.token("--ttl", "1s", "--uses", "5")
	time.Sleep(1500 * time.Millisecond)
	parsed, err := pki.ParseJoinString(once)
	if err != nil {
		t.Fatal(err)
	}
	id, secret, _ := strings.Cut(parsed.Token, ".")
	unknown := strings.Replace(once, id+".", "zzzzzzzz.", 1)
	wrongSecret := strings.Replace(once, "."+secret, "."+strings.Repeat("a", 32), 1)
	shortID := strings.Split(strings.TrimPrefix(short, "tether://"), ".")[0]

	cases := []struct {
		name, js, node, stderr, auditResult, auditDetail string
	}{
		{"reused", once, "n-reused", "no uses left", "refused", "token " + id + ": join token has no uses left"},
		{"expired", short, "n-expired", "expired", "refused", "token " + shortID + ": join token expired"},
		{"unknown", unknown, "n-unknown", "unknown", "refused", "token zzzzzzzz: join token unknown"},
		{"wrong secret", wrongSecret, "n-wrong", "unknown", "refused", "token " + id + ": join token unknown"},
	}
	for _, tc := range cases {
		errOut, code := join(tc.js, tc.node)
		if code == 0 || !strings.Contains(errOut, tc.stderr) {
			t.Errorf("join with a %s token: exit %d, %q; want %q", tc.name, code, errOut, tc.stderr)
		}
	}
	// Refused by the agent before anything reaches the hub (no audit
	// event to look for): a wrong CA pin and a string that is no join
	// string. And a second node may not take an existing name.
	for _, tc := range []struct{ name, js, node, stderr string }{
		{"wrong pin", once[:len(once)-8] + "00000000", "n-pin", "pin"},
		{"garbage", "hello", "n-garbage", "invalid join string"},
		{"duplicate name", h.token("--uses", "5"), "first", "already registered"},
	} {
		if errOut, code := join(tc.js, tc.node); code == 0 || !strings.Contains(errOut, tc.stderr) {
			t.Errorf("join with %s: exit %d, %q; want %q", tc.name, code, errOut, tc.stderr)
		}
	}

	// What tether-edge would never send: post it by hand.
	tc, _ := pki.PinnedTLSConfig(parsed.CAPin, nil)
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	defer hc.CloseIdleConnections()
	key, _ := pki.GenerateKey()
	csr, _ := pki.NewCSR(key, "x")
	body := func(r control.JoinRequest) string { b, _ := json.Marshal(r); return string(b) }
	raw := []struct {
		name, body, node string
		status           int
		want             string
	}{
		{"malformed token", body(control.JoinRequest{Token: "not-a-token", Name: "n-malformed", CSR: csr}),
			"n-malformed", 403, "malformed join token"},
		{"garbage body", "\x00\x01garbage", "", 400, "invalid request body"},
		{"unknown field", `{"token":"x","admin":true}`, "", 400, "unknown field"},
		{"oversized body", `{"token":"` + strings.Repeat("a", 1<<20) + `"}`, "", 400, "too large"},
	}
	for _, r := range raw {
		resp, err := hc.Post("https://"+parsed.Addrs[0]+control.JoinPath, "application/json", strings.NewReader(r.body))
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var e control.ErrorResponse
		if json.Unmarshal(b, &e) != nil || resp.StatusCode != r.status || !strings.Contains(e.Error, r.want) {
			t.Errorf("%s: %d %s; want %d with %q", r.name, resp.StatusCode, b, r.status, r.want)
		}
		cases = append(cases, struct{ name, js, node, stderr, auditResult, auditDetail string }{
			r.name, "", r.node, "", map[int]string{400: "bad_request", 403: "refused"}[r.status], r.want})
	}

	events := h.audit("--since", "1h")
	for _, tc := range cases {
		found := false
		for _, e := range events {
			if e.Kind == "join" && e.Result == tc.auditResult && e.Node == tc.node &&
				strings.Contains(e.Detail, tc.auditDetail) {
				found = true
			}
		}
		if !found {
			t.Errorf("no audit event for the %s join (want result %q, detail %q)", tc.name, tc.auditResult, tc.auditDetail)
		}
	}
	for _, e := range events {
		if strings.Contains(e.Detail, secret) {
			t.Errorf("audit event holds the token secret: %+v", e)
		}
	}
	if t.Failed() {
		t.Logf("audit: %+v", events)
	}
	if n := len(h.nodes()); n != 1 {
		t.Fatalf("%d nodes registered, want 1", n)
	}
}
