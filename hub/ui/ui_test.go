package ui

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/testenv"
)

// fakeHub admits the operators in ops (name → admin) and refuses the rest,
// as the hub refuses a removed operator's session.
type fakeHub struct {
	id  Identity
	ops map[string]bool
}

func (f *fakeHub) Identify(*http.Request) (Identity, error) { return f.id, nil }

func (f *fakeHub) Caller(s store.ConsoleSession) (access.Caller, error) {
	admin, ok := f.ops[s.Operator]
	if !ok {
		return access.Caller{}, fmt.Errorf("operator %q is no longer registered", s.Operator)
	}
	return access.Caller{Operator: s.Operator, Admin: admin, Name: "console:" + s.Operator}, nil
}

func (f *fakeHub) OpenTerminal(context.Context, TerminalRequest) (Shell, error) {
	return nil, errors.New("no terminals here")
}

type testConsole struct {
	*Console
	st  *store.DB
	hub *fakeHub
	// apiHits counts requests that reached the API handler.
	apiHits int
	dbPath  string
}

func newTestConsole(t testing.TB) *testConsole {
	t.Helper()
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tether.db")
	st, err := store.OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	reg := nodeconn.NewTable()
	door, err := access.New(ctx, access.Config{Store: st, Conns: reg, UserCAs: func() []gossh.PublicKey { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	tc := &testConsole{
		st:     st,
		hub:    &fakeHub{id: Identity{Operator: "alice", Admin: true}, ops: map[string]bool{"alice": true}},
		dbPath: path,
	}
	c, err := New(Config{Store: st, Door: door, Conns: reg, Hub: tc.hub,
		API: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { tc.apiHits++; w.WriteHeader(http.StatusOK) })})
	if err != nil {
		t.Fatal(err)
	}
	tc.Console = c
	return tc
}

func (tc *testConsole) do(
	t *testing.T, method, path string, cookie *http.Cookie, header map[string]string,
) *httptest.ResponseRecorder {
	t.Helper()
	r := httptest.NewRequest(method, "https://hub.example:7443"+path, strings.NewReader("{}"))
	if cookie != nil {
		r.AddCookie(cookie)
	}
	for k, v := range header {
		r.Header.Set(k, v)
	}
	w := httptest.NewRecorder()
	tc.ServeHTTP(w, r)
	return w
}

// signIn asks for a code and trades it; it returns the session cookie and
// CSRF token.
func (tc *testConsole) signIn(t *testing.T) (*http.Cookie, string) {
	t.Helper()
	w := tc.do(t, "POST", "/v1/console/codes", nil, nil)
	var code struct{ URL string }
	if w.Code != http.StatusCreated || json.Unmarshal(w.Body.Bytes(), &code) != nil {
		t.Fatalf("code: %d %s", w.Code, w.Body)
	}
	w = tc.do(t, "GET", strings.TrimPrefix(code.URL, "https://hub.example:7443"), nil, nil)
	if w.Code != http.StatusSeeOther {
		t.Fatalf("sign-in: %d %s", w.Code, w.Body)
	}
	ck := w.Result().Cookies()[0]
	w = tc.do(t, "GET", "/ui/api/me", ck, nil)
	var me Me
	if err := json.Unmarshal(w.Body.Bytes(), &me); err != nil || me.CSRF == "" {
		t.Fatalf("me: %d %s", w.Code, w.Body)
	}
	return ck, me.CSRF
}

func TestSignIn(t *testing.T) {
	tc := newTestConsole(t)
	w := tc.do(t, "POST", "/v1/console/codes", nil, nil)
	var code struct{ Code, URL string }
	if err := json.Unmarshal(w.Body.Bytes(), &code); err != nil || w.Code != http.StatusCreated {
		t.Fatalf("code: %d %s", w.Code, w.Body)
	}
	if !strings.HasPrefix(code.URL, "https://hub.example:7443/ui/signin?code=") || len(code.Code) < 40 {
		t.Fatalf("code %+v", code)
	}
	// The database holds the code's hash only.
	if b, _ := os.ReadFile(tc.dbPath); strings.Contains(string(b), code.Code) {
		t.Fatal("the sign-in code is stored in clear")
	}
	// An expired code, stored after the first sign-in (which prunes them).
	expired, _ := newSecret()
	storeExpired := func() {
		now := time.Now()
		if err := tc.st.CreateConsoleCode(context.Background(),
			store.ConsoleCode{Hash: hashOf(expired), Operator: "alice", Admin: true,
				CreatedAt: now.Add(-2 * time.Minute), ExpiresAt: now.Add(-time.Minute)}); err != nil {
			t.Fatal(err)
		}
	}
	for _, tt := range []struct {
		name, code string
		want       int
		body       string
	}{
		{"fresh", code.Code, http.StatusSeeOther, ""},
		{"reused", code.Code, http.StatusForbidden, "already used"},
		{"expired", expired, http.StatusForbidden, "has expired"},
		{"expired, again", expired, http.StatusForbidden, "already used"},
		{"unknown", "nope", http.StatusForbidden, "already used or is unknown"},
		{"empty", "", http.StatusForbidden, "no valid code"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.name == "expired" {
				storeExpired()
			}
			w := tc.do(t, "GET", "/ui/signin?code="+tt.code, nil, nil)
			if w.Code != tt.want || !strings.Contains(w.Body.String(), tt.body) {
				t.Fatalf("%d %s, want %d with %q", w.Code, w.Body, tt.want, tt.body)
			}
			if w.Code != http.StatusSeeOther {
				if len(w.Result().Cookies()) != 0 {
					t.Fatal("a refused sign-in set a cookie")
				}
				return
			}
			ck := w.Result().Cookies()[0]
			if ck.Name != CookieName || !ck.HttpOnly || !ck.Secure || ck.SameSite != http.SameSiteStrictMode ||
				ck.Path != "/" || ck.Domain != "" || ck.MaxAge < int(time.Hour/time.Second) {
				t.Fatalf("cookie %+v", ck)
			}
			if loc := w.Header().Get("Location"); loc != "/ui/" {
				t.Fatalf("redirect to %q", loc)
			}
			if csp := w.Header().Get("Content-Security-Policy"); csp != ContentSecurityPolicy {
				t.Fatalf("CSP %q", csp)
			}
		})
	}
}

func TestCSRFAndSession(t *testing.T) {
	tc := newTestConsole(t)
	ck, csrf := tc.signIn(t)
	for _, tt := range []struct {
		name   string
		method string
		cookie *http.Cookie
		header map[string]string
		want   int
	}{
		{"GET needs no token", "GET", ck, nil, http.StatusOK},
		{"POST without token", "POST", ck, nil, http.StatusForbidden},
		{"POST with a wrong token", "POST", ck, map[string]string{CSRFHeader: "guess"}, http.StatusForbidden},
		{
			"POST from another origin",
			"POST",
			ck,
			map[string]string{CSRFHeader: csrf, "Origin": "https://evil.example"},
			http.StatusForbidden,
		},
		{
			"POST with the token",
			"POST",
			ck,
			map[string]string{CSRFHeader: csrf, "Origin": "https://hub.example:7443"},
			http.StatusOK,
		},
		{"DELETE without token", "DELETE", ck, nil, http.StatusForbidden},
		{"no cookie", "GET", nil, nil, http.StatusUnauthorized},
		{"forged cookie", "GET", &http.Cookie{Name: CookieName, Value: "forged"}, nil, http.StatusUnauthorized},
	} {
		t.Run(tt.name, func(t *testing.T) {
			before := tc.apiHits
			w := tc.do(t, tt.method, "/ui/api/v1/jobs", tt.cookie, tt.header)
			if w.Code != tt.want {
				t.Fatalf("%d %s, want %d", w.Code, w.Body, tt.want)
			}
			if reached := tc.apiHits > before; reached != (tt.want == http.StatusOK) {
				t.Fatalf("reached the API: %t", reached)
			}
		})
	}
	t.Run("only console endpoints of the API", func(t *testing.T) {
		if w := tc.do(t, "POST", "/ui/api/v1/operators", ck,
			map[string]string{CSRFHeader: csrf}); w.Code != http.StatusNotFound {
			t.Fatalf("/v1/operators through the console: %d", w.Code)
		}
	})
	t.Run("removed operator", func(t *testing.T) {
		delete(tc.hub.ops, "alice")
		if w := tc.do(t, "GET", "/ui/api/me", ck, nil); w.Code != http.StatusUnauthorized {
			t.Fatalf("after removal: %d", w.Code)
		}
		tc.hub.ops["alice"] = true
	})
	t.Run("sign out", func(t *testing.T) {
		if w := tc.do(t, "POST", "/ui/signout", ck, nil); w.Code != http.StatusForbidden {
			t.Fatalf("sign-out without token: %d", w.Code)
		}
		if w := tc.do(t, "POST", "/ui/signout", ck, map[string]string{CSRFHeader: csrf}); w.Code != http.StatusNoContent {
			t.Fatalf("sign-out: %d", w.Code)
		}
		if w := tc.do(t, "GET", "/ui/api/me", ck, nil); w.Code != http.StatusUnauthorized {
			t.Fatalf("after sign-out: %d", w.Code)
		}
	})
}

// TestVendoredAssets holds the embedded xterm.js to what `make ui-assets`
// recorded (SHA256SUMS): the bundle is never edited by hand.
func TestVendoredAssets(t *testing.T) {
	sums, err := fs.ReadFile(assets, "assets/vendor/SHA256SUMS")
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(string(sums)), "\n") {
		want, name, ok := strings.Cut(line, "  ")
		if !ok {
			t.Fatalf("SHA256SUMS line %q", line)
		}
		b, err := fs.ReadFile(assets, "assets/vendor/"+name)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(b)
		if got := hex.EncodeToString(sum[:]); got != want {
			t.Errorf("%s: sha256 %s, SHA256SUMS says %s: run `make ui-assets`", name, got, want)
		}
		n++
	}
	if n != 2 {
		t.Fatalf("SHA256SUMS lists %d files, want xterm.js and xterm.css", n)
	}
}

