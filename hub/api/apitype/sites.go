package apitype

import "time"

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
