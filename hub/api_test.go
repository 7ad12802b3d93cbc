package hub

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
)

// TestJoinEndpointRejects posts malformed join requests over real TLS (the
// agent's pinned config, no client certificate): each gets a 4xx with a JSON
// error that says what was wrong, and none consumes the token.
func TestJoinEndpointRejects(t *testing.T) {
	s, c := testHub(t)
	tok, err := c.CreateToken(context.Background(), apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	js, hc, csr := joinerClient(t, tok.JoinString, "n1")
	valid := func() control.JoinRequest { return control.JoinRequest{Token: js.Token, Name: "n1", CSR: csr} }
	marshal := func(r control.JoinRequest) string { b, _ := json.Marshal(r); return string(b) }
	cases := []struct {
		name, body string
		status     int
		want       string
	}{
		{"not json", "hello", 400, "invalid request body"},
		{"unknown field", `{"token":"x","admin":true}`, 400, "unknown field"},
		{"too large", `{"token":"` + strings.Repeat("a", 70<<10) + `"}`, 400, "too large"},
		{"no csr", marshal(control.JoinRequest{Token: js.Token, Name: "n1"}), 400, "csr"},
		{"bad csr", marshal(func() control.JoinRequest { r := valid(); r.CSR = []byte("junk"); return r }()), 400,
			"invalid CSR"},
		{"bad name", marshal(func() control.JoinRequest { r := valid(); r.Name = "127.0.0.1"; return r }()), 400,
			"invalid name"},
		{"malformed token", marshal(func() control.JoinRequest { r := valid(); r.Token = "abc"; return r }()), 403,
			"malformed join token"},
		{"reserved name", marshal(func() control.JoinRequest { r := valid(); r.Name = "tether-hub"; return r }()),
			400, "reserved"},
		// A site hub named like the hub's node suffix would have its host
		// CA trusted for every NODE.tether by `tether config ssh`.
		{"site named as the suffix", marshal(func() control.JoinRequest {
			r := valid()
			r.Name, r.Kind = "tether", control.JoinSite
			return r
		}()), 400, "node suffix"},
	}
	// Names the bastion calls "an address" and would never forward to: a
	// node under one would get a host certificate and be unreachable.
	for name, is := range map[string]string{
		"localhost": "a loopback or local host name", "ip6-localhost": "a loopback or local host name",
		"0x7f000001": "an IPv4 address or a number", "127-0-0-1": "an IPv4 address written with dashes", "1e3": "a number",
	} {
		cases = append(cases, struct {
			name, body string
			status     int
			want       string
		}{"address " + name, marshal(func() control.JoinRequest { r := valid(); r.Name = name; return r }()), 400,
			`invalid name "` + name + `": it reads as ` + is})
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := hc.Post("https://"+js.Addrs[0]+control.JoinPath, "application/json", bytes.NewBufferString(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			var e control.ErrorResponse
			b, _ := io.ReadAll(resp.Body)
			if err := json.Unmarshal(b, &e); err != nil || resp.StatusCode != tc.status || !strings.Contains(e.Error, tc.want) {
				t.Fatalf("status %d body %s; want %d containing %q", resp.StatusCode, b, tc.status, tc.want)
			}
		})
	}
	// An unknown operator name is answered like any other (see
	// TestLoginChallengeTellsNoNames).
	if ch, err := c.LoginChallenge(context.Background(), "nobody"); err != nil || ch.Nonce == "" {
		t.Fatalf("login challenge for an unknown operator: %+v %v", ch, err)
	}
	toks, _ := s.store.ListTokens(context.Background())
	if len(toks) != 1 || toks[0].UsesLeft != 1 {
		t.Fatalf("tokens after rejected joins: %+v", toks)
	}
}

// TestAdminEndpointsNeedAdmin: no certificate, or a node's certificate, is
// refused on every admin endpoint.
func TestAdminEndpointsNeedAdmin(t *testing.T) {
	s, c := testHub(t)
	node := joinNode(t, c, "n1")
	addr := node.Config.Hubs[0]
	caPEM, _ := os.ReadFile(filepath.Join(s.cfg.DataDir, "ca", "ca.crt"))
	cas, _ := pki.ParseCerts(caPEM)
	noCert := pki.ClientTLSConfig(tls.Certificate{}, cas[0])
	noCert.Certificates = nil
	for name, cfg := range map[string]*tls.Config{
		"no certificate": noCert, "node certificate": pki.ClientTLSConfig(node.Cert, cas[0]),
	} {
		hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}}
		for _, ep := range []struct{ method, path string }{
			{"GET", "/v1/nodes"}, {"POST", "/v1/tokens"}, {"GET", "/v1/tokens"}, {"DELETE", "/v1/nodes/n1"},
			{"POST", "/v1/operators"}, {"GET", "/v1/operators"}, {"DELETE", "/v1/operators/x"}, {"DELETE", "/v1/tokens/x"},
		} {
			req, _ := http.NewRequest(ep.method, "https://"+addr+ep.path, strings.NewReader("{}"))
			resp, err := hc.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s: %s %s = %d, want 401/403", name, ep.method, ep.path, resp.StatusCode)
			}
		}
		hc.CloseIdleConnections()
	}
	if _, err := s.store.GetNodeByName(context.Background(), "n1"); err != nil {
		t.Fatalf("node deleted by an unauthorized request: %v", err)
	}
}

// joinerClient is what a joining agent has before its first request: the
// parsed join string, an HTTP client that trusts only the pinned hub CA (no
// client certificate), and a CSR for name. For requests tether-edge would
// never send.
func joinerClient(t *testing.T, joinString, name string) (pki.JoinString, *http.Client, []byte) {
	t.Helper()
	js, err := pki.ParseJoinString(joinString)
	if err != nil {
		t.Fatal(err)
	}
	tc, err := pki.PinnedTLSConfig(js.CAPin, nil)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	t.Cleanup(hc.CloseIdleConnections)
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, name)
	if err != nil {
		t.Fatal(err)
	}
	return js, hc, csr
}
