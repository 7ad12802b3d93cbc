// Package store persists the hub's durable state: nodes, join tokens
// (hashed), operators and roles, the audit log, API tokens, jobs and their
// per-node runs, and cluster memberships. Live sessions are not here; they
// are in the registry.
//
// The Store interface is what the rest of the hub uses. The SQLite
// implementation (sqlite.go: open and encoding helpers; migrations.go: the
// schema) keeps one file per table group, each beside its record type:
// nodes.go, tokens.go, operators.go, roles.go, audit.go, apitokens.go,
// admin.go (hub-wide settings), jobs.go, cluster.go, kubeone.go.
//
// What outlives a connection and belongs to a node (its cluster membership,
// its runs in jobs) is keyed by the node's ID, never by its name: a name is
// free again once the node is removed, and a new machine joining under it
// must inherit nothing.
package store

import (
	"context"
	"errors"
	"time"

	"github.com/tether-dev/tether/tunnel/control"
)

// Sentinel errors callers branch on.
var (
	ErrNotFound     = errors.New("not found")
	ErrNameTaken    = errors.New("name already taken")
	ErrTokenUnknown = errors.New("join token unknown or revoked")
	ErrTokenExpired = errors.New("join token expired")
	ErrTokenUsedUp  = errors.New("join token has no uses left")
)

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
	// the token's labels merged in. The node's name must be free. A site
	// token (Token.IsSite) also creates the site's row in sites.
	Join(ctx context.Context, tokenID string, check func(Token) error, n Node) (Node, error)

	GetNode(ctx context.Context, id string) (Node, error)
	GetNodeByName(ctx context.Context, name string) (Node, error)
	ListNodes(ctx context.Context) ([]Node, error)
	// CountNodes is how many nodes are enrolled and not revoked.
	CountNodes(ctx context.Context) (int, error)
	UpdateNodeSeen(ctx context.Context, id string, s Seen) error
	// MarkAllOffline is called at hub start: no session survives a restart.
	MarkAllOffline(ctx context.Context) error
	DeleteNode(ctx context.Context, id string) error

	// UpdateNodeCert records a renewed certificate.
	UpdateNodeCert(ctx context.Context, id, serial string, expires time.Time) error
	// RevokeNode marks a node refused for good (its record is kept).
	RevokeNode(ctx context.Context, id string, at time.Time) error
	// LabelNodes applies c to the hub-set labels of the nodes with these
	// IDs, atomically, and returns them as changed (ErrNotFound if one is
	// gone; nothing changes then, nor when check refuses a node).
	LabelNodes(ctx context.Context, ids []string, c LabelChange, check func(Node) error) ([]Node, error)
	// SetReportedLabels records the labels a node's agent reported. They
	// are kept apart from the hub-set labels and never select a node.
	SetReportedLabels(ctx context.Context, id string, labels map[string]string) error
	// SetNodeFacts records the facts of a node's latest hello.
	SetNodeFacts(ctx context.Context, id string, facts control.Facts) error

	PutRole(ctx context.Context, r Role) error
	ListRoles(ctx context.Context) ([]Role, error)
	DeleteRole(ctx context.Context, name string) error

	AppendAudit(ctx context.Context, e AuditEvent) error
	ListAudit(ctx context.Context, f AuditFilter) ([]AuditEvent, error)

	AddOperator(ctx context.Context, o Operator) error
	ListOperators(ctx context.Context) ([]Operator, error)
	// RemoveOperator deletes the operator and adds its keys to the revoked keys.
	RemoveOperator(ctx context.Context, name string) error
	// AddOperatorKey registers one more key for operator name (ErrNotFound
	// if there is none; ErrNameTaken if any operator holds the key).
	AddOperatorKey(ctx context.Context, name string, k OperatorKey) error
	// RemoveOperatorKey deletes one of the operator's keys and adds it to
	// the revoked keys; the operator's only key is refused (ErrLastKey).
	RemoveOperatorKey(ctx context.Context, name, fingerprint string) error
	// SetOperatorRoles replaces the operator's roles.
	SetOperatorRoles(ctx context.Context, name string, roles []string) error
	// ListRevokedKeys returns revoked operator keys (authorized_keys format).
	ListRevokedKeys(ctx context.Context) ([]string, error)

	JobStore
	ClusterStore
	KubeOneStore
	APITokenStore
	AdminStore
	OnboardingStore
	UpgradeStore
	ConsoleStore
	ReplicaStore
	LeaseStore
	ChangeStore
	ServiceStore
	SiteStore
	DesiredStore

	Close() error
}
