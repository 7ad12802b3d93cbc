package api

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/tether-dev/tether/hub/desired"
	"github.com/tether-dev/tether/hub/mission"
	"github.com/tether-dev/tether/tunnel/control"
)

// Missions is the mission service behind /v1/missions (hub/mission over
// hub/desired).
type Missions interface {
	// Create stores a mission created at this hub (a changed spec is its
	// next generation) and sends it down the tree.
	Create(ctx context.Context, req mission.CreateRequest, by string) (mission.Detail, error)
	// List lists the missions this hub holds: created here or received.
	List(ctx context.Context) ([]mission.Summary, error)
	// Get returns one mission with its state per site and per node
	// (origin "": the one created here, else the only one of that name).
	Get(ctx context.Context, origin, name string) (mission.Detail, error)
	// Delete writes the tombstone of a mission created at this hub.
	Delete(ctx context.Context, name, by string) (control.DesiredObject, error)
}

// MissionCreateRequest is the body of POST /v1/missions.
type MissionCreateRequest = mission.CreateRequest

// Mission is a mission in a list (GET /v1/missions).
type Mission = mission.Summary

// MissionDetail answers GET and POST /v1/missions[/{name}].
type MissionDetail = mission.Detail

// maxMissionBody bounds POST /v1/missions: the largest spec and its
// JSON escaping.
const maxMissionBody = 2*control.MaxDesiredSpec + maxBody

func (h *handler) missionsOr404(w http.ResponseWriter, r *http.Request) bool {
	if h.Missions == nil {
		h.writeErr(w, r, fail(ErrNotFound, "missions are not served by this hub"))
		return false
	}
	return true
}

// missionErr classifies the mission service's errors.
func missionErr(err error) error {
	switch {
	case errors.Is(err, mission.ErrInvalid), errors.Is(err, desired.ErrInvalid):
		return fail(ErrInvalid, "%s", clean(err))
	case errors.Is(err, mission.ErrNotFound):
		return fail(ErrNotFound, "%s", clean(err))
	}
	return err
}

func (h *handler) createMission(w http.ResponseWriter, r *http.Request) {
	if !h.missionsOr404(w, r) {
		return
	}
	var req MissionCreateRequest
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxMissionBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid request body: "+err.Error())
		return
	}
	d, err := h.Missions.Create(r.Context(), req, "admin:"+adminName(r))
	if err != nil {
		h.writeErr(w, r, missionErr(err))
		return
	}
	status := http.StatusOK
	if d.Created {
		status = http.StatusCreated
	}
	writeJSON(w, status, d)
}

func (h *handler) listMissions(w http.ResponseWriter, r *http.Request) {
	if !h.missionsOr404(w, r) {
		return
	}
	out, err := h.Missions.List(r.Context())
	if err != nil {
		h.writeErr(w, r, internal("list missions", err))
		return
	}
	if out == nil {
		out = []Mission{}
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *handler) getMission(w http.ResponseWriter, r *http.Request) {
	if !h.missionsOr404(w, r) {
		return
	}
	d, err := h.Missions.Get(r.Context(), r.URL.Query().Get("origin"), r.PathValue("name"))
	if err != nil {
		h.writeErr(w, r, missionErr(err))
		return
	}
	writeJSON(w, http.StatusOK, d)
}

func (h *handler) deleteMission(w http.ResponseWriter, r *http.Request) {
	if !h.missionsOr404(w, r) {
		return
	}
	o, err := h.Missions.Delete(r.Context(), r.PathValue("name"), "admin:"+adminName(r))
	if err != nil {
		h.writeErr(w, r, missionErr(err))
		return
	}
	writeJSON(w, http.StatusOK, o)
}
