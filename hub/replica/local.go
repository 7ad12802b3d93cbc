package replica

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// Local is this hub's place among the replicas sharing its store: its peer
// links once it has joined (never, for a hub without --peer-listen), the
// presence of the node sessions it holds, and what `tether replicas` lists.
type Local struct {
	id    string
	store LocalStore
	conns *nodeconn.Table
	peers atomic.Pointer[Peers] // nil until Join
}

// LocalStore is what Local reads of the store.
type LocalStore interface {
	GetNode(ctx context.Context, id string) (store.Node, error)
	ListPresence(ctx context.Context) ([]store.Presence, error)
	ListReplicas(ctx context.Context) ([]store.Replica, error)
	ListNodes(ctx context.Context) ([]store.Node, error)
}

// NewLocal returns replica id's view of the replicas on st; conns are the
// node sessions it holds.
func NewLocal(id string, st LocalStore, conns *nodeconn.Table) *Local {
	return &Local{id: id, store: st, conns: conns}
}

// ID names this hub among the replicas.
func (l *Local) ID() string { return l.id }

// Join joins the replica set: peer listener, lease and presence, recording
// self (this replica's API and bastion addresses). The returned Peers are
// closed by the caller.
func (l *Local) Join(ctx context.Context, cfg Config, self store.Replica) (*Peers, error) {
	cfg.ID = l.id
	p, err := New(ctx, cfg)
	if err != nil {
		return nil, err
	}
	if err := p.Start(ctx, self); err != nil {
		p.Close()
		return nil, err
	}
	l.peers.Store(p)
	return p, nil
}

// SessionInfo is what other replicas need of a node's live session here
// (presence's Session): what its agent's hello said for the jobs, cluster
// and upgrade code that runs on whichever replica.
type SessionInfo struct {
	StateDir     string                `json:"state_dir,omitempty"`
	AgentVersion string                `json:"agent_version,omitempty"`
	Arch         string                `json:"arch,omitempty"`
	Upgrade      *upgradeproto.Support `json:"upgrade,omitempty"`
	// Poke is the QUIC session's tunnel.PokeTarget, as text: a replica
	// that finds this one dead pokes the agent over (watch.go).
	Poke string `json:"poke,omitempty"`
}

// SessionInfoOf is c's SessionInfo.
func SessionInfoOf(c *nodeconn.Conn) SessionInfo {
	info := SessionInfo{StateDir: c.StateDir, AgentVersion: c.AgentVersion, Arch: c.Arch, Upgrade: c.Upgrade}
	if t, ok := tunnel.PokeTargetOf(c.Session); ok {
		info.Poke = t.String()
	}
	return info
}

// StateDir is the state directory the node's connected agent reported,
// here or on the replica holding it.
func (l *Local) StateDir(nodeID string) string {
	c, _ := l.Session(context.Background(), nodeID)
	return c.StateDir
}

// Hold is the HoldFunc of a replica whose door is door: the operator or job
// was authorized on the replica that forwards the stream; here only the
// node must be one whose tunnel this replica holds.
func (l *Local) Hold(door interface {
	Held(ctx context.Context, nodeID string) (access.Route, error)
}) HoldFunc {
	return func(ctx context.Context, nodeID string, h tunnel.Header) (tunnel.Stream, error) {
		r, err := door.Held(ctx, nodeID)
		if err != nil {
			return nil, fmt.Errorf("replica %s does not hold this node: %w", l.id, err)
		}
		return r.Dial(ctx, h)
	}
}

// Connected records that this replica holds c's node (nothing on a hub
// that is not a replica).
func (l *Local) Connected(ctx context.Context, c *nodeconn.Conn) store.Presence {
	p := l.peers.Load()
	if p == nil {
		return store.Presence{}
	}
	b, _ := json.Marshal(SessionInfoOf(c))
	return p.Connected(ctx, c.NodeID, b)
}

// Disconnected ends a presence Connected returned.
func (l *Local) Disconnected(pr store.Presence) {
	if p := l.peers.Load(); p != nil {
		p.Disconnected(pr)
	}
}

