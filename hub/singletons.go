package hub

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/cluster"
	"github.com/tether-dev/tether/hub/leader"
	"github.com/tether-dev/tether/hub/notify"
	"github.com/tether-dev/tether/hub/store"
)

// Hub replicas on one store: what runs once in the fleet and how changes
// made on one replica reach the others.
//
// Each replica holds a liveness lease (store.ReplicaLeasePrefix + its ID)
// and campaigns for the leader lease; the leader runs the singletons (the
// cluster and upgrade controllers, the recovery of KubeOne runs, the sweep
// of a dead replica's jobs) with a context fenced by its term's epoch, so a
// leader that stalled and lost its lease cannot write their state. Jobs run
// in the engine of the replica that started them, stored with it as owner;
// the leader marks the running jobs of a replica whose lease expired
// interrupted, as a restarted hub marks its own. A single hub is its own
// leader from its first second: nothing changes for it.

// singletonMetrics say who leads and how changes flow.
type singletonMetrics struct {
	leader   prometheus.Gauge
	epoch    prometheus.Gauge
	applied  *prometheus.CounterVec
	orphaned prometheus.Counter
}

func newSingletonMetrics(reg prometheus.Registerer) (*singletonMetrics, error) {
	m := &singletonMetrics{
		leader: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_leader",
			Help: "1 while this hub replica leads the fleet's singletons (controllers, job sweeps), else 0."}),
		epoch: prometheus.NewGauge(prometheus.GaugeOpts{Name: "tether_leader_epoch",
			Help: "The fencing epoch of this replica's current or last leader term."}),
		applied: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_replica_changes_applied_total",
			Help: "Changes made on other hub replicas applied here, by kind."}, []string{"kind"}),
		orphaned: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_jobs_orphaned_total",
			Help: "Jobs marked interrupted by this leader because the replica running them stopped."}),
	}
	for _, c := range []prometheus.Collector{m.leader, m.epoch, m.applied, m.orphaned} {
		if err := reg.Register(c); err != nil {
			return nil, fmt.Errorf("hub: singleton metrics: %w", err)
		}
	}
	return m, nil
}

// replication is a running replica's part in the fleet.
type replication struct {
	s        *Server
	feed     *notify.Feed
	elector  *leader.Elector
	liveness *leader.Elector
	metrics  *singletonMetrics
}

// startReplication starts the liveness lease, the change feed and the
// leader campaign, which runs lead in each term; stop ends them (the
// leader lease is released, so a successor leads within a third of the
// TTL).
func (s *Server) startReplication(ctx context.Context, lead func(ctx context.Context)) (stop func(), err error) {
	ttl := s.cfg.LeaderTTL
	r := &replication{s: s}
	if r.metrics, err = newSingletonMetrics(s.metrics.Registry); err != nil {
		return nil, err
	}
	log := s.log.With("component", "replicas", "replica", s.replicaID)
	if r.liveness, err = leader.New(leader.Config{Store: s.store, Lease: store.ReplicaLeasePrefix + s.replicaID, Holder: s.replicaID, TTL: ttl, Logger: log}); err != nil {
		return nil, err
	}
	if r.elector, err = leader.New(leader.Config{Store: s.store, Lease: store.LeaderLease, Holder: s.replicaID, TTL: ttl, Logger: log,
		OnChange: func(leading bool, l store.Lease) {
			if leading {
				r.metrics.leader.Set(1)
			} else {
				r.metrics.leader.Set(0)
			}
			r.metrics.epoch.Set(float64(l.Epoch))
		}}); err != nil {
		return nil, err
	}
	if r.feed, err = notify.New(notify.Config{Store: s.store, Origin: s.replicaID, Nudger: s.nudger,
		Apply: r.apply, Resync: func(ctx context.Context) { s.resyncAccess(ctx) }, Logger: log}); err != nil {
		return nil, err
	}
	s.feed, s.repl = r.feed, r
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	// Liveness first: jobs started from now on have an owner that lives.
	alive := make(chan struct{})
	wg.Go(func() {
		r.liveness.Run(ctx, func(ctx context.Context) {
			select {
			case <-alive:
			default:
				close(alive)
			}
			<-ctx.Done()
		})
	})
	select {
	case <-alive:
	case <-time.After(ttl):
		log.Warn("replica lease not acquired yet; starting anyway (the store may be unavailable)")
	case <-ctx.Done():
	}
	wg.Go(func() { r.feed.Run(ctx) })
	wg.Go(func() { r.elector.Run(ctx, lead) })
	return func() { cancel(); wg.Wait() }, nil
}

