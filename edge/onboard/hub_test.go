package onboard

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// fakeHub implements the onboarding contract: the CA at OnboardCAPath and
// POST OnboardPath keyed by machine UUID and key, as the hub does.
type fakeHub struct {
	t    *testing.T
	ca   *ca.CA
	srv  *httptest.Server
	mu   sync.Mutex
	uses int               // credential uses left
	keys map[string][]byte // machine uuid -> public key (DER of the CSR's key)
	ids  map[string]string // machine uuid -> node id
	reqs []onboardproto.Request
	fail int // answer this many POSTs with 503 first
}

func newFakeHub(t *testing.T) *fakeHub {
	t.Helper()
	c, err := ca.LoadOrCreate(t.TempDir(), "test hub")
	if err != nil {
		t.Fatal(err)
	}
	h := &fakeHub{t: t, ca: c, uses: 10, keys: map[string][]byte{}, ids: map[string]string{}}
	cert, err := c.IssueHubServer("hub", []string{"127.0.0.1"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+onboardproto.CAPath, func(w http.ResponseWriter, _ *http.Request) {
		w.Write(pki.EncodeCerts(c.Certificate()))
	})
	mux.HandleFunc("POST "+onboardproto.Path, h.onboard)
	h.srv = httptest.NewUnstartedServer(mux)
	h.srv.TLS = &tls.Config{Certificates: []tls.Certificate{cert}}
	h.srv.StartTLS()
	t.Cleanup(h.srv.Close)
	return h
}

func (h *fakeHub) addr() string { return strings.TrimPrefix(h.srv.URL, "https://") }
func (h *fakeHub) pin() string  { return "sha256:" + h.ca.Pin() }

func (h *fakeHub) refuse(w http.ResponseWriter, code int, msg string) {
	w.WriteHeader(code)
	json.NewEncoder(w).Encode(control.ErrorResponse{Error: msg})
}

func (h *fakeHub) onboard(w http.ResponseWriter, r *http.Request) {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.fail > 0 {
		h.fail--
		w.Header().Set("Retry-After", "0")
		h.refuse(w, http.StatusServiceUnavailable, "starting")
		return
	}
	var req onboardproto.Request
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		h.refuse(w, 400, err.Error())
		return
	}
	if err := req.Validate(); err != nil {
		h.refuse(w, 400, err.Error())
		return
	}
	h.reqs = append(h.reqs, req)
	if req.Credential != "cred.secret" {
		h.refuse(w, http.StatusForbidden, "unknown onboarding credential")
		return
	}
	csrKey := publicKeyOf(h.t, req.CSR)
	existing := false
	if k, ok := h.keys[req.Machine.UUID]; ok {
		if string(k) != string(csrKey) {
			h.refuse(w, http.StatusConflict, "machine uuid "+req.Machine.UUID+" is onboarded with another key")
			return
		}
		existing = true
	} else {
		if h.uses == 0 {
			h.refuse(w, http.StatusForbidden, "onboarding credential exhausted")
			return
		}
		h.uses--
		h.keys[req.Machine.UUID] = csrKey
		h.ids[req.Machine.UUID] = fmt.Sprintf("n%d", len(h.ids)+1)
	}
	id := h.ids[req.Machine.UUID]
	cert, err := h.ca.SignCSR(req.CSR, pki.Identity{Kind: pki.KindNode, ID: id}, "node-"+id, time.Hour)
	if err != nil {
		h.refuse(w, 400, err.Error())
		return
	}
	ud := "#cloud-config\nwrite_files:\n- path: /etc/tether/labels\n  content: |\n    site=test\n  permissions: '0644'\n" +
		"- path: /var/lib/tether-edge/extra\n  encoding: b64\n  content: aGVsbG8=\n  permissions: '0600'\n" +
		"runcmd:\n- [systemctl, daemon-reload]\n- [systemctl, enable, --now, tether-edge]\n"
	json.NewEncoder(w).Encode(onboardproto.Response{
		NodeID:    id,
		Name:      "node-" + id,
		Existing:  existing,
		Profile:   "debian-12",
		MatchedBy: "version",
		Cert:      string(pki.EncodeCerts(cert, h.ca.Intermediate())),
		CA:        string(pki.EncodeCerts(h.ca.Certificate())),
		Hubs:      []string{h.addr()},
		UserData:  ud,
	})
}

