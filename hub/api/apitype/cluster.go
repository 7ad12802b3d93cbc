package apitype

import "time"

// ClusterRegisterRequest is the body of PUT /v1/cluster/{node}.
type ClusterRegisterRequest struct {
	Engine string `json:"engine"`
}

// ClusterMember is a node's cluster membership as the API shows it.
type ClusterMember struct {
	Node    string `json:"node"`              // the node's name
	NodeID  string `json:"node_id,omitempty"` // the node the membership belongs to
	Engine  string `json:"engine"`
	Desired string `json:"desired"` // active | inactive
	// State: inactive, registering, install_in_progress, active,
	// deregistering, uninstall_in_progress.
	State          string    `json:"state"`
	EngineDigest   string    `json:"engine_digest,omitempty"`
	LastTransition time.Time `json:"last_transition,omitzero"`
	LastError      string    `json:"last_error,omitempty"`
	LastJob        string    `json:"last_job,omitempty"`
	UpdatedAt      time.Time `json:"updated_at"`
}
