package hub

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/ratelimit"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// TestAttackOnboardingCredentialOnlyOnboards is the SECURITY.md row for
// onboarding credentials: the credential (an on-site person's, so the
// likeliest to leak) creates one node per machine through the onboarding
// endpoint and does nothing else. As a bearer token, as an API token, as a
// join token, or as an SSH password at the bastion it is refused; it
// cannot list nodes, run jobs, read the audit log, mint credentials or
// tokens, add profiles, or jump; and a second machine claiming an
// onboarded machine's UUID is refused and audited.
func TestAttackOnboardingCredentialOnlyOnboards(t *testing.T) {
	s, c := testHub(t)
	ctx := context.Background()
	if _, err := c.AddOSProfile(ctx, apitype.OSProfileAddRequest{
		Name: "debian-12", Distro: "debian", Version: "12",
	}); err != nil {
		t.Fatal(err)
	}
	created, err := c.CreateOnboarding(ctx, apitype.OnboardingCreateRequest{
		Name: "berlin", Role: "onboarder", Uses: 50, TTLSeconds: 3600, Labels: map[string]string{"site": "berlin"},
	})
	if err != nil {
		t.Fatal(err)
	}
	cred := created.Credential
	tok, err := c.CreateToken(ctx, apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	js, hc, csr := joinerClient(t, tok.JoinString, "m1")
	if created.CAPin != js.CAPin {
		t.Fatalf("credential's CA pin %s, join string's %s", created.CAPin, js.CAPin)
	}
	base := "https://" + js.Addrs[0]
	do := func(method, path, auth, body string) (int, string) {
		t.Helper()
		req, _ := http.NewRequest(method, base+path, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		if auth != "" {
			req.Header.Set("Authorization", auth)
		}
		resp, err := hc.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	onboard := func(uuid string, csr []byte) (int, string) {
		b, _ := json.Marshal(onboardproto.Request{Credential: cred, Name: "m1", CSR: csr,
			Facts:   control.Facts{Hostname: "m1", OSID: "debian", OSVersion: "12", Arch: "amd64"},
			Machine: onboardproto.MachineFacts{UUID: uuid, UUIDSource: "test"}})
		return do("POST", onboardproto.Path, "", string(b))
	}

	// What it is for: one node for this machine.
	if status, body := onboard("machine-0001", csr); status != 200 {
		t.Fatalf("onboarding: %d %s", status, body)
	}

	// Everything else it is refused.
	for _, ep := range []struct{ method, path, body string }{
		{"GET", "/v1/nodes", ""}, {"POST", "/v1/jobs", `{"kind":"script","script":"id"}`}, {"GET", "/v1/jobs", ""},
		{"GET", "/v1/audit", ""}, {"POST", "/v1/tokens", `{"ttl_seconds":60,"uses":1}`}, {"GET", "/v1/onboarding", ""},
		{"POST", "/v1/onboarding", `{"name":"more","uses":1000,"ttl_seconds":60}`},
		{"POST", "/v1/osprofiles", `{"name":"x","distro":"x","version":"1"}`},
		{"DELETE", "/v1/nodes/m1", ""}, {"POST", "/v1/apitokens", `{"role":"all"}`}, {"POST", "/v1/operators", `{}`},
		{"POST", "/v1/blobs", ""}, {"GET", "/v1/cluster", ""},
	} {
		for _, auth := range []string{"Bearer " + cred, "Bearer " + apitype.APITokenPrefix + cred} {
			if status, body := do(ep.method, ep.path, auth, ep.body); status != 401 && status != 403 {
				t.Errorf("%s %s with %.20s…: %d %s, want 401/403", ep.method, ep.path, auth, status, body)
			}
		}
	}
	_, _, otherCSR := joinerClient(t, tok.JoinString, "m2")
	b, _ := json.Marshal(control.JoinRequest{Token: cred, Name: "m2", CSR: otherCSR})
	if status, body := do("POST", control.JoinPath, "", string(b)); status != 403 {
		t.Errorf("credential as a join token: %d %s", status, body)
	}

	// Nor does it open the bastion, as a password for any user.
	var info apitype.HubInfo
	if b, err := os.ReadFile(filepath.Join(s.cfg.DataDir, apitype.HubInfoFile)); err != nil ||
		json.Unmarshal(b, &info) != nil {
		t.Fatal(err)
	}
	for _, user := range []string{"berlin", "onboarder", "m1", "root"} {
		cl, err := gossh.Dial("tcp", info.SSH, &gossh.ClientConfig{User: user, Timeout: 10 * time.Second,
			Auth: []gossh.AuthMethod{
				gossh.Password(cred),
				gossh.KeyboardInteractive(func(string, string, []string, []bool) ([]string, error) {
					return []string{cred}, nil
				}),
			},
			HostKeyCallback: gossh.InsecureIgnoreHostKey()}) // the refusal is what is tested, not the host
		if err == nil {
			cl.Close()
			t.Fatalf("bastion accepted the onboarding credential as user %s", user)
		}
	}

	// One node per machine: a second machine with the first one's UUID
	// is refused and audited; the first machine's retry finds its node.
	if status, body := onboard("machine-0001", otherCSR); status != 409 {
		t.Fatalf("second machine with the same UUID: %d %s", status, body)
	}
	waitAudit(t, c, "duplicate machine refusal", func(e apitype.AuditEvent) bool {
		return e.Kind == "onboard" && e.Result == "refused" && strings.Contains(e.Detail, "reason=duplicate_machine")
	})
	if status, body := onboard("machine-0001", csr); status != 200 || !strings.Contains(body, `"existing":true`) {
		t.Fatalf("retry: %d %s", status, body)
	}
	nodes, err := c.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) != 1 || nodes[0].Labels["site"] != "berlin" {
		t.Fatalf("nodes after the attacks: %+v", nodes)
	}
	creds, err := c.ListOnboarding(ctx)
	if err != nil || len(creds) != 1 || creds[0].UsesLeft != 49 {
		t.Fatalf("credentials after the attacks: %+v %v", creds, err)
	}

	// The CA endpoint answers anyone, with the pin the admin hands over.
	resp, err := hc.Get(base + onboardproto.CAPath)
	if err != nil {
		t.Fatal(err)
	}
	pem, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if certs, err := pki.ParseCerts(pem); err != nil || pki.Fingerprint(certs[0]) != created.CAPin {
		t.Fatalf("CA endpoint: %v", err)
	}
}

// TestOnboardingRateLimitedAndAudited: failed onboarding attempts count
// against their source like failed joins (429 with Retry-After once the
// burst is spent), each refusal is audited once, by the onboarding handler
// with its reason; and the admin's changes are audited.
func TestOnboardingRateLimitedAndAudited(t *testing.T) {
	_, c := testHub(t)
	ctx := context.Background()
	created, err := c.CreateOnboarding(ctx, apitype.OnboardingCreateRequest{Name: "site", Uses: 1, TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.RevokeOnboarding(ctx, "site"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.AddOSProfile(ctx, apitype.OSProfileAddRequest{
		Name: "debian-12", Distro: "debian", Version: "12",
	}); err != nil {
		t.Fatal(err)
	}
	if err := c.RemoveOSProfile(ctx, "debian-12"); err != nil {
		t.Fatal(err)
	}
	tok, err := c.CreateToken(ctx, apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	js, hc, csr := joinerClient(t, tok.JoinString, "m1")
	body, _ := json.Marshal(onboardproto.Request{Credential: created.Credential, CSR: csr, Name: "m1",
		Machine: onboardproto.MachineFacts{UUID: "machine-0001"}})
	limited := false
	for range 3 * ratelimit.JoinFailBurst {
		resp, err := hc.Post("https://"+js.Addrs[0]+onboardproto.Path, "application/json", strings.NewReader(string(body)))
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode == http.StatusTooManyRequests {
			if resp.Header.Get("Retry-After") == "" {
				t.Fatal("429 without Retry-After")
			}
			limited = true
			break
		}
		if resp.StatusCode != http.StatusForbidden {
			t.Fatalf("revoked credential: %d", resp.StatusCode)
		}
	}
	if !limited {
		t.Fatalf("%d failed onboarding attempts from one source, never 429", 3*ratelimit.JoinFailBurst)
	}
	evs, err := c.ListAudit(ctx, apiclient.AuditQuery{})
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]int{}
	for _, e := range evs {
		kinds[e.Kind+" "+e.Result]++
		if e.Kind == "onboard" && e.Result == "refused" &&
			!strings.Contains(e.Detail, "reason=revoked credential "+created.ID) {
			t.Errorf("onboard audit %+v", e)
		}
		if strings.Contains(e.Detail, strings.SplitN(created.Credential, ".", 2)[1]) {
			t.Errorf("audit carries the secret: %+v", e)
		}
	}
	for _, k := range []string{
		"onboarding_create ok", "onboarding_revoke ok", "osprofile_add ok", "osprofile_remove ok", "onboard rate_limited",
	} {
		if kinds[k] != 1 {
			t.Errorf("%d %q audit events, want 1", kinds[k], k)
		}
	}
	if kinds["onboard refused"] < ratelimit.JoinFailBurst || kinds["join refused"]+kinds["join bad_request"] != 0 {
		t.Errorf("audit events %v: want one onboard refusal per refused attempt, by the onboarding handler only", kinds)
	}
}

// TestOnboardedMachineConnects: what the onboarding answer writes (its
// user-data's files under the agent's state dir) plus the key the machine
// made is an identity the agent loads and the hub accepts: the node
// connects under its name.
func TestOnboardedMachineConnects(t *testing.T) {
	_, c := testHub(t)
	ctx := context.Background()
	if _, err := c.AddOSProfile(ctx, apitype.OSProfileAddRequest{
		Name: "debian-12", Distro: "debian", Version: "12",
	}); err != nil {
		t.Fatal(err)
	}
	created, err := c.CreateOnboarding(ctx, apitype.OnboardingCreateRequest{Name: "site", Uses: 1, TTLSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	tok, err := c.CreateToken(ctx, apitype.TokenCreateRequest{TTLSeconds: 60, Uses: 1})
	if err != nil {
		t.Fatal(err)
	}
	js, hc, _ := joinerClient(t, tok.JoinString, "x")
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, "shop-1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := json.Marshal(onboardproto.Request{Credential: created.Credential, CSR: csr,
		Facts:   control.Facts{Hostname: "Shop-1.berlin.example", OSID: "debian", OSVersion: "12"},
		Machine: onboardproto.MachineFacts{UUID: "machine-0001"}})
	resp, err := hc.Post("https://"+js.Addrs[0]+onboardproto.Path, "application/json", strings.NewReader(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	var out onboardproto.Response
	err = json.NewDecoder(resp.Body).Decode(&out)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || out.Name != "shop-1" {
		t.Fatalf("onboard: %d %+v %v", resp.StatusCode, out, err)
	}
	ud, err := onboardproto.ParseUserData(out.UserData)
	if err != nil {
		t.Fatal(err)
	}
	// Apply the state dir's files into a temporary one, as the onboarding
	// CLI does with --state-dir; the key is the machine's own.
	dir := t.TempDir()
	keyPEM, err := pki.EncodeKey(key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "node.key"), keyPEM, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range ud.WriteFiles {
		rel, ok := strings.CutPrefix(f.Path, "/var/lib/tether-edge/")
		if !ok {
			continue
		}
		data, _ := f.Bytes()
		mode, _ := f.Mode()
		if err := os.WriteFile(filepath.Join(dir, rel), data, mode); err != nil {
			t.Fatal(err)
		}
	}
	id, err := edge.LoadIdentity(dir)
	if err != nil {
		t.Fatalf("the agent cannot load what onboarding wrote: %v", err)
	}
	if id.Config.NodeID != out.NodeID || id.Config.Name != "shop-1" {
		t.Fatalf("identity %+v", id.Config)
	}
	sess := dialAs(t, id, tunnel.TransportTCP)
	ctrl, m := connectAs(t, sess, "shop-1")
	defer ctrl.Close()
	if m.Type == control.TypeNotice {
		t.Fatalf("hub refused the onboarded node: %+v", m.Notice)
	}
	waitFor(t, "node online", func() bool {
		nodes, err := c.ListNodes(ctx)
		return err == nil && len(nodes) == 1 && nodes[0].Online
	})
}