// apply applies changes made on other replicas to this one's live state.
func (r *replication) apply(ctx context.Context, cs []store.Change) {
	s := r.s
	reload, work := false, false
	for _, c := range cs {
		r.metrics.applied.WithLabelValues(c.Kind).Inc()
		switch c.Kind {
		case store.ChangeAccess:
			reload = true
		case store.ChangeNodeRevoked:
			reload = true
			s.closeRevokedNode(c.Subject)
		case store.ChangeAdminRevoked:
			if vf, err := s.store.AdminValidFrom(ctx); err == nil && !vf.IsZero() {
				s.admins.validFrom.Store(vf.UnixMilli())
				// This replica's own local admin identity is revoked too.
				if err := s.refreshLocalAdmin(ctx); err != nil {
					s.log.Error("local admin identity after a revocation on another replica", "err", err)
				}
			} else if err != nil {
				s.log.Error("admin revocation from another replica not applied", "err", err)
			}
		case store.ChangeWork:
			work = true
		}
	}
	if reload {
		s.applyAccessChange(ctx)
	}
	if work {
		if s.cluster != nil {
			s.cluster.Rescan()
		}
		if s.upgrades != nil {
			s.upgrades.Wake()
		}
	}
}

// publish tells the other replicas about a change this one made and
// applied. A failure is logged: they still see it at their next resync.
func (s *Server) publish(kind, subject string) {
	if s.feed == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := s.feed.Publish(ctx, kind, subject); err != nil {
		s.log.Warn("change not published to the other replicas; they pick it up at their next full re-read", "kind", kind, "err", err)
	}
}

// nodeRevoked closes the revoked node's tunnel if this replica holds it and
// tells the replicas that may.
func (s *Server) nodeRevoked(nodeID string) {
	s.closeRevokedNode(nodeID)
	s.publish(store.ChangeNodeRevoked, nodeID)
	s.accessChanged()
}

// closeRevokedNode ends the tunnel of the node with this ID if it is here.
func (s *Server) closeRevokedNode(nodeID string) {
	for _, c := range s.reg.All() {
		if c.NodeID == nodeID {
			go c.CloseWithNotice("this node was revoked on the hub; re-join with a new join string", true)
		}
	}
}

// kubeoneLeasePrefix names the lease a KubeOne run holds on its cluster
// (+ the cluster's ID): one run per cluster in the fleet.
const kubeoneLeasePrefix = "kubeone/"

// holdOnce takes the lease name for work that runs once in the fleet but
// may start on any replica (leader.TryHold); release ends it.
func (s *Server) holdOnce(name string) (release func(), err error) {
	return leader.TryHold(context.Background(), leader.Config{Store: s.store, Lease: name, Holder: s.replicaID,
		TTL: s.cfg.LeaderTTL, Logger: s.log.With("component", "replicas")})
}

// workRequested wakes the leader's controllers, wherever the leader is.
func (s *Server) workRequested() { s.publish(store.ChangeWork, "") }

// lead runs the singletons for one leader term; ctx carries the term's
// fence and ends with it.
func (s *Server) lead(ctx context.Context, kruns *kubeoneRuns) {
	s.log.Info("leading the fleet's singletons", "replica", s.replicaID)
	var wg sync.WaitGroup
	wg.Go(func() {
		if err := s.cluster.Run(ctx); err != nil && ctx.Err() == nil {
			s.log.Error("cluster controller stopped for this term", "err", err)
		}
	})
	wg.Go(func() { _ = s.upgrades.Run(ctx) })
	wg.Go(func() { s.sweepOrphanedJobs(ctx, kruns) })
	wg.Wait()
	s.log.Info("no longer leading", "replica", s.replicaID)
}

// sweepOrphanedJobs marks the jobs of replicas that stopped interrupted
// (resumable with `tether jobs rerun`, as after a hub restart), then
// settles the KubeOne clusters whose run was one of them. A replica counts
// as stopped one TTL after its liveness lease expired: after a database
// outage every lease has expired, and the live replicas take theirs again
// within a third of the TTL.
func (s *Server) sweepOrphanedJobs(ctx context.Context, kruns *kubeoneRuns) {
	kruns.recover(ctx)
	t := time.NewTicker(s.cfg.LeaderTTL / 3)
	defer t.Stop()
	for {
		n, err := s.store.InterruptOrphanedJobs(ctx, s.cfg.LeaderTTL, time.Now())
		switch {
		case err != nil && ctx.Err() == nil:
			s.log.Warn("jobs of stopped replicas not swept", "err", err)
		case n > 0:
			s.sweptMetric(n)
			s.log.Warn("jobs interrupted: the replica running them stopped; rerun with `tether jobs rerun`", "jobs", n)
			s.audit(store.AuditEvent{At: time.Now(), Kind: "jobs_interrupted", Operator: "replica:" + s.replicaID, Result: "ok",
				Detail: fmt.Sprintf("%d job(s) of a stopped hub replica marked interrupted", n)})
			kruns.recover(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (s *Server) sweptMetric(n int) {
	if s.repl != nil {
		s.repl.metrics.orphaned.Add(float64(n))
	}
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
		c.s.workRequested()
	}
	return m, err
}

func (c clusterAPI) Deregister(ctx context.Context, node, by string) (store.ClusterMember, error) {
	m, err := c.Controller.Deregister(ctx, node, by)
	if err == nil {
		c.s.workRequested()
	}
	return m, err
}
