package replica

import (
	"context"
	"net/http"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
)

// Lister lists the replicas sharing the store (Local.List).
type Lister interface {
	List(ctx context.Context) (apitype.ReplicaList, error)
}

// API serves GET /v1/replicas, admin only: the replica set, and an empty
// list (never null) on a hub running alone.
type API struct {
	Replicas Lister // nil: the hub is not a replica
}

// Register implements route.Feature.
func (a API) Register(rt route.Routes) {
	rt.Handle("GET /v1/replicas", rt.Admin(func(w http.ResponseWriter, r *http.Request) { a.list(rt, w, r) }))
}

func (a API) list(rt route.Routes, w http.ResponseWriter, r *http.Request) {
	if a.Replicas == nil {
		route.JSON(w, http.StatusOK, apitype.ReplicaList{Replicas: []apitype.Replica{}})
		return
	}
	l, err := a.Replicas.List(r.Context())
	if err != nil {
		rt.Error(w, r, route.Internal("list replicas", err))
		return
	}
	if l.Replicas == nil {
		l.Replicas = []apitype.Replica{}
	}
	route.JSON(w, http.StatusOK, l)
}
