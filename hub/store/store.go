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
	CreatedAt   time.Time `json:"created_at"`
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

	AddOperator(ctx context.Context, o Operator) error
	ListOperators(ctx context.Context) ([]Operator, error)
	RemoveOperator(ctx context.Context, name string) error

	Close() error
}
