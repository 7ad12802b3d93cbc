package cluster

import (
	"context"
	"fmt"
	"net/http"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/store"
)

// Control drives nodes' Kubernetes engine membership for the cluster
// endpoints. Requests name a node; the membership belongs to the ID of the
// node holding that name. Implementations wrap ErrInvalid, ErrConflict and
// store.ErrNotFound (the API answers 400, 409 and 404).
type Control interface {
	// Register sets a node's desired state to active with engine.
	Register(ctx context.Context, node, engine, by string) (store.ClusterMember, error)
	// Deregister sets a node's desired state to inactive.
	Deregister(ctx context.Context, node, by string) (store.ClusterMember, error)
	// Engines lists the engine names known now.
	Engines() ([]string, error)
}

// API serves the cluster endpoints (/v1/cluster), admin only.
type API struct {
	Store interface {
		ListClusterMembers(ctx context.Context) ([]store.ClusterMember, error)
	}
	// Control is nil on a hub without the cluster controller: the
	// endpoints that change memberships answer 404.
	Control Control
}

// Register implements route.Feature.
func (a API) Register(rt route.Routes) {
	rt.Handle("GET /v1/cluster", rt.Admin(a.status))
	rt.Handle("PUT /v1/cluster/{node}", rt.Admin(func(w http.ResponseWriter, r *http.Request) { a.register(rt, w, r) }))
	rt.Handle(
		"DELETE /v1/cluster/{node}",
		rt.Admin(func(w http.ResponseWriter, r *http.Request) { a.deregister(rt, w, r) }),
	)
}

// MemberView is m as the API shows it.
func MemberView(m store.ClusterMember) apitype.ClusterMember {
	return apitype.ClusterMember{Node: m.Node, NodeID: m.NodeID, Engine: m.Engine, Desired: m.Desired, State: m.State,
		EngineDigest: m.EngineDigest, LastTransition: m.LastTransition, LastError: m.LastError, LastJob: m.LastJob,
		UpdatedAt: m.UpdatedAt}
}

func (a API) enabled(w http.ResponseWriter) bool {
	if a.Control == nil {
		route.JSON(w, http.StatusNotFound,
			apitype.ErrorResponse{Error: "the cluster controller is not enabled on this hub"})
		return false
	}
	return true
}

// reply answers a register or deregister: the member, or the error through
// the API's one mapping.
func reply(rt route.Routes, w http.ResponseWriter, r *http.Request, m store.ClusterMember, err error) {
	if err != nil {
		rt.Error(w, r, err)
		return
	}
	route.JSON(w, http.StatusOK, MemberView(m))
}

func (a API) status(w http.ResponseWriter, r *http.Request) {
	members, err := a.Store.ListClusterMembers(r.Context())
	if err != nil {
		route.JSON(w, http.StatusInternalServerError, apitype.ErrorResponse{Error: err.Error()})
		return
	}
	out := make([]apitype.ClusterMember, len(members))
	for i, m := range members {
		out[i] = MemberView(m)
	}
	route.JSON(w, http.StatusOK, out)
}

func (a API) register(rt route.Routes, w http.ResponseWriter, r *http.Request) {
	var req apitype.ClusterRegisterRequest
	if !route.Decode(w, r, &req, route.MaxBody) || !a.enabled(w) {
		return
	}
	if req.Engine == "" {
		names, _ := a.Control.Engines()
		route.JSON(
			w,
			http.StatusBadRequest,
			apitype.ErrorResponse{Error: fmt.Sprintf("engine is required (known: %v)", names)},
		)
		return
	}
	m, err := a.Control.Register(r.Context(), r.PathValue("node"), req.Engine, "admin")
	reply(rt, w, r, m, err)
}

func (a API) deregister(rt route.Routes, w http.ResponseWriter, r *http.Request) {
	if !a.enabled(w) {
		return
	}
	m, err := a.Control.Deregister(r.Context(), r.PathValue("node"), "admin")
	reply(rt, w, r, m, err)
}
