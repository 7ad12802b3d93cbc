// Package access is the one door to a node. Every path that reaches a node
// (an operator's jump through the bastion, a job's SSH connection, and
// whatever comes later: upgrades, KubeOne runs, missions, a browser
// terminal) asks it the same two questions: may this caller reach node N
// (authorize.go holds every such decision, in one file a reviewer can read
// top to bottom), and what is N's route (route.go: today the live session
// on this hub; a peer replica or a site hub below plug in there as other
// routes, and no caller learns about them).
//
// Decisions read an immutable Snapshot of operators, roles (selectors parsed
// once per change), revoked keys and the KubeOne clusters' identities. Reload rebuilds it when any of them
// changes, so a decision costs neither a store read nor a selector parse.
package access

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
)

// Sentinel errors callers branch on. Errors returned by the door wrap one of
// them and read as a sentence a person can act on.
var (
	// ErrUnknownNode: no node with that name or ID is registered.
	ErrUnknownNode = errors.New("unknown node")
	// ErrRevoked: the node is registered but refused for good.
	ErrRevoked = errors.New("node revoked")
	// ErrDenied: the caller's roles do not allow what it asked.
	ErrDenied = errors.New("access denied")
	// ErrOffline is matched by every *OfflineError.
	ErrOffline = errors.New("node offline")
)

// refusal is an error with a complete message that still matches its kind
// with errors.Is.
type refusal struct {
	kind error
	msg  string
}

func (r *refusal) Error() string { return r.msg }
func (r *refusal) Unwrap() error { return r.kind }

func refuse(kind error, format string, args ...any) error {
	return &refusal{kind: kind, msg: fmt.Sprintf(format, args...)}
}

// OfflineError says a node is registered but has no route right now.
type OfflineError struct {
	Node     string
	LastSeen time.Time // zero: never connected
}

func (e *OfflineError) Error() string { return fmt.Sprintf("node %q is %s", e.Node, e.Reason()) }

// Reason is the error without the node's name: "offline (last seen 3m0s
// ago)" or "offline (never connected)".
func (e *OfflineError) Reason() string {
	if e.LastSeen.IsZero() {
		return "offline (never connected)"
	}
	return fmt.Sprintf("offline (last seen %s ago)", time.Since(e.LastSeen).Round(time.Second))
}

// Is makes errors.Is(err, ErrOffline) true.
func (e *OfflineError) Is(target error) bool { return target == ErrOffline }

// NodeRef names a node by ID (records that outlive a connection: job
// targets, cluster members) or by name (what people type).
type NodeRef struct {
	id, name string
}

// ByID refers to the node with this ID, whatever its name is now.
func ByID(id string) NodeRef { return NodeRef{id: id} }

// ByName refers to the node registered under this name.
func ByName(name string) NodeRef { return NodeRef{name: name} }

func (r NodeRef) String() string {
	if r.id != "" {
		return "node id " + r.id
	}
	return "node " + r.name
}

// Store is the part of the hub's store the door reads.
type Store interface {
	GetNode(ctx context.Context, id string) (store.Node, error)
	GetNodeByName(ctx context.Context, name string) (store.Node, error)
	ListOperators(ctx context.Context) ([]store.Operator, error)
	ListRoles(ctx context.Context) ([]store.Role, error)
	ListRevokedKeys(ctx context.Context) ([]string, error)
	ListKubeOneClusters(ctx context.Context) ([]store.KubeOneCluster, error)
}

// Config is what the door works with.
type Config struct {
	Store Store
	Conns *nodeconn.Table
	// UserCAs returns the trusted SSH user CA keys (several during a
	// rotation overlap); user certificates must be signed by one.
	UserCAs func() []gossh.PublicKey
	// ProvisionLogin is the login the hub's jobs use on nodes unless a
	// node's ProvisionLoginLabel names another.
	ProvisionLogin string
	Metrics        *metrics.Metrics // nil disables
	Logger         *slog.Logger     // nil discards
}

// CheckAndSetDefaults validates c and fills defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.Store == nil || c.Conns == nil || c.UserCAs == nil {
		return errors.New("access: Store, Conns and UserCAs are required")
	}
	if c.ProvisionLogin == "" {
		c.ProvisionLogin = "root"
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Door answers who may reach which node, and how.
type Door struct {
	cfg    Config
	remote atomic.Pointer[Remote] // set once replicas serve peers (SetRemote)
	sites  atomic.Pointer[Sites]  // set when the hub takes child sites (SetSites)
	snap   atomic.Pointer[Snapshot]
	gen    atomic.Uint64
}

// New builds a door and loads its first snapshot.
func New(ctx context.Context, cfg Config) (*Door, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	d := &Door{cfg: cfg}
	if _, err := d.Reload(ctx); err != nil {
		return nil, err
	}
	return d, nil
}

// Snapshot is the access state decisions are made on now.
func (d *Door) Snapshot() *Snapshot { return d.snap.Load() }

// Reload rebuilds the snapshot from the store (a few reads, whatever the
// number of nodes) and makes it current. Call it after any change of
// operators, roles, revoked keys or KubeOne clusters.
func (d *Door) Reload(ctx context.Context) (*Snapshot, error) {
	s, err := load(ctx, d.cfg.Store, d.gen.Add(1), d.cfg.ProvisionLogin, d.cfg.Logger)
	if err != nil {
		return nil, fmt.Errorf("access: reload operators and roles: %w", err)
	}
	// Two reloads may race; keep the newer.
	for {
		cur := d.snap.Load()
		if cur != nil && cur.Generation > s.Generation {
			return cur, nil
		}
		if d.snap.CompareAndSwap(cur, s) {
			return s, nil
		}
	}
}
