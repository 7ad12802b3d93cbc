package apitype

import (
	"time"
)

// The API's own types: what clients read, converted explicitly from the
// store's records so that a schema change (or a secret-bearing column) is
// never on the wire by accident. JSON names are the API's contract
// (openapi.yaml); keep them when the store changes.

// Node is a node as the API shows it.
type Node struct {
	ID     string            `json:"id"`
	Name   string            `json:"name"`
	Labels map[string]string `json:"labels"`
	// ReportedLabels are what the node's agent says about itself (its
	// labels file): shown, never used to select the node for access.
	ReportedLabels map[string]string `json:"reported_labels,omitempty"`
	Hostname       string            `json:"hostname"`
	OS             string            `json:"os"`
	Arch           string            `json:"arch"`
	MachineID      string            `json:"machine_id"`
	AgentVersion   string            `json:"agent_version"`
	// Transport is the live or last session's: quic|tcp, with the agent's
	// why in parentheses ("tcp (udp blocked, re-probing)", "quic (moved
	// from tcp 12:03)").
	Transport   string    `json:"transport"`
	Online      bool      `json:"online"`
	LastSeen    time.Time `json:"last_seen"`
	CreatedAt   time.Time `json:"created_at"`
	CertSerial  string    `json:"cert_serial"`
	CertExpires time.Time `json:"cert_expires"`
	RevokedAt   time.Time `json:"revoked_at,omitzero"` // non-zero: refused for good
	// From the node's cluster membership, if any.
	ClusterEngine string `json:"cluster_engine,omitempty"`
	ClusterState  string `json:"cluster_state,omitempty"`
	// Site is the node's site (NodeSite): for a node below a site hub
	// the site as this hub names it ("berlin", "sub.berlin"), for the
	// hub's own nodes their hub-set site label; empty without one.
	Site string `json:"site,omitempty"`
}

// Token is a join token as the API shows it (never the secret).
type Token struct {
	ID        string            `json:"id"`
	Labels    map[string]string `json:"labels"`
	UsesLeft  int               `json:"uses_left"`
	ExpiresAt time.Time         `json:"expires_at"`
	CreatedAt time.Time         `json:"created_at"`
	Kind      string            `json:"kind"` // node or site
}

// Operator is an operator as the API shows it.
type Operator struct {
	Name string `json:"name"`
	// PublicKey and Fingerprint are the operator's first key (Keys[0]).
	PublicKey   string        `json:"public_key"` // authorized_keys format, one key
	Fingerprint string        `json:"fingerprint"`
	Keys        []OperatorKey `json:"keys"` // every key of the operator, oldest first
	Roles       []string      `json:"roles"`
	CreatedAt   time.Time     `json:"created_at"`
}

// OperatorKey is one of an operator's SSH public keys.
type OperatorKey struct {
	PublicKey   string    `json:"public_key"` // authorized_keys format
	Fingerprint string    `json:"fingerprint"`
	AddedAt     time.Time `json:"added_at"`
}

// Role is a role as the API shows it: a node selector and the logins it
// allows on the nodes it selects.
type Role struct {
	Name       string   `json:"name"`
	Nodes      string   `json:"nodes"`
	Logins     []string `json:"logins"`
	Forwarding bool     `json:"forwarding"` // port forwarding allowed
	Confirm    bool     `json:"confirm"`    // may confirm upgrades waiting on its nodes
	// Services are its service-tunnel permissions on its nodes: expose, connect.
	Services []string `json:"services"`
}

// AuditEvent is an audit log entry as the API shows it.
type AuditEvent struct {
	ID             int64     `json:"id"`
	At             time.Time `json:"at"`
	Kind           string    `json:"kind"` // see SECURITY.md, "Audited changes"
	Operator       string    `json:"operator,omitempty"`
	Node           string    `json:"node,omitempty"`
	KeyFingerprint string    `json:"key_fingerprint,omitempty"`
	Remote         string    `json:"remote,omitempty"`
	Result         string    `json:"result"`
	Detail         string    `json:"detail,omitempty"`
	EndedAt        time.Time `json:"ended_at,omitzero"`
	BytesToNode    int64     `json:"bytes_to_node,omitempty"`
	BytesFromNode  int64     `json:"bytes_from_node,omitempty"`
}

// APIToken is an API token as listings show it (no secret).
type APIToken struct {
	ID          string    `json:"id"`
	Role        string    `json:"role"`
	Description string    `json:"description,omitempty"`
	CreatedAt   time.Time `json:"created_at"`
	ExpiresAt   time.Time `json:"expires_at,omitzero"`
}