func TestFleetPage(t *testing.T) {
	tc := newTestConsole(t)
	testenv.FillNodes(t, tc.dbPath, 1000)
	all := func(*store.Node) bool { return true }
	for _, tt := range []struct {
		name    string
		q       string
		matched int
		first   string
	}{
		{"all", "", 1000, "node-000000"},
		{"label", "label=site=s7", 10, "node-000007"},
		{"label and env", "label=site=s8,env=prod", 10, "node-000008"},
		{"version", "version=v1.1.0", 333, "node-000001"},
		{"os", "os=Ubuntu+24.04+LTS", 334, "node-000000"},
		{"search", "q=NODE-00099", 10, "node-000990"},
		{"state", "state=offline", 1000, "node-000000"},
		{"state online", "state=online", 0, ""},
		{"sort descending", "sort=-last_seen", 1000, "node-000000"},
		{"sort ascending", "sort=last_seen", 1000, "node-000999"},
		{"page", "offset=990&limit=5", 1000, "node-000990"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := httptest.NewRequest("GET", "/ui/api/fleet?"+tt.q, nil)
			q, err := ParseFleetQuery(r)
			if err != nil {
				t.Fatal(err)
			}
			p, err := tc.fleet.Page(context.Background(), all, q)
			if err != nil {
				t.Fatal(err)
			}
			if p.Total != 1000 || p.Matched != tt.matched || p.Counts[StateOffline] != tt.matched {
				t.Fatalf("total %d matched %d counts %v, want 1000 %d", p.Total, p.Matched, p.Counts, tt.matched)
			}
			if first := ""; len(p.Nodes) > 0 {
				first = p.Nodes[0].Name
				if first != tt.first {
					t.Fatalf("first row %s, want %s", first, tt.first)
				}
			} else if tt.first != "" {
				t.Fatalf("no rows, want %s first", tt.first)
			}
		})
	}
	t.Run("visibility", func(t *testing.T) {
		prodOnly := func(n *store.Node) bool { return n.Labels["env"] == "prod" }
		p, err := tc.fleet.Page(context.Background(), prodOnly, FleetQuery{Limit: 50})
		if err != nil || p.Total != 250 || p.Matched != 250 ||
			p.Versions["v1.0.0"]+p.Versions["v1.1.0"]+p.Versions["v1.2.0"] != 250 {
			t.Fatalf("%v: total %d matched %d versions %v", err, p.Total, p.Matched, p.Versions)
		}
	})
	for _, bad := range []string{"state=gone", "limit=0", "limit=501", "offset=-1", "sort=color"} {
		t.Run("refused "+bad, func(t *testing.T) {
			if _, err := ParseFleetQuery(httptest.NewRequest("GET", "/ui/api/fleet?"+bad, nil)); err == nil {
				t.Fatalf("%s accepted", bad)
			}
		})
	}
}

