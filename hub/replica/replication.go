package replica

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

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
			return nil, fmt.Errorf("replica: singleton metrics: %w", err)
		}
	}
	return m, nil
}

// Applier applies changes made on other replicas to this one's live state.
type Applier interface {
	// AccessChanged reloads access (operators, roles, keys, node rows).
	AccessChanged(ctx context.Context)
	// NodeRevoked ends the revoked node's tunnel if this replica holds it.
	NodeRevoked(nodeID string)
	// AdminRevoked applies a revocation of admin certificates.
	AdminRevoked(ctx context.Context)
	// WorkRequested wakes the controllers (if this replica leads).
	WorkRequested()
	// Resync is the periodic full re-read, in case a change was missed.
	Resync(ctx context.Context)
}

// Store is what replication uses of the store: leases, the change feed
// and the jobs of stopped replicas.
type Store interface {
	leader.Store
	notify.Store
	InterruptOrphanedJobs(ctx context.Context, grace time.Duration, at time.Time) (jobs int, err error)
}

// ReplicationConfig is what a replica's part in the fleet uses of the hub.
type ReplicationConfig struct {
	Store      Store
	ID         string        // this replica
	TTL        time.Duration // of the leader and liveness leases
	Nudger     notify.Nudger // nil: the feed polls
	Registerer prometheus.Registerer
	Apply      Applier
	Audit      func(store.AuditEvent)
	Logger     *slog.Logger
}

// Replication is a replica's part in the fleet: its liveness lease, the
// change feed, and the leader campaign. A single hub has one too, and is
// its own leader.
type Replication struct {
	cfg      ReplicationConfig
	log      *slog.Logger
	feed     *notify.Feed
	elector  *leader.Elector
	liveness *leader.Elector
	metrics  *singletonMetrics
	started  atomic.Bool // Start ran: changes are published from then on
}

// NewReplication prepares a replica's leases and change feed; Start runs them.
func NewReplication(cfg ReplicationConfig) (_ *Replication, err error) {
	r := &Replication{cfg: cfg, log: cfg.Logger.With("component", "replicas", "replica", cfg.ID)}
	if r.metrics, err = newSingletonMetrics(cfg.Registerer); err != nil {
		return nil, err
	}
	if r.liveness, err = leader.New(leader.Config{Store: cfg.Store, Lease: store.ReplicaLeasePrefix + cfg.ID,
		Holder: cfg.ID, TTL: cfg.TTL, Logger: r.log}); err != nil {
		return nil, err
	}
	if r.elector, err = leader.New(leader.Config{Store: cfg.Store, Lease: store.LeaderLease, Holder: cfg.ID,
		TTL: cfg.TTL, Logger: r.log,
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
	if r.feed, err = notify.New(notify.Config{Store: cfg.Store, Origin: cfg.ID, Nudger: cfg.Nudger,
		Apply: r.apply, Resync: cfg.Apply.Resync, Logger: r.log}); err != nil {
		return nil, err
	}
	return r, nil
}

// Start starts the liveness lease, the change feed and the leader
// campaign, which runs lead in each term; stop ends them (the leader lease
// is released, so a successor leads within a third of the TTL).
func (r *Replication) Start(ctx context.Context, lead func(ctx context.Context)) (stop func()) {
	ttl := r.cfg.TTL
	r.started.Store(true)
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
		r.log.Warn("replica lease not acquired yet; starting anyway (the store may be unavailable)")
	case <-ctx.Done():
	}
	wg.Go(func() { r.feed.Run(ctx) })
	wg.Go(func() { r.elector.Run(ctx, lead) })
	return func() { cancel(); wg.Wait() }
}

// apply applies changes made on other replicas to this one's live state.
func (r *Replication) apply(ctx context.Context, cs []store.Change) {
	reload, work := false, false
	for _, c := range cs {
		r.metrics.applied.WithLabelValues(c.Kind).Inc()
		switch c.Kind {
		case store.ChangeAccess:
			reload = true
		case store.ChangeNodeRevoked:
			reload = true
			r.cfg.Apply.NodeRevoked(c.Subject)
		case store.ChangeAdminRevoked:
			r.cfg.Apply.AdminRevoked(ctx)
		case store.ChangeWork:
			work = true
		}
	}
	if reload {
		r.cfg.Apply.AccessChanged(ctx)
	}
	if work {
		r.cfg.Apply.WorkRequested()
	}
}

// Publish tells the other replicas about a change this one made and
// applied; nothing before Start. A failure is logged: they still see it at
// their next resync.
func (r *Replication) Publish(kind, subject string) {
	if !r.started.Load() {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := r.feed.Publish(ctx, kind, subject); err != nil {
		r.log.Warn("change not published to the other replicas; they pick it up at their next full re-read",
			"kind", kind, "err", err)
	}
}

// WorkRequested wakes the leader's controllers, wherever the leader is.
func (r *Replication) WorkRequested() { r.Publish(store.ChangeWork, "") }

// HoldOnce takes the lease name for work that runs once in the fleet but
// may start on any replica (leader.TryHold); release ends it.
func (r *Replication) HoldOnce(name string) (release func(), err error) {
	return leader.TryHold(context.Background(), leader.Config{Store: r.cfg.Store, Lease: name, Holder: r.cfg.ID,
		TTL: r.cfg.TTL, Logger: r.log})
}

// SweepOrphanedJobs marks the jobs of replicas that stopped interrupted
// (resumable with `tether jobs rerun`, as after a hub restart), calling
// settle first and after each sweep that found some (the KubeOne clusters
// whose run was one of them). A replica counts as stopped one TTL after its
// liveness lease expired: after a database outage every lease has expired,
// and the live replicas take theirs again within a third of the TTL. It
// runs in the leader's term, until ctx ends.
func (r *Replication) SweepOrphanedJobs(ctx context.Context, settle func(ctx context.Context)) {
	settle(ctx)
	t := time.NewTicker(r.cfg.TTL / 3)
	defer t.Stop()
	for {
		n, err := r.cfg.Store.InterruptOrphanedJobs(ctx, r.cfg.TTL, time.Now())
		switch {
		case err != nil && ctx.Err() == nil:
			r.log.Warn("jobs of stopped replicas not swept", "err", err)
		case n > 0:
			r.metrics.orphaned.Add(float64(n))
			r.log.Warn("jobs interrupted: the replica running them stopped; rerun with `tether jobs rerun`", "jobs", n)
			r.cfg.Audit(store.AuditEvent{At: time.Now(), Kind: "jobs_interrupted", Operator: "replica:" + r.cfg.ID,
				Result: "ok", Detail: fmt.Sprintf("%d job(s) of a stopped hub replica marked interrupted", n)})
			settle(ctx)
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}
