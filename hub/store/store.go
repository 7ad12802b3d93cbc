// Package store persists the hub's durable state: what must survive a
// restart or be shared by the hub's replicas (nodes, join tokens, operators
// and roles, the audit log, jobs, clusters, upgrades, sites and more). Live
// sessions are not here: they end with their connection.
//
// Store is what the rest of the hub uses. It is the sum of one small
// interface per domain (NodeStore, OperatorStore, JobStore, ...), each
// declared beside its records, so a feature asks for the part it uses. DB
// implements Store for both backends, every query written once in SQLite's
// SQL: Open picks SQLite (the default, one file in the data directory) or
// PostgreSQL (one database shared by replicas) from the --store value.
//
// The schema is the migrations list, one entry per version; pgMigrations
// holds PostgreSQL's version of each, and TestMigrationsInStep keeps the
// two in step. A schema change is one more entry in each.
//
// What outlives a connection and belongs to a node (its cluster membership,
// its runs in jobs) is keyed by the node's ID, never by its name: a name is
// free again once the node is removed, and a new machine joining under it
// must inherit nothing.
package store

import "errors"

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
	NodeStore
	TokenStore
	RoleStore
	AuditStore
	OperatorStore
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
