package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/tether-dev/tether/hub/store"
)

// Cluster drives nodes' Kubernetes engine membership (seed 001 state
// machine).
type Cluster interface {
	// Register sets a node's desired state to active with engine.
	Register(ctx context.Context, node, engine, by string) (store.ClusterMember, error)
	// Deregister sets a node's desired state to inactive.
	Deregister(ctx context.Context, node, by string) (store.ClusterMember, error)
	// Engines lists the engine names known now.
	Engines() ([]string, error)
}

// ClusterRegisterRequest is the body of PUT /v1/cluster/{node}.
type ClusterRegisterRequest struct {
	Engine string `json:"engine"`
}

// ClusterMember is a cluster membership as the API shows it.
type ClusterMember = store.ClusterMember

func (h *handler) clusterEnabled(w http.ResponseWriter) bool {
	if h.Cluster == nil {
		writeError(w, http.StatusNotFound, "the cluster controller is not enabled on this hub")
		return false
	}
	return true
}

func clusterReply(w http.ResponseWriter, m store.ClusterMember, err error) {
	switch {
	case errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, err.Error())
	case errors.Is(err, ErrInvalid):
		writeError(w, http.StatusBadRequest, err.Error())
	case errors.Is(err, ErrConflict):
		writeError(w, http.StatusConflict, err.Error())
	case err != nil:
		writeError(w, http.StatusInternalServerError, err.Error())
	default:
		writeJSON(w, http.StatusOK, m)
	}
}

func (h *handler) clusterRegister(w http.ResponseWriter, r *http.Request) {
	var req ClusterRegisterRequest
	if !decode(w, r, &req) || !h.clusterEnabled(w) {
		return
	}
	if req.Engine == "" {
		names, _ := h.Cluster.Engines()
		writeError(w, http.StatusBadRequest, fmt.Sprintf("engine is required (known: %v)", names))
		return
	}
	m, err := h.Cluster.Register(r.Context(), r.PathValue("node"), req.Engine, "admin")
	clusterReply(w, m, err)
}

func (h *handler) clusterDeregister(w http.ResponseWriter, r *http.Request) {
	if !h.clusterEnabled(w) {
		return
	}
	m, err := h.Cluster.Deregister(r.Context(), r.PathValue("node"), "admin")
	clusterReply(w, m, err)
}
