package hub

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/registry"
	"github.com/tether-dev/tether/hub/replica"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// ReplicaIDFile is the data-dir file that keeps a replica's generated ID
// across restarts (--replica-id overrides it).
const ReplicaIDFile = "replica-id"

// identityFiles are the data-dir files every replica presents alike: the
// TLS CA (root and intermediate, whose pin join strings carry), the SSH
// host and user CAs, the bastion's host key, and the QUIC stateless-reset
// key.
var identityFiles = []string{
	"ca/" + ca.CertFile, "ca/" + ca.KeyFile, "ca/" + ca.IntermediateCertFile, "ca/" + ca.IntermediateKeyFile,
	"ca/" + ca.SSHHostCAFile, "ca/" + ca.SSHHostCAFile + ".pub", "ca/" + ca.SSHUserCAFile, "ca/" + ca.SSHUserCAFile + ".pub",
	hostKeyFile, resetKeyFile,
}

const (
	hostKeyFile  = "ssh_host_ed25519_key"
	resetKeyFile = "quic_reset.key"
)

// createIdentity makes the hub identity's files in dir, keeping those
// that exist (what New does on a single hub's first start).
func createIdentity(dir string) error {
	if _, err := ca.LoadOrCreate(filepath.Join(dir, "ca"), "Tether"); err != nil {
		return err
	}
	for _, f := range []string{ca.SSHHostCAFile, ca.SSHUserCAFile} {
		if _, err := ca.LoadOrCreateSSH(filepath.Join(dir, "ca"), f); err != nil {
			return err
		}
	}
	if _, err := loadOrCreateHostKey(filepath.Join(dir, hostKeyFile)); err != nil {
		return err
	}
	_, err := loadOrCreateSecret(filepath.Join(dir, resetKeyFile))
	return err
}

