package api

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/hub/upgrade"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// fakeUpgrades records what the API asked of the controller.
type fakeUpgrades struct {
	mu    sync.Mutex
	calls []string
}

func (f *fakeUpgrades) note(s string) {
	f.mu.Lock()
	f.calls = append(f.calls, s)
	f.mu.Unlock()
}

func (f *fakeUpgrades) Create(_ context.Context, req upgrade.CreateRequest) (store.Upgrade, error) {
	f.note("create " + req.Name + " by " + req.By)
	return store.Upgrade{Name: req.Name, State: store.UpgradeRunning}, nil
}
func (f *fakeUpgrades) Pause(_ context.Context, name, by string) (store.Upgrade, error) {
	f.note("pause " + name + " by " + by)
	return store.Upgrade{Name: name, State: store.UpgradePaused}, nil
}
func (f *fakeUpgrades) Resume(_ context.Context, name, by string) (store.Upgrade, error) {
	return store.Upgrade{Name: name}, nil
}
func (f *fakeUpgrades) Cancel(_ context.Context, name, by string) (store.Upgrade, error) {
	return store.Upgrade{Name: name}, nil
}
func (f *fakeUpgrades) Confirm(_ context.Context, name string, n store.Node, by string) (store.UpgradeNode, error) {
	f.note("confirm " + name + " on " + n.Name + " by " + by)
	return store.UpgradeNode{Upgrade: name, Node: n.Name, ConfirmedBy: by}, nil
}