// fakeRoot makes a machine tree with a DMI UUID and os-release.
func fakeRoot(t *testing.T, uuid string) string {
	t.Helper()
	root := t.TempDir()
	write(t, root, productUUIDPath, uuid+"\n")
	write(t, root, productSerialPath, "SN-1\n")
	write(t, root, osReleasePath, "ID=debian\nVERSION_ID=\"12\"\nID_LIKE=\"\"\nPRETTY_NAME=\"Debian 12\"\n")
	return root
}

func write(t *testing.T, root, p, content string) {
	t.Helper()
	full := filepath.Join(root, p)
	if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func testConfig(t *testing.T, h *fakeHub, root string) Config {
	t.Helper()
	return Config{Hub: h.addr(), CAPin: h.pin(), Credential: "cred.secret", Mode: ModeWriteOnly,
		Machine: Machine{Root: root, StateDir: filepath.Join(t.TempDir(), "state"), EUID: 0,
			FreeBytes: func(string) (uint64, error) { return 1 << 30, nil }},
		CloudInitDir: filepath.Join(t.TempDir(), "seed"), Attempts: 3, Backoff: time.Millisecond}
}

func TestRunWriteOnly(t *testing.T) {
	h := newFakeHub(t)
	c := testConfig(t, h, fakeRoot(t, "4c4c4544-0042-3510-8052-b4c04f333231"))
	res, err := Run(context.Background(), c)
	if err != nil {
		t.Fatalf("Run: %v (%+v)", err, res)
	}
	if res.NodeID != "n1" || res.Existing || res.Profile != "debian-12" {
		t.Fatalf("result %+v", res)
	}
	ud, err := os.ReadFile(filepath.Join(c.CloudInitDir, "user-data"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := onboardproto.ParseUserData(string(ud)); err != nil {
		t.Fatalf("seed user-data: %v", err)
	}
	if md, _ := os.ReadFile(filepath.Join(c.CloudInitDir, "meta-data")); !strings.Contains(string(md),
		"instance-id: tether-n1") {
		t.Fatalf("meta-data %q", md)
	}
	id, err := edge.LoadIdentity(c.Machine.StateDir)
	if err != nil || id.Config.NodeID != "n1" {
		t.Fatalf("identity %v %v", id, err)
	}
	for _, f := range []string{"node.key", "node.crt", "ca.crt", "node.json"} {
		fi, err := os.Stat(filepath.Join(c.Machine.StateDir, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, fi, err)
		}
	}
	if h.reqs[0].Machine.UUID != "4c4c4544-0042-3510-8052-b4c04f333231" || h.reqs[0].Machine.Serial != "SN-1" ||
		h.reqs[0].Facts.OSID != "debian" {
		t.Fatalf("request facts %+v", h.reqs[0].Machine)
	}

	// Onboarded: a second run stops, --force runs again with the same key.
	if _, err := Run(context.Background(), c); !errors.Is(err, ErrPrerequisites) {
		t.Fatalf("second run: %v, want the already-onboarded failure", err)
	}
	c.Force = true
	res, err = Run(context.Background(), c)
	if err != nil || !res.Existing || !res.KeyReused || res.NodeID != "n1" {
		t.Fatalf("--force: %v %+v", err, res)
	}
}

// A run that stopped after the key was persisted (the hub never answered)
// is finished by a re-run with the same key: the same node, no second one.
func TestRunResumesWithSameKey(t *testing.T) {
	h := newFakeHub(t)
	c := testConfig(t, h, fakeRoot(t, "11111111-2222-3333-4444-555555555555"))
	h.fail = 100
	if _, err := Run(context.Background(), c); err == nil {
		t.Fatal("run against a hub that is down succeeded")
	}
	if _, err := os.Stat(filepath.Join(c.Machine.StateDir, "node.key")); err != nil {
		t.Fatalf("key not persisted before asking the hub: %v", err)
	}
	h.mu.Lock()
	h.fail = 1 // one more busy answer: retried with backoff
	h.mu.Unlock()
	res, err := Run(context.Background(), c)
	if err != nil || !res.KeyReused || res.NodeID != "n1" {
		t.Fatalf("resume: %v %+v", err, res)
	}
	// The hub answered but the CLI died before saving: same node again.
	os.Remove(filepath.Join(c.Machine.StateDir, "node.json"))
	res, err = Run(context.Background(), c)
	if err != nil || !res.Existing || res.NodeID != "n1" || len(h.ids) != 1 {
		t.Fatalf("retry after a lost answer: %v %+v ids=%v", err, res, h.ids)
	}
}

func TestRunRefusals(t *testing.T) {
	h := newFakeHub(t)
	uuid := "aaaaaaaa-2222-3333-4444-555555555555"
	tests := []struct {
		name  string
		setup func(c *Config)
		want  string
		is    error
		// keyPath: the error names this machine's node key where it is
		// (the state dir given), for a UUID onboarded with another key.
		keyPath bool
	}{
		{"wrong pin", func(c *Config) { c.CAPin = "sha256:" + strings.Repeat("ab", 32) },
			"the hub serves sha256:" + h.ca.Pin(), ErrFingerprintMismatch, false},
		{"no pin non-interactive", func(c *Config) { c.CAPin = "" }, "--ca-pin sha256:… is required", nil, false},
		{"bad credential", func(c *Config) { c.Credential = "cred.wrong" },
			"unknown onboarding credential", nil, false},
		{"malformed credential", func(c *Config) { c.Credential = "nodot" }, "ID.SECRET", nil, false},
		{"not root", func(c *Config) { c.Machine.EUID = 1000 }, "prerequisite", ErrPrerequisites, false},
		{"unreachable hub", func(c *Config) { c.Hub = "127.0.0.1:1" }, "not reachable", nil, false},
		{"duplicate uuid", func(c *Config) {}, "onboarded with another key", nil, true},
	}
	// The duplicate case needs the UUID taken by another key first.
	first := testConfig(t, h, fakeRoot(t, uuid))
	if _, err := Run(context.Background(), first); err != nil {
		t.Fatal(err)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := testConfig(t, h, fakeRoot(t, uuid))
			tt.setup(&c)
			_, err := Run(context.Background(), c)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("err = %v, want %q", err, tt.want)
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Fatalf("err = %v, want errors.Is %v", err, tt.is)
			}
			if key := filepath.Join(c.Machine.StateDir, "node.key"); tt.keyPath != strings.Contains(err.Error(), key) {
				t.Fatalf("err = %v; naming %s: %v, want %v", err, key, !tt.keyPath, tt.keyPath)
			}
		})
	}
}

