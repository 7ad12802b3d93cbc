package api

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/mission"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

type fakeMissions struct{ calls int }

func (f *fakeMissions) Create(context.Context, mission.CreateRequest, string) (mission.Detail, error) {
	f.calls++
	return mission.Detail{}, nil
}
func (f *fakeMissions) List(context.Context) ([]mission.Summary, error) { f.calls++; return nil, nil }
func (f *fakeMissions) Get(context.Context, string, string) (mission.Detail, error) {
	f.calls++
	return mission.Detail{}, nil
}
func (f *fakeMissions) Delete(context.Context, string, string) (siteproto.DesiredObject, error) {
	f.calls++
	return siteproto.DesiredObject{}, nil
}

// TestMissionEndpointsAdminOnly: missions make every matching node below
// this hub run a script, so only the hub admin may create, delete or read
// them: no credential, and an API token of any role, are refused before
// the mission service is called.
func TestMissionEndpointsAdminOnly(t *testing.T) {
	ctx := context.Background()
	st, err := store.OpenSQLite(ctx, filepath.Join(t.TempDir(), "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	id, secret, err := pki.NewToken()
	if err != nil {
		t.Fatal(err)
	}
	if err := st.CreateAPIToken(ctx, store.APIToken{
		ID:         id,
		SecretHash: pki.HashSecret(secret),
		Role:       "all",
		CreatedAt:  time.Now(),
	}); err != nil {
		t.Fatal(err)
	}
	tok := apitype.APITokenPrefix + id + "." + secret
	fm := &fakeMissions{}
	srv := httptest.NewServer(NewHandler(Deps{Store: st, Metrics: metrics.New(),
		Features: []route.Feature{&mission.API{Missions: fm}}}))
	defer srv.Close()
	body, _ := json.Marshal(apitype.MissionCreateRequest{Name: "m", Script: "echo hi"})
	for _, auth := range []string{"", "Bearer " + tok} {
		for _, c := range []struct{ method, path string }{
			{"POST", "/v1/missions"}, {"GET", "/v1/missions"}, {"GET", "/v1/missions/m"}, {"DELETE", "/v1/missions/m"},
		} {
			req, _ := http.NewRequestWithContext(ctx, c.method, srv.URL+c.path, bytes.NewReader(body))
			if auth != "" {
				req.Header.Set("Authorization", auth)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized && resp.StatusCode != http.StatusForbidden {
				t.Errorf("%s %s with %q: %d, want 401 or 403", c.method, c.path, auth, resp.StatusCode)
			}
		}
	}
	if fm.calls != 0 {
		t.Errorf("the mission service was called %d times without the admin", fm.calls)
	}
}