// Session is node nodeID's session as this replica's table has it, or as
// the replica holding it recorded it.
func (l *Local) Session(ctx context.Context, nodeID string) (SessionInfo, bool) {
	n, err := l.store.GetNode(ctx, nodeID)
	if err != nil {
		return SessionInfo{}, false
	}
	if c, ok := l.conns.Get(n.Name); ok && c.NodeID == nodeID {
		return SessionInfoOf(c), true
	}
	p := l.peers.Load()
	if p == nil {
		return SessionInfo{}, false
	}
	pr, ok := p.Held(ctx, nodeID)
	var info SessionInfo
	if !ok || json.Unmarshal(pr.Session, &info) != nil {
		return SessionInfo{}, false
	}
	return info, true
}

// Hubs are the addresses agents dial for the live replicas sharing the
// store, this one's first, as of the last heartbeat (Peers.Hubs): the
// welcome announces them. Nil on a hub that is not a replica.
func (l *Local) Hubs() []string {
	if p := l.peers.Load(); p != nil {
		return p.Hubs()
	}
	return nil
}

// JoinHubs are Hubs as the store has them now, which join strings and new
// nodes' configs name (the last heartbeat's if the store cannot be read).
// Nil on a hub that is not a replica.
func (l *Local) JoinHubs(ctx context.Context) []string {
	p := l.peers.Load()
	if p == nil {
		return nil
	}
	hubs, _ := p.LiveHubs(ctx)
	return hubs
}

// Holders maps the ID of each node whose tunnel a live replica holds to
// that replica; nil on a hub that is not a replica.
func (l *Local) Holders(ctx context.Context) (map[string]string, error) {
	if l.peers.Load() == nil {
		return nil, nil
	}
	ps, err := l.store.ListPresence(ctx)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	out := make(map[string]string, len(ps))
	for _, p := range ps {
		if p.Live(now) {
			out[p.NodeID] = p.ReplicaID
		}
	}
	return out, nil
}

// List is the replicas, their peer links and the agents each holds; an
// empty list on a hub that is not a replica.
func (l *Local) List(ctx context.Context) (apitype.ReplicaList, error) {
	if l.peers.Load() == nil {
		return apitype.ReplicaList{}, nil
	}
	reps, err := l.store.ListReplicas(ctx)
	if err != nil {
		return apitype.ReplicaList{}, err
	}
	holders, err := l.Holders(ctx)
	if err != nil {
		return apitype.ReplicaList{}, err
	}
	nodes, err := l.store.ListNodes(ctx)
	if err != nil {
		return apitype.ReplicaList{}, err
	}
	names := make(map[string]string, len(nodes))
	for _, n := range nodes {
		names[n.ID] = n.Name
	}
	held := map[string][]string{}
	for id, rep := range holders {
		if name, ok := names[id]; ok {
			held[rep] = append(held[rep], name)
		}
	}
	now := time.Now()
	out := apitype.ReplicaList{Self: l.id}
	for _, rep := range reps {
		health := "ok"
		if !rep.LeaseUntil.After(now) {
			health = "expired"
		}
		agents := held[rep.ID]
		if agents == nil {
			agents = []string{}
		}
		slices.Sort(agents)
		links := rep.Links
		if rep.ID == l.id {
			links = l.peers.Load().Links()
		}
		if links == nil {
			links = []string{}
		}
		hubs := rep.Hubs
		if hubs == nil {
			hubs = []string{}
		}
		out.Replicas = append(out.Replicas, apitype.Replica{ID: rep.ID, Self: rep.ID == l.id, Health: health,
			PeerAddr: rep.PeerAddr, API: rep.APIAddr, SSH: rep.SSHAddr, Version: rep.Version, Started: rep.Started,
			LeaseUntil: rep.LeaseUntil, Links: links, Agents: agents, Hubs: hubs})
	}
	return out, nil
}

// Peers are one of the door's routes: through the replica holding a node.
var _ access.Remote = (*Peers)(nil)
