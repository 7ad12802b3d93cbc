package hub

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	hubop "github.com/tether-dev/tether/hub/operator"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// loginWithCSR runs `tether login` for operator against s, asking for an API
// client certificate, and returns the hub's answer with the certificate's
// key (PEM).
func loginWithCSR(t *testing.T, s *Server, operator string, key ed25519.PrivateKey) (apitype.LoginResponse, []byte) {
	t.Helper()
	pool := x509.NewCertPool()
	pool.AddCert(s.ca.Certificate())
	c := apiclient.NewClientTLS(hubAddr(t, s),
		&tls.Config{MinVersion: tls.VersionTLS13, ServerName: pki.HubServerName, RootCAs: pool})
	defer c.Close()
	ctx := context.Background()
	ch, err := c.LoginChallenge(ctx, operator)
	if err != nil {
		t.Fatal(err)
	}
	certKey, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(certKey, operator)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := gossh.NewSignerFromKey(key)
	if err != nil {
		t.Fatal(err)
	}
	sig, err := signer.Sign(rand.Reader, hubop.AdminLoginPayload(operator, ch.Nonce, csr))
	if err != nil {
		t.Fatal(err)
	}
	resp, err := c.Login(ctx, apitype.LoginRequest{Operator: operator, Nonce: ch.Nonce,
		SignatureFormat: sig.Format, Signature: sig.Blob, AdminCSR: csr})
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := pki.EncodeKey(certKey)
	if err != nil {
		t.Fatal(err)
	}
	return resp, keyPEM
}

