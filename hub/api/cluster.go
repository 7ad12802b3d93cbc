package api

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/tether-dev/tether/hub/store"
)

// Cluster drives nodes' Kubernetes engine membership through the
// cluster-agent state machine (inactive → registering → install_in_progress
// → active → deregistering → uninstall_in_progress). Requests name a node;
// the membership belongs to the ID of the node holding that name.
// Implementations wrap cluster.ErrInvalid, cluster.ErrConflict and
// store.ErrNotFound (statusOf answers 400, 409 and 404).
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

// ClusterMember is a node's cluster membership as the API shows it.
type ClusterMember struct {
	Node           string    `json:"node"`              // the node's name
	NodeID         string    `json:"node_id,omitempty"` // the node the membership belongs to
	Engine         string    `json:"engine"`
	Desired        string    `json:"desired"` // active | inactive
	State          string    `json:"state"`   // inactive, registering, install_in_progress, active, deregistering, uninstall_in_progress
	EngineDigest   string    `json:"engine_digest,omitempty"`
	LastTransition time.Time `json:"last_transition,omitzero"`
	LastError      string    `json:"last_error,omitempty"`
	LastJob        string    `json:"last_job,omitempty"`
	UpdatedAt      time.Time `json:"updated_at"`
}

func clusterMemberFrom(m store.ClusterMember) ClusterMember {
	return ClusterMember{Node: m.Node, NodeID: m.NodeID, Engine: m.Engine, Desired: m.Desired, State: m.State,
		EngineDigest: m.EngineDigest, LastTransition: m.LastTransition, LastError: m.LastError, LastJob: m.LastJob, UpdatedAt: m.UpdatedAt}
}

func (h *handler) clusterEnabled(w http.ResponseWriter) bool {
	if h.Cluster == nil {
		writeError(w, http.StatusNotFound, "the cluster controller is not enabled on this hub")
		return false
	}
	return true
}

// clusterReply answers a register or deregister: the member, or the error
// through the API's one mapping (statusOf).
func (h *handler) clusterReply(w http.ResponseWriter, r *http.Request, m store.ClusterMember, err error) {
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, clusterMemberFrom(m))
}

func (h *handler) clusterStatus(w http.ResponseWriter, r *http.Request) {
	list(func(ctx context.Context) ([]ClusterMember, error) {
		members, err := h.Store.ListClusterMembers(ctx)
		return mapSlice(members, clusterMemberFrom), err
	})(w, r)
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
	h.clusterReply(w, r, m, err)
}

func (h *handler) clusterDeregister(w http.ResponseWriter, r *http.Request) {
	if !h.clusterEnabled(w) {
		return
	}
	m, err := h.Cluster.Deregister(r.Context(), r.PathValue("node"), "admin")
	h.clusterReply(w, r, m, err)
}