// FuzzParseFleetQuery: whatever the query string, the parse answers an
// error or a query within bounds, and never panics.
func FuzzParseFleetQuery(f *testing.F) {
	for _, s := range []string{
		"",
		"q=a&state=online,stale&label=site%3Db&sort=-last_seen&offset=5&limit=500",
		"limit=0",
		"state=,",
		"sort=-",
		"offset=99999999999999999999",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, raw string) {
		r := httptest.NewRequest("GET", "/ui/api/fleet", nil)
		r.URL.RawQuery = raw
		q, err := ParseFleetQuery(r)
		if err != nil {
			return
		}
		if q.Limit < 1 || q.Limit > 500 || q.Offset < 0 {
			t.Fatalf("%q: limit %d offset %d", raw, q.Limit, q.Offset)
		}
		if _, ok := sorters[strings.TrimPrefix(q.Sort, "-")]; q.Sort != "" && !ok {
			t.Fatalf("%q: sort %q", raw, q.Sort)
		}
	})
}

func TestStateOf(t *testing.T) {
	now := time.Now()
	conn := func(id string, connected time.Time, heard time.Time) *nodeconn.Conn {
		c := nodeconn.NewConn(id, "n1", nil, nil)
		c.Connected = connected
		if !heard.IsZero() {
			c.Heard.Store(heard.UnixNano())
		}
		return c
	}
	for _, tt := range []struct {
		name string
		node store.Node
		conn *nodeconn.Conn
		want string
	}{
		{"no session", store.Node{ID: "a", Name: "n1"}, nil, StateOffline},
		{
			"heard lately",
			store.Node{ID: "a", Name: "n1"},
			conn("a", now.Add(-time.Hour), now.Add(-10*time.Second)),
			StateOnline,
		},
		{
			"connected lately, not heard yet",
			store.Node{ID: "a", Name: "n1"},
			conn("a", now.Add(-5*time.Second), time.Time{}),
			StateOnline,
		},
		{
			"silent too long",
			store.Node{ID: "a", Name: "n1"},
			conn("a", now.Add(-time.Hour), now.Add(-2*time.Minute)),
			StateStale,
		},
		{"a namesake's session", store.Node{ID: "a", Name: "n1"}, conn("b", now, now), StateOffline},
		{"revoked", store.Node{ID: "a", Name: "n1", RevokedAt: now}, conn("a", now, now), StateRevoked},
	} {
		t.Run(tt.name, func(t *testing.T) {
			conns := map[string]*nodeconn.Conn{}
			if tt.conn != nil {
				conns["n1"] = tt.conn
			}
			if got, _ := stateOf(&tt.node, conns, 45*time.Second, now); got != tt.want {
				t.Fatalf("%s, want %s", got, tt.want)
			}
		})
	}
}