// operatorClient logs operator in and returns an API client with the API
// identity the login gave them.
func operatorClient(t *testing.T, s *Server, operator string, key ed25519.PrivateKey) *apiclient.Client {
	t.Helper()
	resp, keyPEM := loginWithCSR(t, s, operator, key)
	if resp.APICert == "" || resp.AdminCert != "" {
		t.Fatalf("login of %s: api cert %t, admin cert %t; want an API certificate only", operator,
			resp.APICert != "", resp.AdminCert != "")
	}
	dir := filepath.Join(t.TempDir(), operator)
	writeIdentity(t, dir, []byte(resp.APICert), keyPEM, pki.EncodeCerts(s.ca.Certificate()))
	c, err := apiclient.NewClient(hubAddr(t, s), dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return c
}

func names(nodes []apitype.Node) []string {
	var out []string
	for _, n := range nodes {
		out = append(out, n.Name)
	}
	slices.Sort(out)
	return out
}

func wantStatus(t *testing.T, what string, err error, status int) {
	t.Helper()
	var ae *apitype.Error
	if !errors.As(err, &ae) || ae.Status != status {
		t.Fatalf("%s: %v; want HTTP %d", what, err, status)
	}
}

// TestOperatorsListTheirNodes: an operator's API identity from `tether
// login` and an API token list only the nodes their role selects (env=dev
// here); both get 403 on an admin endpoint, a bad token 401. Labels a node
// reports about itself (env=dev from a prod node) select nothing.
func TestOperatorsListTheirNodes(t *testing.T) {
	s, c := testHub(t)
	ctx := context.Background()
	for _, name := range []string{"dev-1", "dev-2", "prod-1"} {
		joinNode(t, c, name)
	}
	if _, err := c.LabelNodes(ctx, apitype.NodeLabelRequest{
		Nodes: []string{"dev-1", "dev-2"}, Set: map[string]string{"env": "dev"},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.LabelNodes(ctx, apitype.NodeLabelRequest{
		Nodes: []string{"prod-1"}, Set: map[string]string{"env": "prod"},
	}); err != nil {
		t.Fatal(err)
	}
	prod, err := s.store.GetNodeByName(ctx, "prod-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.store.SetReportedLabels(ctx, prod.ID, map[string]string{"env": "dev"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c.PutRole(ctx, "dev-ops", apitype.RolePutRequest{
		Nodes: "env=dev", Logins: []string{"root"},
	}); err != nil {
		t.Fatal(err)
	}
	aliceKey := addOperator(t, c, "alice", "dev-ops")
	alice := operatorClient(t, s, "alice", aliceKey)
	tok, err := c.CreateAPIToken(ctx, apitype.APITokenCreateRequest{Role: "dev-ops"})
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	if err := os.WriteFile(caFile, pki.EncodeCerts(s.ca.Certificate()), 0o644); err != nil {
		t.Fatal(err)
	}
	token, err := apiclient.NewTokenClient(hubAddr(t, s), caFile, tok.Token)
	if err != nil {
		t.Fatal(err)
	}
	defer token.Close()
	bad, err := apiclient.NewTokenClient(hubAddr(t, s), caFile, apitype.APITokenPrefix+"nope.nope")
	if err != nil {
		t.Fatal(err)
	}
	defer bad.Close()

	for _, tc := range []struct {
		who  string
		c    *apiclient.Client
		want []string
	}{
		{"admin", c, []string{"dev-1", "dev-2", "prod-1"}},
		{"operator alice (dev-ops)", alice, []string{"dev-1", "dev-2"}},
		{"API token (dev-ops)", token, []string{"dev-1", "dev-2"}},
	} {
		nodes, err := tc.c.ListNodes(ctx)
		if err != nil {
			t.Fatalf("%s: list nodes: %v", tc.who, err)
		}
		if got := names(nodes); !slices.Equal(got, tc.want) {
			t.Errorf("%s sees %v, want %v", tc.who, got, tc.want)
		}
		if nodes, err = tc.c.ListNodesMatching(ctx, "env=prod"); err != nil || len(nodes) != len(tc.want)-2 {
			t.Errorf("%s: -l env=prod: %v, %v", tc.who, names(nodes), err)
		}
	}
	_, err = alice.ListOperators(ctx)
	wantStatus(t, "operator identity on an admin endpoint", err, http.StatusForbidden)
	_, err = alice.LabelNodes(ctx,
		apitype.NodeLabelRequest{Nodes: []string{"prod-1"}, Set: map[string]string{"env": "dev"}})
	wantStatus(t, "operator identity labelling a node", err, http.StatusForbidden)
	_, err = token.ListOperators(ctx)
	wantStatus(t, "API token on an admin endpoint", err, http.StatusForbidden)
	_, err = bad.ListOperators(ctx)
	wantStatus(t, "bad API token on an admin endpoint", err, http.StatusUnauthorized)
	_, err = bad.ListNodes(ctx)
	wantStatus(t, "bad API token listing nodes", err, http.StatusUnauthorized)

	// `tether ca revoke-admin` ends operators' API identities too; a new
	// login works again.
	if _, err := c.RevokeAdmin(ctx); err != nil {
		t.Fatal(err)
	}
	_, err = alice.ListNodes(ctx)
	wantStatus(t, "operator identity after revoke-admin", err, http.StatusForbidden)
	if !strings.Contains(err.Error(), "revoke-admin") {
		t.Fatalf("refusal after revoke-admin does not say why: %v", err)
	}
	c, err = apiclient.NewLocalClient(s.cfg.DataDir)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	alice = operatorClient(t, s, "alice", aliceKey)
	if _, err := alice.ListNodes(ctx); err != nil {
		t.Fatalf("after a new login: %v", err)
	}

	// Removing the operator ends their API identity at the next request.
	if err := c.RemoveOperator(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	nodes, err := alice.ListNodes(ctx)
	if err == nil || !strings.Contains(err.Error(), `operator "alice" is no longer registered`) {
		t.Fatalf("removed operator lists %v (%v); want a refusal that says why", names(nodes), err)
	}
	wantStatus(t, "removed operator listing nodes", err, http.StatusForbidden)
}

// TestNodeLabelsTakeEffectAtOnce: `tether nodes label` changes a node's
// hub-set labels durably and audited, an operator whose role selects the new
// label may jump there at once, and the connected node is pushed the
// operator's key without reconnecting. Its reported labels are stored apart
// and give nobody anything.
func TestNodeLabelsTakeEffectAtOnce(t *testing.T) {
	s, c := testHub(t)
	ctx := context.Background()
	id := joinNode(t, c, "n1")
	if _, err := c.PutRole(ctx, "dev-ops", apitype.RolePutRequest{
		Nodes: "env=dev", Logins: []string{"root"},
	}); err != nil {
		t.Fatal(err)
	}
	bobKey := addOperator(t, c, "bob", "dev-ops")
	bobPub, err := gossh.NewPublicKey(bobKey.Public())
	if err != nil {
		t.Fatal(err)
	}
	bobLine := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(bobPub)))

	sess := dialAs(t, id, tunnel.TransportTCP)
	ctrl, err := sess.OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	h := hello("n1")
	h.Hello.Labels = map[string]string{"env": "dev", "rack": "r7"} // the node claims env=dev
	if err := control.Write(ctrl, h); err != nil {
		t.Fatal(err)
	}
	// keysHaveBob reads control messages until an authorized-keys message
	// arrives and reports whether it holds bob's key.
	keysHaveBob := func() bool {
		t.Helper()
		for {
			_ = ctrl.SetReadDeadline(time.Now().Add(10 * time.Second))
			m, err := control.Read(ctrl)
			if err != nil {
				t.Fatalf("reading pushes: %v", err)
			}
			if m.Type == control.TypeAuthorizedKeys {
				return slices.ContainsFunc(m.AuthorizedKeys, func(k string) bool { return strings.Contains(k, bobLine) })
			}
		}
	}
	if keysHaveBob() {
		t.Fatal("a node's own env=dev label gave operator bob its keys")
	}
	n, err := s.store.GetNodeByName(ctx, "n1")
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(n.ReportedLabels, map[string]string{"env": "dev", "rack": "r7"}) || n.Labels["env"] != "" {
		t.Fatalf("labels %v, reported %v: want the report stored apart", n.Labels, n.ReportedLabels)
	}
	if err := s.door.AuthorizeJump("bob", n); err == nil {
		t.Fatal("bob may jump to n1 on its reported labels")
	}

	for _, bad := range []apitype.NodeLabelRequest{
		{Nodes: []string{"n1"}, Set: map[string]string{"Env": "dev"}},
		{Nodes: []string{"n1"}, Set: map[string]string{"env": "a b"}},
		{Nodes: []string{"n1"}},
		{Nodes: []string{"n1"}, Selector: "env=dev", Set: map[string]string{"a": "b"}},
		{Nodes: []string{"ghost"}, Set: map[string]string{"a": "b"}},
	} {
		if _, err := c.LabelNodes(ctx, bad); err == nil {
			t.Errorf("LabelNodes(%+v) accepted", bad)
		}
	}
	changed, err := c.LabelNodes(ctx, apitype.NodeLabelRequest{Selector: "*", Set: map[string]string{"env": "dev"}})
	if err != nil || len(changed) != 1 || changed[0].Labels["env"] != "dev" {
		t.Fatalf("label n1 env=dev: %v %v", changed, err)
	}
	if !keysHaveBob() {
		t.Fatal("after `nodes label n1 env=dev` the live node was not pushed bob's key")
	}
	if n, err = s.store.GetNodeByName(ctx, "n1"); err != nil || s.door.AuthorizeJump("bob", n) != nil {
		t.Fatalf("bob may not jump to n1 after the label change: %v", err)
	}
	if _, err := c.LabelNodes(ctx, apitype.NodeLabelRequest{Nodes: []string{"n1"}, Remove: []string{"env"}}); err != nil {
		t.Fatal(err)
	}
	if keysHaveBob() {
		t.Fatal("after `nodes label n1 env-` the live node still has bob's key")
	}
	events, err := c.ListAudit(ctx, apiclient.AuditQuery{Node: "n1"})
	if err != nil {
		t.Fatal(err)
	}
	var details []string
	for _, e := range events {
		if e.Kind == "node_label" {
			details = append(details, e.Detail)
		}
	}
	if len(details) != 2 || !slices.ContainsFunc(details,
		func(d string) bool { return strings.Contains(d, "labels env=dev (were none)") }) {
		t.Fatalf("audit of label changes: %q", details)
	}
}
