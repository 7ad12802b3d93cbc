package access

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/tether-dev/tether/hub/metrics"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
)

// Route is how bytes reach a node right now: the node's live tunnel session
// on this hub, the replica holding its tunnel (Remote), or the child site
// hub it is below (site.go); callers (the bastion, jobs) do not know which.
type Route interface {
	// Dial opens a stream to service h on the node and waits for the
	// agent's answer; the stream is then ready for payload bytes.
	Dial(ctx context.Context, h tunnel.Header) (tunnel.Stream, error)
	// String says which route this is, for logs and audit ("local tcp").
	String() string
}

// Remote finds routes through other hub replicas sharing the store.
type Remote interface {
	// Route returns the route to node n through the live replica that
	// holds its tunnel; ok is false when no other replica holds it. The
	// route's Dial fails with a *ReplicaGoneError when that replica
	// stopped answering.
	Route(ctx context.Context, n store.Node) (r Route, ok bool, err error)
}

// ReplicaGoneError says the replica that held a node's tunnel stopped
// answering (its process died and its machine reset the peer link, or the
// link fell silent) and the node has not reconnected to this replica yet:
// its agent moves to a live replica within seconds. It matches ErrOffline,
// so every caller that handles an offline node handles it.
type ReplicaGoneError struct {
	Node    string
	Replica string
	Since   time.Time // when this replica found it gone
	Err     error     // the peer link's error
}

func (e *ReplicaGoneError) Error() string {
	return fmt.Sprintf("node %s was connected to replica %s, which stopped answering at %s; "+
		"it has not reconnected here yet (its agent moves to a live replica within seconds: try again)",
		e.Node, e.Replica, e.Since.UTC().Format(time.RFC3339))
}

// Is makes errors.Is(err, ErrOffline) true.
func (e *ReplicaGoneError) Is(target error) bool { return target == ErrOffline }

// Unwrap is the peer link's error.
func (e *ReplicaGoneError) Unwrap() error { return e.Err }

// SetRemote makes Resolve ask r for nodes whose tunnel is not on this hub.
func (d *Door) SetRemote(r Remote) { d.remote.Store(&r) }

// Resolve finds node ref and its route. The errors match ErrUnknownNode,
// ErrRevoked or ErrOffline (an *OfflineError with the last-seen time); on
// ErrOffline the node is returned too.
//
// Resolve decides nothing about the caller: pair it with an Authorize
// method of this door.
func (d *Door) Resolve(ctx context.Context, ref NodeRef) (store.Node, Route, error) {
	var (
		n   store.Node
		err error
	)
	sites := d.siteSource()
	if ref.id == "" && strings.Contains(ref.name, ".") {
		// Node names are DNS labels: a dotted name is below a site.
		if sites == nil {
			return store.Node{}, nil, refuse(ErrUnknownNode, "no node named %q: this hub has no sites", ref.name)
		}
		return d.resolveSite(ctx, sites, ref)
	}
	if ref.id != "" {
		n, err = d.cfg.Store.GetNode(ctx, ref.id)
	} else {
		n, err = d.cfg.Store.GetNodeByName(ctx, ref.name)
	}
	switch {
	case errors.Is(err, store.ErrNotFound) && ref.id != "" && sites != nil:
		// Jobs and other records key on node IDs, inventory nodes' too.
		return d.resolveSite(ctx, sites, ref)
	case errors.Is(err, store.ErrNotFound) && ref.id != "":
		return store.Node{}, nil, refuse(ErrUnknownNode, "node id %s is not registered (the node was removed)", ref.id)
	case errors.Is(err, store.ErrNotFound):
		return store.Node{}, nil, refuse(ErrUnknownNode, "no node named %q is registered (see `tether nodes`)", ref.name)
	case err != nil:
		return store.Node{}, nil, fmt.Errorf("access: look up %s: %w", ref, err)
	}
	if !n.RevokedAt.IsZero() {
		return n, nil, refuse(ErrRevoked, "node %q was revoked", n.Name)
	}
	c, ok := d.cfg.Conns.Get(n.Name)
	if ok && c.NodeID == n.ID {
		return n, localRoute{c: c, m: d.cfg.Metrics}, nil
	}
	if rp := d.remote.Load(); rp != nil {
		r, ok, err := (*rp).Route(ctx, n)
		if err != nil {
			return n, nil, fmt.Errorf("access: find the replica holding %s: %w", n.Name, err)
		}
		if ok {
			return n, r, nil
		}
	}
	return n, nil, &OfflineError{Node: n.Name, LastSeen: n.LastSeen}
}

// Held returns node nodeID's route if its tunnel is on this hub, never a
// route through another replica: what a replica serves when a peer
// forwards a stream to it.
func (d *Door) Held(ctx context.Context, nodeID string) (Route, error) {
	n, err := d.cfg.Store.GetNode(ctx, nodeID)
	if err != nil {
		return nil, fmt.Errorf("access: node id %s: %w", nodeID, err)
	}
	if !n.RevokedAt.IsZero() {
		return nil, refuse(ErrRevoked, "node %q was revoked", n.Name)
	}
	c, ok := d.cfg.Conns.Get(n.Name)
	if !ok || c.NodeID != n.ID {
		return nil, &OfflineError{Node: n.Name, LastSeen: n.LastSeen}
	}
	return localRoute{c: c, m: d.cfg.Metrics}, nil
}

// localRoute is the node's tunnel session on this hub.
type localRoute struct {
	c *nodeconn.Conn
	m *metrics.Metrics
}

func (r localRoute) Dial(ctx context.Context, h tunnel.Header) (tunnel.Stream, error) {
	st, err := r.c.Dial(ctx, h)
	if r.m != nil {
		result := "ok"
		if err != nil {
			result = "error"
		}
		r.m.StreamsOpened.WithLabelValues(h.Service.String(), result).Inc()
	}
	return st, err
}

func (r localRoute) String() string { return "local " + r.c.Session.Transport().String() }