// TestTerminalRecheck: a live terminal is re-checked as a live jump is,
// through the door: it ends when no role allows its login on the node any
// more (though a role still selects the node), and when the node is
// revoked or removed.
func TestTerminalRecheck(t *testing.T) {
	tc := newTestConsole(t)
	ctx := context.Background()
	if err := tc.st.CreateToken(ctx, store.Token{ID: "tok", SecretHash: []byte("x"), UsesLeft: 1,
		ExpiresAt: time.Now().Add(time.Hour), CreatedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	dev1 := store.Node{ID: "id-dev-1", Name: "dev-1", Labels: map[string]string{"env": "dev"}, CreatedAt: time.Now()}
	if _, err := tc.st.Join(ctx, "tok", func(store.Token) error { return nil }, dev1); err != nil {
		t.Fatal(err)
	}
	for _, r := range []store.Role{
		{Name: "dev-ops", Nodes: "env=dev", Logins: []string{"*"}},
		{Name: "dev-audit", Nodes: "env=dev", Logins: []string{"auditor"}},
	} {
		if err := tc.st.PutRole(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	k := testenv.NewKey(t).Signer.PublicKey()
	alice := store.Operator{Name: "alice", PublicKey: string(gossh.MarshalAuthorizedKey(k)),
		Fingerprint: gossh.FingerprintSHA256(k), Roles: []string{"dev-ops", "dev-audit"}, CreatedAt: time.Now()}
	if err := tc.st.AddOperator(ctx, alice); err != nil {
		t.Fatal(err)
	}
	reload := func() {
		t.Helper()
		if _, err := tc.cfg.Door.Reload(ctx); err != nil {
			t.Fatal(err)
		}
	}
	reload()
	ck, _ := tc.signIn(t)
	r := httptest.NewRequest("GET", "https://hub.example:7443/ui/api/terminal?node=dev-1&login=root", nil)
	r.AddCookie(ck)
	check := func(node, login string, want error, says string) {
		t.Helper()
		err := tc.stillMay(ctx, r, node, login)
		if want == nil && err != nil || want != nil && (!errors.Is(err, want) || !strings.Contains(err.Error(), says)) {
			t.Errorf("stillMay(%s as %s) = %v, want %v saying %q", node, login, err, want, says)
		}
	}
	check("dev-1", "root", nil, "")
	check("dev-1", "auditor", nil, "")
	// dev-audit still selects dev-1, but allows auditor only.
	if err := tc.st.DeleteRole(ctx, "dev-ops"); err != nil {
		t.Fatal(err)
	}
	reload()
	check("dev-1", "root", access.ErrDenied, `may not log in as "root" on node "dev-1"; their roles allow: auditor`)
	check("dev-1", "auditor", nil, "")
	check("dev-2", "auditor", access.ErrUnknownNode, `no node named "dev-2"`)
	if err := tc.st.RevokeNode(ctx, "id-dev-1", time.Now()); err != nil {
		t.Fatal(err)
	}
	check("dev-1", "auditor", access.ErrRevoked, `node "dev-1" was revoked`)
}