// scripted answers a Prompter's questions from a list; an empty answer
// keeps the default.
type scripted struct {
	answers []string
	asked   []string
}

func (s *scripted) next(title string) string {
	s.asked = append(s.asked, title)
	if len(s.answers) == 0 {
		return ""
	}
	a := s.answers[0]
	s.answers = s.answers[1:]
	return a
}

func (s *scripted) Input(f Field) (string, error) {
	v := f.Value
	for range 5 {
		if a := s.next(f.Title); a != "" {
			v = a
		}
		if f.Syntax != nil && f.Syntax(v) != nil {
			continue
		}
		if f.Check == nil || f.Check(v) == nil {
			return v, nil
		}
	}
	return "", errors.New("too many tries")
}
func (s *scripted) Confirm(title, _ string) (bool, error) { return s.next(title) == "y", nil }
func (s *scripted) Choose(title string, _ [][2]string, def string) (string, error) {
	if a := s.next(title); a != "" {
		return a, nil
	}
	return def, nil
}

// Interactive and non-interactive runs with the same inputs send the same
// request: one code path after input.
func TestInteractiveSameAsFlags(t *testing.T) {
	h := newFakeHub(t)
	nonInt := testConfig(t, h, fakeRoot(t, "bbbbbbbb-2222-3333-4444-555555555555"))
	nonInt.Name, nonInt.Site, nonInt.Labels = "shop-1", "berlin", map[string]string{"rack": "r1"}
	if _, err := Run(context.Background(), nonInt); err != nil {
		t.Fatal(err)
	}
	inter := testConfig(t, h, fakeRoot(t, "cccccccc-2222-3333-4444-555555555555"))
	inter.Hub, inter.CAPin, inter.Credential, inter.AskMode = "", "", "", true
	// proxy (default), hub (typo, then right), CA yes, name, site, labels,
	// mode (default), credential (refused, then right).
	inter.Prompter = &scripted{answers: []string{
		"", "127.0.0.1:1", h.addr(), "y", "shop-1", "berlin", "rack=r1", "write-only", "cred.wrong", "cred.secret",
	}}
	res, err := Run(context.Background(), inter)
	if err != nil {
		t.Fatalf("interactive: %v %+v", err, res)
	}
	a, b := h.reqs[0], h.reqs[len(h.reqs)-1]
	if a.Name != b.Name || FormatLabels(a.Labels) != FormatLabels(b.Labels) || a.Facts.OSID != b.Facts.OSID {
		t.Fatalf("requests differ:\n%+v\n%+v", a, b)
	}
}

func TestCheckPinShowsBoth(t *testing.T) {
	got := CheckPin(&CAResult{Fingerprint: "aa"}, "bb")
	if !errors.Is(got, ErrFingerprintMismatch) || !strings.Contains(got.Error(), "sha256:aa") ||
		!strings.Contains(got.Error(), "sha256:bb") {
		t.Fatal(got)
	}
}

