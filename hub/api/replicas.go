package api

import (
	"context"
	"net/http"
	"time"
)

// Replicas is what the API knows of hub replicas sharing the store.
type Replicas interface {
	// List returns the replicas, their peer links and the agents each
	// holds; an empty list on a hub that is not a replica.
	List(ctx context.Context) (ReplicaList, error)
	// Holders maps the ID of each node whose tunnel a live replica holds
	// to that replica; nil on a hub that is not a replica.
	Holders(ctx context.Context) (map[string]string, error)
}

// ReplicaList is the body of GET /v1/replicas.
type ReplicaList struct {
	// Self is the ID of the replica that answered ("" if the hub runs
	// alone, without --peer-listen).
	Self     string    `json:"self"`
	Replicas []Replica `json:"replicas"`
}

// Replica is one hub replica as the shared store knows it.
type Replica struct {
	ID   string `json:"id"`
	Self bool   `json:"self"`
	// Health is "ok" while the replica's lease runs, "expired" once it
	// stopped heartbeating (dead, or cut off from the store).
	Health     string    `json:"health"`
	PeerAddr   string    `json:"peer_addr"`
	API        string    `json:"api"`
	SSH        string    `json:"ssh"`
	Version    string    `json:"version"`
	Started    time.Time `json:"started"`
	LeaseUntil time.Time `json:"lease_until"`
	// Links are the replicas it has a live peer link to.
	Links []string `json:"links"`
	// Agents are the names of the nodes whose tunnel it holds.
	Agents []string `json:"agents"`
}

func (h *handler) listReplicas(w http.ResponseWriter, r *http.Request) {
	if h.Replicas == nil {
		writeJSON(w, http.StatusOK, ReplicaList{Replicas: []Replica{}})
		return
	}
	l, err := h.Replicas.List(r.Context())
	if err != nil {
		h.writeErr(w, r, internal("list replicas", err))
		return
	}
	if l.Replicas == nil {
		l.Replicas = []Replica{}
	}
	writeJSON(w, http.StatusOK, l)
}

// ListReplicas returns the hub replicas sharing the store (admin only).
func (c *Client) ListReplicas(ctx context.Context) (ReplicaList, error) {
	var out ReplicaList
	return out, c.do(ctx, http.MethodGet, "/v1/replicas", nil, &out)
}
