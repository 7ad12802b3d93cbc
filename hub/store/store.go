// Package store persists the hub's durable state: nodes, join tokens (hashed)
// and operators. Live sessions are not here; they are in the registry.
//
// The Store interface is what the rest of the hub uses; sqlite.go is the
// default implementation (one file in the data dir, pure Go driver).
package store

import (
	"context"
	"errors"
	"time"
)

// Sentinel errors callers branch on.
var (
	ErrNotFound     = errors.New("not found")
	ErrNameTaken    = errors.New("name already taken")
	ErrTokenUnknown = errors.New("join token unknown or revoked")
	ErrTokenExpired = errors.New("join token expired")
	ErrTokenUsedUp  = errors.New("join token has no uses left")
)

// Node is a registered edge node.
type Node struct {
	ID           string            `json:"id"`
	Name         string            `json:"name"`
	Labels       map[string]string `json:"labels"`
	Hostname     string            `json:"hostname"`
	OS           string            `json:"os"`
	Arch         string            `json:"arch"`
	MachineID    string            `json:"machine_id"`
	AgentVersion string            `json:"agent_version"`
	Transport    string            `json:"transport"` // of the live or last session: quic|tcp
	Online       bool              `json:"online"`
	LastSeen     time.Time         `json:"last_seen"`
	CreatedAt    time.Time         `json:"created_at"`
	CertSerial   string            `json:"cert_serial"`
	CertExpires  time.Time         `json:"cert_expires"`
	RevokedAt    time.Time         `json:"revoked_at,omitzero"` // non-zero: refused for good
	// Filled by the API from the cluster members (not stored with the node).
	ClusterEngine string `json:"cluster_engine,omitempty"`
	ClusterState  string `json:"cluster_state,omitempty"`
}

// Token is a join token record; the secret itself is never stored.
type Token struct {
	ID         string            `json:"id"`
	SecretHash []byte            `json:"-"`
	Labels     map[string]string `json:"labels"`
	UsesLeft   int               `json:"uses_left"`
	ExpiresAt  time.Time         `json:"expires_at"`
	CreatedAt  time.Time         `json:"created_at"`
}

// Operator is a person (or tool) allowed to jump through the bastion.
type Operator struct {
	Name        string    `json:"name"`
	PublicKey   string    `json:"public_key"` // authorized_keys format, one key
	Fingerprint string    `json:"fingerprint"`
	Roles       []string  `json:"roles"`
	CreatedAt   time.Time `json:"created_at"`
}

// Role is a node selector plus allowed logins (see hub/roles).
type Role struct {
	Name   string   `json:"name"`
	Nodes  string   `json:"nodes"`
	Logins []string `json:"logins"`
}

// AuditEvent is one entry of the append-only audit log.
type AuditEvent struct {
	ID             int64     `json:"id"`
	At             time.Time `json:"at"`
	Kind           string    `json:"kind"` // join, jump, revoke, remove, operator_add, operator_remove, role_put, role_remove
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

// AuditFilter selects audit events; zero fields do not filter.
type AuditFilter struct {
	Node     string
	Operator string
	Since    time.Time
	Limit    int // newest N, default 1000
}

// Seen is the connection status update for a node.
type Seen struct {
	Online       bool
	Transport    string
	AgentVersion string
	At           time.Time
}

// Store is the hub's durable state.
type Store interface {
	// CreateToken stores a new join token.
	CreateToken(ctx context.Context, t Token) error
	ListTokens(ctx context.Context) ([]Token, error)
	// GetToken returns join token id (ErrNotFound if there is none), for
	// the join endpoint to authenticate a request before it signs anything.
	GetToken(ctx context.Context, id string) (Token, error)
	DeleteToken(ctx context.Context, id string) error

	// Join atomically checks and consumes one use of token id (check compares
	// the secret and is called inside the transaction), and creates node with
	// the token's labels merged in. The node's name must be free.
	Join(ctx context.Context, tokenID string, check func(Token) error, n Node) (Node, error)

	GetNode(ctx context.Context, id string) (Node, error)
	GetNodeByName(ctx context.Context, name string) (Node, error)
	ListNodes(ctx context.Context) ([]Node, error)
	UpdateNodeSeen(ctx context.Context, id string, s Seen) error
	// MarkAllOffline is called at hub start: no session survives a restart.
	MarkAllOffline(ctx context.Context) error
	DeleteNode(ctx context.Context, id string) error

	// UpdateNodeCert records a renewed certificate.
	UpdateNodeCert(ctx context.Context, id, serial string, expires time.Time) error
	// RevokeNode marks a node refused for good (its record is kept).
	RevokeNode(ctx context.Context, id string, at time.Time) error

	PutRole(ctx context.Context, r Role) error
	ListRoles(ctx context.Context) ([]Role, error)
	DeleteRole(ctx context.Context, name string) error

	AppendAudit(ctx context.Context, e AuditEvent) error
	ListAudit(ctx context.Context, f AuditFilter) ([]AuditEvent, error)

	AddOperator(ctx context.Context, o Operator) error
	ListOperators(ctx context.Context) ([]Operator, error)
	// RemoveOperator deletes the operator and adds its key to the revoked keys.
	RemoveOperator(ctx context.Context, name string) error
	// ListRevokedKeys returns revoked operator keys (authorized_keys format).
	ListRevokedKeys(ctx context.Context) ([]string, error)

	JobStore
	ClusterStore
	APITokenStore
	AdminStore

	Close() error
}