func TestParsePin(t *testing.T) {
	h := strings.Repeat("ab", 32)
	for _, in := range []string{"sha256:" + h, h, "SHA256:" + strings.ToUpper(h)} {
		if got, err := ParsePin(in); err != nil || got != h {
			t.Errorf("ParsePin(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "sha256:abc", "md5:" + h} {
		if _, err := ParsePin(in); err == nil {
			t.Errorf("ParsePin(%q) accepted", in)
		}
	}
}

func TestNormalizeHub(t *testing.T) {
	for in, want := range map[string]string{
		"hub.example": "hub.example:7443", "hub:1": "hub:1", "https://hub:2/": "hub:2", "[::1]:3": "[::1]:3",
	} {
		if got, err := NormalizeHub(in); err != nil || got != want {
			t.Errorf("NormalizeHub(%q) = %q, %v", in, got, err)
		}
	}
	for _, in := range []string{"", "hub:0", "hub:x", "a b"} {
		if _, err := NormalizeHub(in); err == nil {
			t.Errorf("NormalizeHub(%q) accepted", in)
		}
	}
}

func publicKeyOf(t *testing.T, csrDER []byte) []byte {
	csr, err := x509ParseCSR(csrDER)
	if err != nil {
		t.Error(err)
		return nil
	}
	sum := sha256.Sum256(csr)
	return []byte(hex.EncodeToString(sum[:]))
}

func x509ParseCSR(der []byte) ([]byte, error) {
	csr, err := x509.ParseCertificateRequest(der)
	if err != nil {
		return nil, err
	}
	return csr.RawSubjectPublicKeyInfo, nil
}

// The hub is reached through the proxy the form shows: a CONNECT proxy
// that alone knows where "hub.example" is.
func TestRunThroughProxy(t *testing.T) {
	h := newFakeHub(t)
	var mu sync.Mutex
	connects := 0
	proxy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodConnect || !strings.HasPrefix(r.Host, "hub.example:") {
			http.Error(w, "want CONNECT hub.example", http.StatusBadRequest)
			return
		}
		mu.Lock()
		connects++
		mu.Unlock()
		up, err := net.Dial("tcp", h.addr())
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
		w.WriteHeader(http.StatusOK)
		conn, _, err := w.(http.Hijacker).Hijack()
		if err != nil {
			up.Close()
			return
		}
		go func() { io.Copy(up, conn); up.Close() }()
		io.Copy(conn, up)
		conn.Close()
	}))
	t.Cleanup(proxy.Close)
	_, port, _ := net.SplitHostPort(h.addr())
	c := testConfig(t, h, fakeRoot(t, "eeeeeeee-2222-3333-4444-555555555555"))
	c.Hub = "hub.example:" + port
	// The fake hub's certificate names 127.0.0.1; the pinned TLS check is
	// on the CA and the hub's fixed server name, not the address.
	c.Proxy = Proxy{HTTPS: proxy.URL}
	res, err := Run(context.Background(), c)
	if err != nil {
		t.Fatalf("through the proxy: %v %+v", err, res)
	}
	if connects < 2 || res.Proxy.HTTPS != proxy.URL {
		t.Fatalf("%d CONNECTs, result proxy %+v", connects, res.Proxy)
	}
	c2 := testConfig(t, h, fakeRoot(t, "ffffffff-2222-3333-4444-555555555555"))
	c2.Hub, c2.Proxy = "hub.example:"+port, Proxy{HTTPS: "http://127.0.0.1:1"}
	if _, err := Run(context.Background(), c2); err == nil ||
		!strings.Contains(err.Error(), "not reachable through https_proxy=http://127.0.0.1:1") {
		t.Fatalf("dead proxy: %v", err)
	}
}

func TestProxyFromEnv(t *testing.T) {
	env := map[string]string{"https_proxy": "http://p:3128", "NO_PROXY": "10.0.0.0/8"}
	p := ProxyFromEnv(func(k string) string { return env[k] })
	if p.HTTPS != "http://p:3128" || p.NoProxy != "10.0.0.0/8" ||
		!strings.Contains(p.String(), "https_proxy=http://p:3128") {
		t.Fatalf("%+v", p)
	}
	if (Proxy{}).String() != "none (direct)" {
		t.Fatal((Proxy{}).String())
	}
	if err := (Proxy{HTTPS: "p:3128"}).validate(); err == nil {
		t.Fatal("a proxy without scheme accepted")
	}
}
