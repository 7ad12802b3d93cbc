package upgrade

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// Metrics are the rollouts' Prometheus metrics:
//
//	tether_upgrade_nodes{upgrade,step}                  gauge, read from the store at each scrape (live upgrades)
//	tether_upgrade_rollouts{state}                      gauge, read from the store at each scrape
//	tether_upgrade_step_duration_seconds{kind,step}     histogram: time a node spent in a step
//	tether_upgrade_bytes_pushed_total                   counter: artifact bytes pushed to nodes
type Metrics struct {
	c            *Controller
	stepDuration *prometheus.HistogramVec
	bytesPushed  prometheus.Counter
}

var (
	nodesDesc = prometheus.NewDesc("tether_upgrade_nodes",
		"Target nodes of each live upgrade, by step of the per-node state machine.", []string{"upgrade", "step"}, nil)
	rolloutsDesc = prometheus.NewDesc("tether_upgrade_rollouts",
		"Upgrades by rollout state (running, paused, halted, cancelled, done).", []string{"state"}, nil)
)

func newMetrics(c *Controller) *Metrics {
	return &Metrics{c: c,
		stepDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_upgrade_step_duration_seconds",
			Help:    "Time a node spent in a step of an upgrade, by upgrade kind and step.",
			Buckets: prometheus.ExponentialBuckets(0.05, 2, 16),
		}, []string{"kind", "step"}),
		bytesPushed: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "tether_upgrade_bytes_pushed_total", Help: "Artifact bytes the hub pushed to nodes through their tunnels.",
		}),
	}
}

// Collectors are the controller's metrics, for the hub's registry.
func (c *Controller) Collectors() []prometheus.Collector {
	return []prometheus.Collector{c.metrics.stepDuration, c.metrics.bytesPushed, gauges{c}}
}

func (m *Metrics) stepDone(kind upgradeproto.Kind, step upgradeproto.Step, d time.Duration) {
	if d >= 0 && step != "" {
		m.stepDuration.WithLabelValues(string(kind), string(step)).Observe(d.Seconds())
	}
}

func (m *Metrics) pushed(n int64) {
	if n > 0 {
		m.bytesPushed.Add(float64(n))
	}
}

type gauges struct{ c *Controller }

func (g gauges) Describe(ch chan<- *prometheus.Desc) {
	ch <- nodesDesc
	ch <- rolloutsDesc
}

func (g gauges) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	ups, err := g.c.cfg.Store.ListUpgrades(ctx)
	if err != nil {
		g.c.cfg.Logger.Warn("upgrade metrics not collected", "err", err)
		return
	}
	states := map[string]float64{}
	for _, s := range []string{
		store.UpgradeRunning, store.UpgradePaused, store.UpgradeHalted, store.UpgradeCancelled, store.UpgradeDone,
	} {
		states[s] = 0
	}
	for _, u := range ups {
		states[u.State]++
		if store.UpgradeFinal(u.State) {
			continue
		}
		nodes, err := g.c.cfg.Store.ListUpgradeNodes(ctx, u.Name)
		if err != nil {
			continue
		}
		steps := map[upgradeproto.Step]float64{}
		for _, n := range nodes {
			steps[n.Step]++
		}
		for _, s := range allSteps {
			ch <- prometheus.MustNewConstMetric(nodesDesc, prometheus.GaugeValue, steps[s], u.Name, string(s))
		}
	}
	for s, v := range states {
		ch <- prometheus.MustNewConstMetric(rolloutsDesc, prometheus.GaugeValue, v, s)
	}
}

var allSteps = []upgradeproto.Step{
	upgradeproto.StepPending, upgradeproto.StepAwaitingConfirmation, upgradeproto.StepDownloading,
	upgradeproto.StepVerifying, upgradeproto.StepInstalling, upgradeproto.StepHealthCheck, upgradeproto.StepSucceeded,
	upgradeproto.StepFailed, upgradeproto.StepRolledBack, upgradeproto.StepSkipped, upgradeproto.StepCancelled,
}
