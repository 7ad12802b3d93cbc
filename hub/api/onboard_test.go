package api

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/json"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// onboardEnv is the onboarding endpoint over a real store and CA.
type onboardEnv struct {
	t   *testing.T
	st  *store.DB
	srv *httptest.Server
}

func newOnboardEnv(t *testing.T) *onboardEnv {
	t.Helper()
	dir := t.TempDir()
	st, err := store.OpenSQLite(context.Background(), filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	c, err := ca.LoadOrCreate(filepath.Join(dir, "ca"), "test")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(
		_ context.Context, csr []byte, id pki.Identity, cn string, ttl time.Duration,
	) ([]*x509.Certificate, error) {
		cert, err := c.SignCSR(csr, id, cn, ttl)
		if err != nil {
			return nil, err
		}
		return []*x509.Certificate{cert}, nil
	}
	h := NewHandler(Deps{Store: st, CA: c, IssueNode: issue, NodeCA: c.Certificate(), NodeCertTTL: time.Hour,
		Advertise: []string{"hub.example:7443"}, ReservedNames: []string{"tether-hub"}})
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return &onboardEnv{t: t, st: st, srv: srv}
}

// credential stores an onboarding credential and returns ID.SECRET.
func (e *onboardEnv) credential(name string, uses int, ttl time.Duration, labels map[string]string) string {
	e.t.Helper()
	id, secret, _ := pki.NewToken()
	now := time.Now()
	if err := e.st.CreateOnboardingCredential(context.Background(), store.OnboardingCredential{
		ID:         id,
		Name:       name,
		SecretHash: pki.HashSecret(secret),
		Role:       "onboarder",
		Labels:     labels,
		Uses:       uses,
		UsesLeft:   uses,
		ExpiresAt:  now.Add(ttl),
		CreatedAt:  now,
	}); err != nil {
		e.t.Fatal(err)
	}
	return id + "." + secret
}

func (e *onboardEnv) profile(p store.OSProfile) {
	e.t.Helper()
	if err := e.st.AddOSProfile(context.Background(), p); err != nil {
		e.t.Fatal(err)
	}
}

// machine is a machine in the field: its UUID and key.
type machine struct {
	uuid string
	csr  []byte
}

func newMachine(t *testing.T, uuid string) machine {
	t.Helper()
	key, err := pki.GenerateKey()
	if err != nil {
		t.Fatal(err)
	}
	csr, err := pki.NewCSR(key, "m")
	if err != nil {
		t.Fatal(err)
	}
	return machine{uuid: uuid, csr: csr}
}

func (m machine) request(cred, name string) onboardproto.Request {
	return onboardproto.Request{Credential: cred, Name: name, CSR: m.csr, AgentVersion: "test",
		Facts:   control.Facts{Hostname: name, OS: "Debian GNU/Linux 12", OSID: "debian", OSVersion: "12", Arch: "amd64"},
		Machine: onboardproto.MachineFacts{UUID: m.uuid, UUIDSource: "/sys/class/dmi/id/product_uuid", OSIDLike: ""}}
}

func (e *onboardEnv) post(req any) (int, onboardproto.Response, string) {
	e.t.Helper()
	b, _ := json.Marshal(req)
	resp, err := http.Post(e.srv.URL+onboardproto.Path, "application/json", bytes.NewReader(b))
	if err != nil {
		e.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	var out onboardproto.Response
	if resp.StatusCode == http.StatusOK {
		if err := json.Unmarshal(body, &out); err != nil {
			e.t.Fatal(err)
		}
	}
	return resp.StatusCode, out, string(body)
}

func (e *onboardEnv) usesLeft(cred string) int {
	e.t.Helper()
	id, _, _ := strings.Cut(cred, ".")
	c, err := e.st.GetOnboardingCredential(context.Background(), id)
	if err != nil {
		e.t.Fatal(err)
	}
	return c.UsesLeft
}

// lastAudit is the newest onboarding audit event.
func (e *onboardEnv) lastAudit() store.AuditEvent {
	e.t.Helper()
	evs, err := e.st.ListAudit(context.Background(), store.AuditFilter{Limit: 1000})
	if err != nil {
		e.t.Fatal(err)
	}
	for i := len(evs) - 1; i >= 0; i-- {
		if evs[i].Kind == "onboard" {
			return evs[i]
		}
	}
	e.t.Fatal("no onboard audit event")
	return store.AuditEvent{}
}

func TestOnboardCreatesNodeWithUserData(t *testing.T) {
	e := newOnboardEnv(t)
	e.profile(store.OSProfile{Name: "debian-12", Distro: "debian", Version: "12"})
	cred := e.credential("berlin", 2, time.Hour, map[string]string{"site": "berlin"})
	m := newMachine(t, "4c4c4544-0042-3510-8052-b4c04f384d32")
	req := m.request(cred, "shop-1")
	req.Labels = map[string]string{"site": "paris", "rack": "r1"}
	status, resp, body := e.post(req)
	if status != http.StatusOK {
		t.Fatalf("status %d: %s", status, body)
	}
	if resp.Existing || resp.Name != "shop-1" || resp.Profile != "debian-12" || resp.MatchedBy != "version" {
		t.Fatalf("response %+v", resp)
	}
	n, err := e.st.GetNode(context.Background(), resp.NodeID)
	if err != nil {
		t.Fatal(err)
	}
	if !maps.Equal(n.Labels, map[string]string{"site": "berlin"}) {
		t.Fatalf("labels %v: want only the credential's (labels asked for on site are the node's word)", n.Labels)
	}
	if e.usesLeft(cred) != 1 {
		t.Fatalf("uses left %d, want 1", e.usesLeft(cred))
	}
	ud, err := onboardproto.ParseUserData(resp.UserData)
	if err != nil {
		t.Fatalf("user-data: %v\n%s", err, resp.UserData)
	}
	files := map[string]string{}
	for _, f := range ud.WriteFiles {
		b, _ := f.Bytes()
		files[f.Path] = string(b)
	}
	if files["/var/lib/tether-edge/node.crt"] != resp.Cert || files["/var/lib/tether-edge/ca.crt"] != resp.CA ||
		!strings.Contains(files["/etc/systemd/system/tether-edge.service"], "ExecStart=") ||
		!strings.Contains(files["/etc/tether/labels"], "site=paris") ||
		!strings.Contains(files["/etc/tether/labels"], "rack=r1") {
		t.Fatalf("user-data files %v", files)
	}
	if last := ud.WriteFiles[len(ud.WriteFiles)-1]; last.Path != "/var/lib/tether-edge/node.json" {
		t.Fatalf("last file %s, want node.json", last.Path)
	}
	var cfg struct {
		NodeID string   `json:"node_id"`
		Name   string   `json:"name"`
		Hubs   []string `json:"hubs"`
	}
	if err := json.Unmarshal([]byte(files["/var/lib/tether-edge/node.json"]), &cfg); err != nil ||
		cfg.NodeID != resp.NodeID || cfg.Name != "shop-1" || len(cfg.Hubs) != 1 {
		t.Fatalf("node.json %+v %v", cfg, err)
	}
	for path, content := range files {
		if strings.Contains(content, "PRIVATE KEY") || strings.Contains(content, cred) ||
			strings.Contains(resp.UserData, strings.SplitN(cred, ".", 2)[1]) {
			t.Fatalf("user-data file %s carries a secret", path)
		}
	}
	if got := strings.Join(ud.RunCmd[1], " "); got != "systemctl enable --now tether-edge" {
		t.Fatalf("runcmd %v", ud.RunCmd)
	}
	if a := e.lastAudit(); a.Result != "ok" || a.Node != "shop-1" {
		t.Fatalf("audit %+v", a)
	}
}

// A retry from the same machine (same UUID, same key) gets the same node
// back and spends no use, even when the credential has none left; the
// same UUID with another key is refused and audited.
func TestOnboardRetryAndDuplicateMachine(t *testing.T) {
	e := newOnboardEnv(t)
	e.profile(store.OSProfile{Name: "debian-12", Distro: "debian", Version: "12"})
	cred := e.credential("one", 1, time.Hour, nil)
	m := newMachine(t, "machine-0001")
	status, first, body := e.post(m.request(cred, "n1"))
	if status != http.StatusOK {
		t.Fatalf("first: %d %s", status, body)
	}
	status, again, body := e.post(m.request(cred, "another-name"))
	if status != http.StatusOK || !again.Existing || again.NodeID != first.NodeID || again.Name != "n1" {
		t.Fatalf("retry: %d %+v %s", status, again, body)
	}
	if e.usesLeft(cred) != 0 {
		t.Fatalf("uses left %d after a retry, want 0", e.usesLeft(cred))
	}
	nodes, _ := e.st.ListNodes(context.Background())
	if len(nodes) != 1 {
		t.Fatalf("%d nodes after a retry, want 1", len(nodes))
	}

	other := newMachine(t, "machine-0001") // same UUID, another key
	cred2 := e.credential("two", 5, time.Hour, nil)
	status, _, body = e.post(other.request(cred2, "n2"))
	if status != http.StatusConflict || !strings.Contains(body, "already node id "+first.NodeID) {
		t.Fatalf("duplicate UUID: %d %s", status, body)
	}
	if a := e.lastAudit(); a.Result != "refused" || !strings.Contains(a.Detail, "reason=duplicate_machine") ||
		!strings.Contains(a.Detail, "machine-0001") {
		t.Fatalf("audit %+v", a)
	}
	if e.usesLeft(cred2) != 5 {
		t.Fatalf("a refused duplicate spent a use: %d left", e.usesLeft(cred2))
	}
}

// Every refusal says its reason and is audited with it; none spends a use.
func TestOnboardRefusalReasons(t *testing.T) {
	e := newOnboardEnv(t)
	e.profile(store.OSProfile{Name: "debian-12", Distro: "debian", Version: "12"})
	ctx := context.Background()
	spent := e.credential("spent", 1, time.Hour, nil)
	if status, _, body := e.post(newMachine(t, "machine-spent-1").request(spent, "s1")); status != 200 {
		t.Fatalf("%d %s", status, body)
	}
	expired := e.credential("old", 3, -time.Minute, nil)
	revoked := e.credential("gone", 3, time.Hour, nil)
	if _, err := e.st.RevokeOnboardingCredential(ctx, "gone", time.Now()); err != nil {
		t.Fatal(err)
	}
	good := e.credential("good", 3, time.Hour, nil)
	wrongSecret := strings.SplitN(good, ".", 2)[0] + "." + strings.Repeat("a", 32)
	unknownID := "aaaaaaaa." + strings.SplitN(good, ".", 2)[1]
	m := newMachine(t, "machine-0002")
	cases := []struct {
		name   string
		req    onboardproto.Request
		status int
		reason string
		want   string
	}{
		{"exhausted", m.request(spent, "x1"), 403, "exhausted", "exhausted"},
		{"expired", m.request(expired, "x1"), 403, "expired", "expired"},
		{"revoked", m.request(revoked, "x1"), 403, "revoked", "revoked"},
		{"wrong secret", m.request(wrongSecret, "x1"), 403, "unknown", "unknown"},
		{"unknown id", m.request(unknownID, "x1"), 403, "unknown", "unknown"},
		{"malformed", m.request("nope", "x1"), 403, "unknown", "malformed credential"},
		{"bad csr", func() onboardproto.Request { r := m.request(good, "x1"); r.CSR = []byte("junk"); return r }(), 400,
			"invalid", "invalid CSR"},
		{"no uuid", func() onboardproto.Request { r := m.request(good, "x1"); r.Machine.UUID = ""; return r }(), 400,
			"invalid", "machine uuid"},
		{"reserved name", m.request(good, "tether-hub"), 400, "invalid", "reserved"},
		// A machine whose host name is localhost gets no node the bastion
		// would refuse to reach.
		{"address name", m.request(good, "localhost"), 400, "invalid", "reads as a loopback"},
		// Machines of one image share a host name: the refusal says how
		// each client names a node, bulk's inventory included.
		{"name taken", m.request(good, "s1"), 409, "name_taken", "taken by another machine; onboard it again under another " +
			"name: `tether-edge onboard --name NODE` on the machine, or with `tether onboard bulk`, name=NODE on its " +
			"inventory line or --name-pattern"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			status, _, body := e.post(tc.req)
			if status != tc.status || !strings.Contains(body, tc.want) {
				t.Fatalf("status %d %s; want %d containing %q", status, body, tc.status, tc.want)
			}
			if a := e.lastAudit(); a.Result != "refused" || !strings.Contains(a.Detail, "reason="+tc.reason) {
				t.Fatalf("audit %+v, want reason=%s", a, tc.reason)
			}
		})
	}
	if e.usesLeft(good) != 3 || e.usesLeft(expired) != 3 || e.usesLeft(revoked) != 3 {
		t.Fatal("a refused request spent a use")
	}
	nodes, _ := e.st.ListNodes(ctx)
	if len(nodes) != 1 {
		t.Fatalf("%d nodes, want only s1", len(nodes))
	}
}

// A machine with no distro+version profile falls back to its family
// (ID_LIKE); with neither, the error lists the profiles there are.
func TestOnboardProfileFallback(t *testing.T) {
	e := newOnboardEnv(t)
	e.profile(store.OSProfile{Name: "debian-12", Distro: "debian", Version: "12", Family: "debian"})
	e.profile(store.OSProfile{Name: "rocky-9", Distro: "rocky", Version: "9", Family: "rhel"})
	cred := e.credential("c", 10, time.Hour, nil)

	ubuntu := newMachine(t, "machine-ubuntu").request(cred, "u1")
	ubuntu.Facts.OSID, ubuntu.Facts.OSVersion, ubuntu.Machine.OSIDLike = "ubuntu", "24.04", "debian"
	status, resp, body := e.post(ubuntu)
	if status != 200 || resp.Profile != "debian-12" || resp.MatchedBy != "family" {
		t.Fatalf("ubuntu: %d %+v %s", status, resp, body)
	}

	alpine := newMachine(t, "machine-alpine").request(cred, "a1")
	alpine.Facts.OSID, alpine.Facts.OSVersion = "alpine", "3.20"
	status, _, body = e.post(alpine)
	if status != 404 || !strings.Contains(body, "debian-12 (debian 12, family debian)") ||
		!strings.Contains(body, "rocky-9 (rocky 9, family rhel)") ||
		!strings.Contains(body, "tether osprofile add NAME --distro alpine --version 3.20") {
		t.Fatalf("no profile: %d %s", status, body)
	}
	if a := e.lastAudit(); !strings.Contains(a.Detail, "reason=no_profile") {
		t.Fatalf("audit %+v", a)
	}
	if e.usesLeft(cred) != 9 {
		t.Fatalf("uses left %d, want 9", e.usesLeft(cred))
	}
}

// The CA endpoint serves the hub CA to anyone; its pin is what the on-site
// person compares.
func TestOnboardCA(t *testing.T) {
	e := newOnboardEnv(t)
	resp, err := http.Get(e.srv.URL + onboardproto.CAPath)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	certs, err := pki.ParseCerts(b)
	if err != nil || resp.StatusCode != 200 || pki.Fingerprint(certs[0]) != resp.Header.Get("X-Tether-CA-Pin") {
		t.Fatalf("%d %v %s", resp.StatusCode, err, b)
	}
}

// Concurrent requests of one machine (a CLI retrying while its first
// request is still under way) make one node and spend one use.
func TestOnboardConcurrentRetries(t *testing.T) {
	e := newOnboardEnv(t)
	e.profile(store.OSProfile{Name: "debian-12", Distro: "debian", Version: "12"})
	cred := e.credential("c", 10, time.Hour, nil)
	m := newMachine(t, "machine-concurrent")
	const n = 8
	type result struct {
		status int
		resp   onboardproto.Response
		body   string
	}
	results := make(chan result, n)
	for range n {
		go func() {
			b, _ := json.Marshal(m.request(cred, "c1"))
			resp, err := http.Post(e.srv.URL+onboardproto.Path, "application/json", bytes.NewReader(b))
			if err != nil {
				results <- result{body: err.Error()}
				return
			}
			defer resp.Body.Close()
			body, _ := io.ReadAll(resp.Body)
			var out onboardproto.Response
			_ = json.Unmarshal(body, &out)
			results <- result{resp.StatusCode, out, string(body)}
		}()
	}
	ids, created := map[string]bool{}, 0
	for range n {
		r := <-results
		if r.status != http.StatusOK {
			t.Fatalf("%d %s", r.status, r.body)
		}
		ids[r.resp.NodeID] = true
		if !r.resp.Existing {
			created++
		}
	}
	if len(ids) != 1 || created != 1 || e.usesLeft(cred) != 9 {
		t.Fatalf("%d node ids, %d created, %d uses left; want 1, 1, 9", len(ids), created, e.usesLeft(cred))
	}
}

// TestValidateOSProfile: a profile is refused, naming what is wrong,
// before it is stored; a template with it.
func TestValidateOSProfile(t *testing.T) {
	good := apitype.OSProfileAddRequest{Name: "debian-12", Distro: "debian", Version: "12", Family: "debian"}
	with := func(f func(*apitype.OSProfileAddRequest)) apitype.OSProfileAddRequest { r := good; f(&r); return r }
	for _, tc := range []struct {
		name string
		req  apitype.OSProfileAddRequest
		want string
	}{
		{"ok", good, ""},
		{
			"ok with a template",
			with(func(r *apitype.OSProfileAddRequest) { r.CloudInit = "#cloud-config\nruncmd:\n  - [true]\n" }),
			"",
		},
		{"bad name", with(func(r *apitype.OSProfileAddRequest) { r.Name = "Debian 12" }), "invalid name"},
		{"no distro", with(func(r *apitype.OSProfileAddRequest) { r.Distro = "" }), "--distro is required"},
		{"no version", with(func(r *apitype.OSProfileAddRequest) { r.Version = "" }), "--version is required"},
		{
			"odd version",
			with(func(r *apitype.OSProfileAddRequest) { r.Version = "12 bookworm" }),
			"want what os-release says",
		},
		{
			"template does not parse",
			with(func(r *apitype.OSProfileAddRequest) { r.CloudInit = "#cloud-config\n{{ if }}" }),
			"template:",
		},
		{
			"template names no such field",
			with(func(r *apitype.OSProfileAddRequest) { r.CloudInit = "#cloud-config\n# {{.Password}}\n" }),
			"can't evaluate field Password",
		},
		{
			"not cloud-config",
			with(func(r *apitype.OSProfileAddRequest) { r.CloudInit = "#!/bin/sh\ncurl x | sh\n" }),
			`first line must be "#cloud-config"`,
		},
		{
			"not YAML",
			with(func(r *apitype.OSProfileAddRequest) { r.CloudInit = "#cloud-config\nwrite_files: [\n" }),
			"user-data",
		},
		{
			"another module",
			with(func(r *apitype.OSProfileAddRequest) { r.CloudInit = "#cloud-config\nusers: [{name: x}]\n" }),
			"field users not found",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := validateOSProfile(tc.req)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) || statusOf(err) != http.StatusBadRequest {
				t.Fatalf("got %v (status %d), want 400 containing %q", err, statusOf(err), tc.want)
			}
		})
	}
}

// A body over onboardproto.MaxRequest, or one that is not the request,
// is refused before anything is read from the store, and audited.
func TestOnboardBodyBounded(t *testing.T) {
	e := newOnboardEnv(t)
	for _, tc := range []struct{ name, body, want string }{
		{"too large", `{"credential":"` + strings.Repeat("a", onboardproto.MaxRequest) + `"}`, "too large"},
		{"unknown field", `{"credential":"x","role":"admin"}`, "unknown field"},
		{"not json", `hello`, "invalid request body"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			resp, err := http.Post(e.srv.URL+onboardproto.Path, "application/json", strings.NewReader(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), tc.want) {
				t.Fatalf("%d %s; want 400 containing %q", resp.StatusCode, b, tc.want)
			}
			if a := e.lastAudit(); !strings.Contains(a.Detail, "reason=invalid") {
				t.Fatalf("audit %+v", a)
			}
		})
	}
}
