package api

import (
	"context"
	"net/http"
	"time"
)

// Site is a site hub below the answering hub, as GET /v1/sites shows it:
// the sub-tree is nested (Sites), each level as its parent last heard it.
type Site struct {
	// Name is the site's name at its parent; Path its name at the
	// answering hub ("berlin", "sub.berlin").
	Name  string `json:"name"`
	Path  string `json:"path"`
	HubID string `json:"hub_id,omitempty"`
	// Health is healthy, degraded or stale (never "failed": a silent site
	// may be cut off, not down).
	Health    string `json:"health"`
	Connected bool   `json:"connected"`
	// LastHeartbeat is when its last status arrived at its parent;
	// AgeSeconds how long ago that was when the answer was built.
	LastHeartbeat time.Time `json:"last_heartbeat,omitzero"`
	AgeSeconds    int64     `json:"age_seconds"`
	// Stale: silent past the stale timeout; StaleSeconds for how long.
	Stale        bool  `json:"stale"`
	StaleSeconds int64 `json:"stale_seconds,omitempty"`
	// UnreachableSince is when its uplink went down (zero while up).
	UnreachableSince time.Time `json:"unreachable_since,omitzero"`
	NodesOnline      int       `json:"nodes_online"`
	NodesTotal       int       `json:"nodes_total"`
	ReceivedMissions int       `json:"received_missions"`
	ActiveMissions   int       `json:"active_missions"`
	// QueuedSince is when the site's statuses started queuing behind a
	// down uplink, as its last status said (zero when they did not).
	QueuedSince time.Time `json:"queued_since,omitzero"`
	Sites       []Site    `json:"sites,omitempty"`
}

// Sites lists the sites below the hub (hub/sites.go).
type Sites interface {
	Sites(ctx context.Context) ([]Site, error)
}

// listSites answers GET /v1/sites to whoever may list nodes.
func (h *handler) listSites(w http.ResponseWriter, r *http.Request, _ caller) {
	if h.Deps.Sites == nil {
		writeJSON(w, http.StatusOK, []Site{})
		return
	}
	out, err := h.Deps.Sites.Sites(r.Context())
	if err != nil {
		h.writeErr(w, r, internal("list sites", err))
		return
	}
	if out == nil {
		out = []Site{}
	}
	writeJSON(w, http.StatusOK, out)
}

// Sites lists the sites below the hub, nested.
func (c *Client) Sites(ctx context.Context) ([]Site, error) {
	var out []Site
	return out, c.do(ctx, http.MethodGet, "/v1/sites", nil, &out)
}