// Who may do what with upgrades: rolling out, pausing and cancelling are
// the admin's; confirming takes a role that selects the node and carries
// confirm; a caller that cannot see a node learns nothing about it; every
// refusal is audited.
func TestUpgradeEndpointsAccess(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	for i, n := range []store.Node{
		{ID: "id-b", Name: "berlin-1", Labels: map[string]string{"site": "berlin"}},
		{ID: "id-m", Name: "munich-1", Labels: map[string]string{"site": "munich"}},
	} {
		tok := "t" + string(rune('a'+i))
		if err := st.CreateToken(ctx, store.Token{
			ID:         tok,
			SecretHash: []byte("h"),
			UsesLeft:   1,
			ExpiresAt:  time.Now().Add(time.Hour),
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Join(ctx, tok, func(store.Token) error { return nil }, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.PutRole(ctx, store.Role{
		Name:    "lead",
		Nodes:   "site=berlin",
		Logins:  []string{"audit"},
		Confirm: true,
	}); err != nil {
		t.Fatal(err)
	}
	token := func(role string) string {
		id, secret, err := pki.NewToken()
		if err != nil {
			t.Fatal(err)
		}
		if err := st.CreateAPIToken(ctx, store.APIToken{
			ID:         id,
			SecretHash: pki.HashSecret(secret),
			Role:       role,
			CreatedAt:  time.Now(),
		}); err != nil {
			t.Fatal(err)
		}
		return apitype.APITokenPrefix + id + "." + secret
	}
	all, lead := token("all"), token("lead")
	door, err := access.New(ctx,
		access.Config{Store: st, Conns: nodeconn.NewTable(), UserCAs: func() []gossh.PublicKey { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	fu := &fakeUpgrades{}
	feature := &upgrade.API{Rollouts: fu, Store: st, Door: door, Targets: Targets{Store: st},
		Audit: func(e store.AuditEvent) { _ = st.AppendAudit(context.Background(), e) }}
	srv := httptest.NewServer(NewHandler(Deps{Store: st, Door: door, Metrics: metrics.New(),
		Features: []route.Feature{feature}}))
	defer srv.Close()
	call := func(tok, method, path string, body any) (int, string) {
		t.Helper()
		b, _ := json.Marshal(body)
		req, _ := http.NewRequestWithContext(ctx, method, srv.URL+path, bytes.NewReader(b))
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		var e struct{ Error string }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error
	}
	for _, tc := range []struct {
		what, tok, method, path string
		body                    any
		want                    int
		msg                     string
	}{
		{
			"a token rolls out",
			all,
			"POST",
			"/v1/upgrades",
			apitype.UpgradeCreateRequest{Name: "u", Artifact: "oci://r/x:1", Selector: "*"},
			http.StatusForbidden,
			"for the hub admin",
		},
		{"a token pauses", all, "POST", "/v1/upgrades/u/pause", nil, http.StatusForbidden, "for the hub admin"},
		{
			"reach without confirm",
			all,
			"POST",
			"/v1/upgrades/u/confirm",
			apitype.UpgradeConfirmRequest{Node: "berlin-1"},
			http.StatusForbidden,
			"confirm",
		},
		{
			"confirm outside the role's nodes",
			lead,
			"POST",
			"/v1/upgrades/u/confirm",
			apitype.UpgradeConfirmRequest{Node: "munich-1"},
			http.StatusNotFound,
			"no node",
		},
		{
			"confirm with the permission",
			lead,
			"POST",
			"/v1/upgrades/u/confirm",
			apitype.UpgradeConfirmRequest{Node: "berlin-1"},
			http.StatusOK,
			"",
		},
	} {
		code, msg := call(tc.tok, tc.method, tc.path, tc.body)
		if code != tc.want || !strings.Contains(msg, tc.msg) {
			t.Errorf("%s: %d %q, want %d %q", tc.what, code, msg, tc.want, tc.msg)
		}
	}
	// An upgrade of both nodes, halted by their failures: a caller whose
	// role selects berlin-1 sees it without munich-1 named anywhere.
	if err := st.CreateUpgrade(ctx, store.Upgrade{Name: "both", Kind: upgradeproto.KindBundle, Reference: "oci://r/x:1",
		Digest: "sha256:" + strings.Repeat("a", 64), Version: "1", State: store.UpgradeHalted,
		Reason:    "2 of 2 nodes failed: berlin-1: install.sh exited 3; munich-1: install.sh exited 3",
		Spec:      store.UpgradeSpec{Nodes: []string{"berlin-1", "munich-1"}, Selector: "site in (berlin,munich)"},
		CreatedAt: time.Now(), UpdatedAt: time.Now()},
		[]store.UpgradeNode{{NodeID: "id-b", Node: "berlin-1", Step: upgradeproto.StepFailed},
			{NodeID: "id-m", Node: "munich-1", Step: upgradeproto.StepFailed}}); err != nil {
		t.Fatal(err)
	}
	get := func(tok, path string, into any) (body string) {
		t.Helper()
		req, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+path, nil)
		req.Header.Set("Authorization", "Bearer "+tok)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
		}
		if err := json.Unmarshal(b, into); err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	var detail apitype.UpgradeDetail
	var list []apitype.Upgrade
	for path, into := range map[string]any{"/v1/upgrades/both": &detail, "/v1/upgrades": &list} {
		if b := get(lead, path, into); strings.Contains(b, "munich") {
			t.Errorf("GET %s as a caller that sees berlin-1 only names munich: %s", path, b)
		}
	}
	if len(list) != 1 {
		t.Fatalf("list: %+v", list)
	}
	for _, u := range []apitype.Upgrade{detail.Upgrade, list[0]} {
		if len(u.Spec.Nodes) != 1 || u.Spec.Nodes[0] != "berlin-1" || u.Spec.Selector != "" || u.Total != 1 ||
			u.Reason != "2 of 2 nodes failed: berlin-1: install.sh exited 3; another node: install.sh exited 3" {
			t.Errorf("upgrade as the lead sees it: %+v", u)
		}
	}
	if len(detail.Nodes) != 1 || detail.Nodes[0].Node != "berlin-1" {
		t.Errorf("nodes as the lead sees them: %+v", detail.Nodes)
	}
	get(all, "/v1/upgrades/both", &detail)
	if len(detail.Spec.Nodes) != 2 || detail.Spec.Selector != "" || len(detail.Nodes) != 2 {
		t.Errorf("upgrade as a token that sees both nodes sees it: %+v", detail)
	}

	if len(fu.calls) != 1 || !strings.HasPrefix(fu.calls[0], "confirm u on berlin-1 by apitoken:") {
		t.Errorf("controller calls %q, want the one allowed confirm", fu.calls)
	}
	ev, err := st.ListAudit(ctx, store.AuditFilter{})
	if err != nil {
		t.Fatal(err)
	}
	refused := map[string]int{}
	for _, e := range ev {
		if e.Result == "refused" {
			refused[e.Kind]++
		}
	}
	if refused["upgrade_create"] != 1 || refused["upgrade_pause"] != 1 || refused["upgrade_confirm"] != 2 {
		t.Errorf("refusals audited: %v", refused)
	}
}
