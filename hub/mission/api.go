package mission

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/desired"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// Missions is what /v1/missions does (Ops: the manager over the
// desired-state sync).
type Missions interface {
	// Create stores a mission created at this hub (a changed spec is its
	// next generation) and sends it down the tree.
	Create(ctx context.Context, req CreateRequest, by string) (Detail, error)
	// List lists the missions this hub holds: created here or received.
	List(ctx context.Context) ([]Summary, error)
	// Get returns one mission with its state per site and per node
	// (origin "": the one created here, else the only one of that name).
	Get(ctx context.Context, origin, name string) (Detail, error)
	// Delete writes the tombstone of a mission created at this hub.
	Delete(ctx context.Context, name, by string) (siteproto.DesiredObject, error)
}

// API serves /v1/missions, admin only: a mission makes every matching
// node below this hub run a script.
type API struct {
	// Missions is nil on a hub that serves no missions: 404.
	Missions Missions

	rt route.Routes
}

// Register implements route.Feature.
func (a *API) Register(rt route.Routes) {
	a.rt = rt
	rt.Handle("POST /v1/missions", rt.Admin(a.create))
	rt.Handle("GET /v1/missions", rt.Admin(a.list))
	rt.Handle("GET /v1/missions/{name}", rt.Admin(a.get))
	rt.Handle("DELETE /v1/missions/{name}", rt.Admin(a.delete))
}

// maxMissionBody bounds POST /v1/missions: the largest spec and its
// JSON escaping.
const maxMissionBody = 2*siteproto.MaxDesiredSpec + route.MaxBody

func (a *API) served(w http.ResponseWriter, r *http.Request) bool {
	if a.Missions == nil {
		a.rt.Error(w, r, route.Fail(apitype.ErrNotFound, "missions are not served by this hub"))
		return false
	}
	return true
}

// apiErr classifies the missions' errors.
func apiErr(err error) error {
	switch {
	case errors.Is(err, ErrInvalid), errors.Is(err, desired.ErrInvalid):
		return route.Fail(apitype.ErrInvalid, "%s", route.Clean(err))
	case errors.Is(err, ErrNotFound):
		return route.Fail(apitype.ErrNotFound, "%s", route.Clean(err))
	}
	return err
}

func (a *API) create(w http.ResponseWriter, r *http.Request) {
	if !a.served(w, r) {
		return
	}
	var req apitype.MissionCreateRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxMissionBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		route.JSON(w, http.StatusBadRequest, apitype.ErrorResponse{Error: "invalid request body: " + err.Error()})
		return
	}
	d, err := a.Missions.Create(r.Context(), CreateRequest(req), "admin:"+route.AdminName(r))
	if err != nil {
		a.rt.Error(w, r, apiErr(err))
		return
	}
	status := http.StatusOK
	if d.Created {
		status = http.StatusCreated
	}
	route.JSON(w, status, d)
}

func (a *API) list(w http.ResponseWriter, r *http.Request) {
	if !a.served(w, r) {
		return
	}
	out, err := a.Missions.List(r.Context())
	if err != nil {
		a.rt.Error(w, r, route.Internal("list missions", err))
		return
	}
	if out == nil {
		out = []Summary{}
	}
	route.JSON(w, http.StatusOK, out)
}

func (a *API) get(w http.ResponseWriter, r *http.Request) {
	if !a.served(w, r) {
		return
	}
	d, err := a.Missions.Get(r.Context(), r.URL.Query().Get("origin"), r.PathValue("name"))
	if err != nil {
		a.rt.Error(w, r, apiErr(err))
		return
	}
	route.JSON(w, http.StatusOK, d)
}

func (a *API) delete(w http.ResponseWriter, r *http.Request) {
	if !a.served(w, r) {
		return
	}
	o, err := a.Missions.Delete(r.Context(), r.PathValue("name"), "admin:"+route.AdminName(r))
	if err != nil {
		a.rt.Error(w, r, apiErr(err))
		return
	}
	route.JSON(w, http.StatusOK, o)
}
