package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
)

// The node list's site is the one the console shows and site=… selects:
// the site label, on the hub's own nodes as on those below a site hub.
func TestListNodesSite(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	own := []store.Node{
		{ID: "id-b", Name: "berlin-1", Labels: map[string]string{"site": "berlin", "env": "prod"}},
		{ID: "id-p", Name: "plain-1", Labels: map[string]string{"env": "prod"}},
	}
	for i, n := range own {
		tok := "t" + string(rune('a'+i))
		tk := store.Token{ID: tok, SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour)}
		if err := st.CreateToken(ctx, tk); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Join(ctx, tok, func(store.Token) error { return nil }, n); err != nil {
			t.Fatal(err)
		}
	}
	below := store.Node{ID: "id-s", Name: "n7.sub.munich",
		Labels: access.SiteNodeLabels("sub.munich", map[string]string{"site": "own-word"})}
	id, secret, err := pki.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	apiToken := store.APIToken{ID: id, SecretHash: pki.HashSecret(secret), Role: "all", CreatedAt: time.Now()}
	if err := st.CreateAPIToken(ctx, apiToken); err != nil {
		t.Fatal(err)
	}
	door, err := access.New(ctx, access.Config{Store: st, Conns: nodeconn.NewTable(),
		UserCAs: func() []gossh.PublicKey { return nil }})
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewServer(NewHandler(Deps{Store: st, Door: door, Metrics: metrics.New(), Conns: nodeconn.NewTable(),
		Inventory: func(context.Context) ([]store.Node, error) { return []store.Node{below}, nil }}))
	defer srv.Close()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/v1/nodes", nil)
	req.Header.Set("Authorization", "Bearer "+apitype.APITokenPrefix+id+"."+secret)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var nodes []apitype.Node
	if err := json.NewDecoder(resp.Body).Decode(&nodes); err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET /v1/nodes: %s, %v", resp.Status, err)
	}
	got := map[string]string{}
	for _, n := range nodes {
		got[n.Name] = n.Site
	}
	for name, want := range map[string]string{"berlin-1": "berlin", "plain-1": "", "n7.sub.munich": "sub.munich"} {
		if site, ok := got[name]; !ok || site != want {
			t.Errorf("node %s: site %q (listed %v), want %q", name, site, ok, want)
		}
	}
}

func TestNodeSite(t *testing.T) {
	for _, tt := range []struct {
		labels map[string]string
		want   string
	}{
		{nil, ""},
		{map[string]string{"env": "dev"}, ""},
		{map[string]string{"site": "berlin"}, "berlin"},
		{access.SiteNodeLabels("sub.berlin", map[string]string{"site": "shop-7"}), "sub.berlin"},
	} {
		if got := NodeSite(tt.labels); got != tt.want {
			t.Errorf("NodeSite(%v) = %q, want %q", tt.labels, got, tt.want)
		}
	}
}