// replicaID is the configured ID, or the one kept in the data dir (made
// on the first start).
func replicaID(dataDir, configured string) (string, error) {
	if configured != "" {
		return configured, pki.ValidateName(configured)
	}
	path := filepath.Join(dataDir, ReplicaIDFile)
	b, err := os.ReadFile(path)
	if err == nil {
		id := strings.TrimSpace(string(b))
		if err := pki.ValidateName(id); err != nil {
			return "", fmt.Errorf("hub: %s: %w", path, err)
		}
		return id, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("hub: %w", err)
	}
	var r [4]byte
	if _, err := rand.Read(r[:]); err != nil {
		return "", err
	}
	id := "r-" + hex.EncodeToString(r[:])
	if err := pki.WriteFileAtomic(path, []byte(id+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("hub: %w", err)
	}
	return id, nil
}

// startPeers joins the replica set: peer listener, lease, presence, and
// the door's routes through other replicas. apiAddr and sshAddr are this
// replica's bound API and bastion listeners, recorded for `tether replicas`.
// It returns the stop function.
func (s *Server) startPeers(ctx context.Context, apiAddr, sshAddr net.Addr) (func(), error) {
	self := store.Replica{APIAddr: ownAddr(apiAddr), SSHAddr: ownAddr(sshAddr), Version: Version}
	p, err := replica.New(ctx, replica.Config{
		ID: s.replicaID, Store: s.store, CA: s.ca, Listen: s.cfg.PeerListen, Advertise: s.cfg.PeerAdvertise,
		Hold: s.holdForPeer, Tunnel: s.cfg.Tunnel, LeaseTTL: s.cfg.LeaseTTL, Registerer: s.metrics.Registry,
		Logger: s.log.With("component", "replica"),
	})
	if err != nil {
		return nil, err
	}
	if err := p.Start(ctx, self); err != nil {
		p.Close()
		return nil, err
	}
	s.peers = p
	s.door.SetRemote(p)
	return p.Close, nil
}

// ownAddr is the address a replica shows for one of its own listeners: the
// bound address, with this machine's name for a wildcard host (as
// --peer-advertise defaults). Never --advertise: replicas behind one load
// balancer share it, and `tether replicas` would show every one of them at
// the same place.
func ownAddr(bound net.Addr) string { return advertiseFor(bound, nil)[0] }

// holdForPeer serves a stream another replica forwards: the operator or
// job was authorized there; here only the node must be one whose tunnel
// this replica holds.
func (s *Server) holdForPeer(ctx context.Context, nodeID string, h tunnel.Header) (tunnel.Stream, error) {
	r, err := s.door.Held(ctx, nodeID)
	if err != nil {
		return nil, fmt.Errorf("replica %s does not hold this node: %w", s.replicaID, err)
	}
	return r.Dial(ctx, h)
}

// sessionInfo is what other replicas need of a node's live session here
// (presence's Session): what its agent's hello said for the jobs, cluster
// and upgrade code that runs on whichever replica.
type sessionInfo struct {
	StateDir     string                  `json:"state_dir,omitempty"`
	AgentVersion string                  `json:"agent_version,omitempty"`
	Arch         string                  `json:"arch,omitempty"`
	Upgrade      *control.UpgradeSupport `json:"upgrade,omitempty"`
}

func sessionInfoOf(c *registry.Conn) sessionInfo {
	return sessionInfo{StateDir: c.StateDir, AgentVersion: c.AgentVersion, Arch: c.Arch, Upgrade: c.Upgrade}
}

// liveSession is node nodeID's session as this replica's registry has it,
// or as the replica holding it recorded it.
func (s *Server) liveSession(nodeID string) (sessionInfo, bool) {
	n, err := s.store.GetNode(context.Background(), nodeID)
	if err != nil {
		return sessionInfo{}, false
	}
	if c, ok := s.reg.Get(n.Name); ok && c.NodeID == nodeID {
		return sessionInfoOf(c), true
	}
	if s.peers == nil {
		return sessionInfo{}, false
	}
	p, ok := s.peers.Held(context.Background(), nodeID)
	var info sessionInfo
	if !ok || json.Unmarshal(p.Session, &info) != nil {
		return sessionInfo{}, false
	}
	return info, true
}

// nodeConnected and nodeDisconnected record presence (no-ops on a single
// hub).
func (s *Server) nodeConnected(ctx context.Context, c *registry.Conn) store.Presence {
	if s.peers == nil {
		return store.Presence{}
	}
	b, _ := json.Marshal(sessionInfoOf(c))
	return s.peers.Connected(ctx, c.NodeID, b)
}

func (s *Server) nodeDisconnected(p store.Presence) {
	if s.peers != nil {
		s.peers.Disconnected(p)
	}
}

// replicaService backs GET /v1/replicas and the nodes list's liveness.
type replicaService struct{ s *Server }

// Holders implements api.Replicas.
func (r replicaService) Holders(ctx context.Context) (map[string]string, error) {
	if r.s.peers == nil {
		return nil, nil
	}
	ps, err := r.s.store.ListPresence(ctx)
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

// List implements api.Replicas.
func (r replicaService) List(ctx context.Context) (api.ReplicaList, error) {
	if r.s.peers == nil {
		return api.ReplicaList{}, nil
	}
	reps, err := r.s.store.ListReplicas(ctx)
	if err != nil {
		return api.ReplicaList{}, err
	}
	holders, err := r.Holders(ctx)
	if err != nil {
		return api.ReplicaList{}, err
	}
	nodes, err := r.s.store.ListNodes(ctx)
	if err != nil {
		return api.ReplicaList{}, err
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
	out := api.ReplicaList{Self: r.s.replicaID}
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
		if rep.ID == r.s.replicaID {
			links = r.s.peers.Links()
		}
		if links == nil {
			links = []string{}
		}
		out.Replicas = append(out.Replicas, api.Replica{ID: rep.ID, Self: rep.ID == r.s.replicaID, Health: health, PeerAddr: rep.PeerAddr,
			API: rep.APIAddr, SSH: rep.SSHAddr, Version: rep.Version, Started: rep.Started, LeaseUntil: rep.LeaseUntil,
			Links: links, Agents: agents})
	}
	return out, nil
}

var _ access.Remote = (*replica.Peers)(nil)
