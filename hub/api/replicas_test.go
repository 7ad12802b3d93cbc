package api

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"testing"

	"github.com/tether-dev/tether/hub/store"
)

type fakeReplicas struct{ l ReplicaList }

func (f fakeReplicas) List(context.Context) (ReplicaList, error)          { return f.l, nil }
func (f fakeReplicas) Holders(context.Context) (map[string]string, error) { return nil, nil }

// GET /v1/replicas is an admin's: without an admin certificate it is
// refused; the handler answers the replica set, and an empty list (never
// null) on a hub running alone.
func TestListReplicas(t *testing.T) {
	st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "t.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	want := ReplicaList{Self: "r1", Replicas: []Replica{{ID: "r1", Self: true, Health: "ok", Links: []string{"r2"}, Agents: []string{"n1"}}}}
	rec := httptest.NewRecorder()
	NewHandler(Deps{Store: st, Replicas: fakeReplicas{want}}).ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/replicas", nil))
	if rec.Code != http.StatusUnauthorized && rec.Code != http.StatusForbidden {
		t.Fatalf("GET /v1/replicas without credentials: %d, want 401 or 403", rec.Code)
	}
	for _, tc := range []struct {
		name string
		deps Deps
		want int // replicas listed
	}{
		{"replica", Deps{Store: st, Replicas: fakeReplicas{want}}, 1},
		{"alone", Deps{Store: st}, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			h := &handler{tc.deps}
			rec := httptest.NewRecorder()
			h.listReplicas(rec, httptest.NewRequest(http.MethodGet, "/v1/replicas", nil))
			var got struct {
				Self     string    `json:"self"`
				Replicas []Replica `json:"replicas"`
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
