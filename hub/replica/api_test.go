package replica_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/replica"
	"github.com/tether-dev/tether/hub/store"
)

type fakeReplicas struct{ l apitype.ReplicaList }

func (f fakeReplicas) List(context.Context) (apitype.ReplicaList, error) { return f.l, nil }

// openRoutes serves features without authentication, as an admin would
// be served.
type openRoutes struct{ *http.ServeMux }

func (o openRoutes) Handle(pattern string, h http.HandlerFunc) { o.ServeMux.HandleFunc(pattern, h) }
func (openRoutes) Admin(h http.HandlerFunc) http.HandlerFunc   { return h }
func (openRoutes) Automation(h route.Handler) http.HandlerFunc { return nil }
func (openRoutes) Lister(h route.Handler) http.HandlerFunc     { return nil }
func (openRoutes) Error(w http.ResponseWriter, _ *http.Request, err error) {
	http.Error(w, err.Error(), http.StatusInternalServerError)
}

// GET /v1/replicas is an admin's: without an admin certificate it is
// refused; the handler answers the replica set, and an empty list (never
// null) on a hub running alone.
func TestListReplicas(t *testing.T) {
	st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	want := apitype.ReplicaList{Self: "r1", Replicas: []apitype.Replica{{ID: "r1", Self: true, Health: "ok",
		Links: []string{"r2"}, Agents: []string{"n1"}}}}
	rec := httptest.NewRecorder()
	api.NewHandler(api.Deps{Store: st, Features: []route.Feature{replica.API{Replicas: fakeReplicas{want}}}}).
		ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/replicas", nil))
	if rec.Code != http.StatusUnauthorized && rec.Code != http.StatusForbidden {
		t.Fatalf("GET /v1/replicas without credentials: %d, want 401 or 403", rec.Code)
	}
	for _, tc := range []struct {
		name string
		api  replica.API
		want int // replicas listed
	}{
		{"replica", replica.API{Replicas: fakeReplicas{want}}, 1},
		{"alone", replica.API{}, 0},
		{"not joined", replica.API{Replicas: replica.NewLocal("r1", st, nil)}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mux := http.NewServeMux()
			tc.api.Register(openRoutes{mux})
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/replicas", nil))
			var got struct {
				Self     string            `json:"self"`
				Replicas []apitype.Replica `json:"replicas"`
			}
			if err := json.Unmarshal(rec.Body.Bytes(), &got); err != nil || rec.Code != 200 {
				t.Fatalf("%d %s: %v", rec.Code, rec.Body.String(), err)
			}
			if got.Replicas == nil || len(got.Replicas) != tc.want {
				t.Fatalf("replicas %+v, want %d (an array)", got.Replicas, tc.want)
			}
		})
	}
}
