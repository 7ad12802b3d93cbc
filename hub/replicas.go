package hub

import (
	"context"
	"net"
	"path/filepath"
	"sync"

	"github.com/tether-dev/tether/hub/cluster"
	"github.com/tether-dev/tether/hub/identity"
	"github.com/tether-dev/tether/hub/kubeone"
	"github.com/tether-dev/tether/hub/replica"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/pki/ca"
	"github.com/tether-dev/tether/tunnel"
)

// identityFiles are the data-dir files every replica presents alike: the
// TLS CA (root and intermediate, whose pin join strings carry), the SSH
// host and user CAs, the bastion's host key, and the QUIC stateless-reset
// key.
var identityFiles = []string{
	"ca/" + ca.CertFile, "ca/" + ca.KeyFile, "ca/" + ca.IntermediateCertFile, "ca/" + ca.IntermediateKeyFile,
	"ca/" + ca.SSHHostCAFile, "ca/" + ca.SSHHostCAFile + ".pub",
	"ca/" + ca.SSHUserCAFile, "ca/" + ca.SSHUserCAFile + ".pub",
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
	if _, err := identity.LoadOrCreateHostKey(filepath.Join(dir, hostKeyFile)); err != nil {
		return err
	}
	_, err := identity.LoadOrCreateSecret(filepath.Join(dir, resetKeyFile))
	return err
}

// startPeers joins the replica set: peer listener, lease, presence, and
// the door's routes through other replicas. apiAddr and sshAddr are this
// replica's bound API and bastion listeners, recorded for `tether replicas`;
// advertise are the addresses agents dial for it, which join strings and
// welcomes name beside the other live replicas'. poke asks the QUIC agents
// of a replica found dead to reconnect (the tunnel listener's). It returns
// the stop function.
func (s *Server) startPeers(ctx context.Context, apiAddr, sshAddr net.Addr, advertise []string,
	poke func([]tunnel.PokeTarget) int) (func(), error) {
	self := store.Replica{APIAddr: ownAddr(apiAddr), SSHAddr: ownAddr(sshAddr), Version: Version, Hubs: advertise}
	p, err := s.replicas.Join(ctx, replica.Config{
		Store: s.store, CA: s.ca, Listen: s.cfg.PeerListen, Advertise: s.cfg.PeerAdvertise,
		Hold: s.replicas.Hold(s.door), Tunnel: s.cfg.Tunnel, LeaseTTL: s.cfg.LeaseTTL, Registerer: s.metrics.Registry,
		Poke:   poke,
		Logger: s.log.With("component", "replica"),
	}, self)
	if err != nil {
		return nil, err
	}
	s.door.SetRemote(p)
	return p.Close, nil
}

// ownAddr is the address a replica shows for one of its own listeners: the
// bound address, with this machine's name for a wildcard host (as
// --peer-advertise defaults). Never --advertise: replicas behind one load
// balancer share it, and `tether replicas` would show every one of them at
// the same place.
func ownAddr(bound net.Addr) string { return advertiseFor(bound, nil)[0] }

// replicaApply applies changes made on other replicas here.
type replicaApply struct{ s *Server }

func (a replicaApply) AccessChanged(ctx context.Context) { a.s.pusher.ApplyChange(ctx) }
func (a replicaApply) NodeRevoked(nodeID string)         { a.s.conns.CloseNode(nodeID, revokedNotice) }
func (a replicaApply) Resync(ctx context.Context)        { a.s.pusher.Resync(ctx) }

func (a replicaApply) AdminRevoked(ctx context.Context) {
	s := a.s
	if vf, err := s.store.AdminValidFrom(ctx); err == nil && !vf.IsZero() {
		s.operators.SetAdminValidFrom(vf)
		// This replica's own local admin identity is revoked too.
		if err := s.operators.RefreshLocalAdmin(ctx); err != nil {
			s.log.Error("local admin identity after a revocation on another replica", "err", err)
		}
	} else if err != nil {
		s.log.Error("admin revocation from another replica not applied", "err", err)
	}
}

func (a replicaApply) WorkRequested() {
	a.s.cluster.Rescan()
	a.s.upgrades.Wake()
}

// nodeRevoked closes the revoked node's tunnel if this replica holds it and
// tells the replicas that may.
func (s *Server) nodeRevoked(nodeID string) {
	s.conns.CloseNode(nodeID, revokedNotice)
	s.repl.Publish(store.ChangeNodeRevoked, nodeID)
	s.pusher.Changed()
}

// revokedNotice is what a revoked node's agent is told as its tunnel ends.
const revokedNotice = "this node was revoked on the hub; re-join with a new join string"

// kubeoneLeasePrefix names the lease a KubeOne run holds on its cluster
// (+ the cluster's ID): one run per cluster in the fleet.
const kubeoneLeasePrefix = "kubeone/"

// lead runs the singletons for one leader term; ctx carries the term's
// fence and ends with it.
func (s *Server) lead(ctx context.Context, kruns *kubeone.Runs) {
	s.log.Info("leading the fleet's singletons", "replica", s.replicas.ID())
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.cluster.Run(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("cluster controller stopped for this term", "err", err)
		}
	})
	wg.Go(func() { _ = s.upgrades.Run(ctx) })
	wg.Go(func() { s.repl.SweepOrphanedJobs(ctx, kruns.Recover) })
	wg.Wait()
	s.log.Info("no longer leading", "replica", s.replicas.ID())
}

// clusterAPI is the cluster controller as the API uses it: a request
// stored on any replica wakes the leader's controller.
type clusterAPI struct {
	*cluster.Controller
	s *Server
}

func (c clusterAPI) Register(ctx context.Context, node, engine, by string) (store.ClusterMember, error) {
	m, err := c.Controller.Register(ctx, node, engine, by)
	if err == nil {
		c.s.repl.WorkRequested()
	}
	return m, err
}

func (c clusterAPI) Deregister(ctx context.Context, node, by string) (store.ClusterMember, error) {
	m, err := c.Controller.Deregister(ctx, node, by)
	if err == nil {
		c.s.repl.WorkRequested()
	}
	return m, err
}
