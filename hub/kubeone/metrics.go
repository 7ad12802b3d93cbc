package kubeone

import (
	"context"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Collector exports the clusters and their members' tunnels, read from the
// store at each scrape (a handful of rows per cluster):
//
//	tether_kubeone_clusters{status}
//	tether_kubeone_members{cluster,role,tunnel="up|down"}
func (s *Clusters) Collector() prometheus.Collector { return collector{s} }

var (
	clustersDesc = prometheus.NewDesc("tether_kubeone_clusters", "KubeOne clusters by status.", []string{"status"}, nil)
	membersDesc  = prometheus.NewDesc("tether_kubeone_members",
		"Members of each KubeOne cluster by role and whether their tunnel is up.", []string{"cluster", "role", "tunnel"}, nil)
)

type collector struct{ s *Clusters }

func (c collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- clustersDesc
	ch <- membersDesc
}

func (c collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	cs, err := c.s.cfg.Store.ListKubeOneClusters(ctx)
	if err != nil {
		c.s.cfg.Logger.Warn("KubeOne metrics not collected", "err", err)
		return
	}
	byStatus := map[string]float64{}
	for _, cl := range cs {
		byStatus[cl.Status]++
		counts := map[[2]string]float64{}
		for _, m := range cl.Members {
			tunnel := "down"
			if m.Node.Online && m.Node.RevokedAt.IsZero() {
				tunnel = "up"
			}
			counts[[2]string{m.Role, tunnel}]++
		}
		for _, role := range []string{"control-plane", "worker"} {
			for _, tunnel := range []string{"up", "down"} {
				ch <- prometheus.MustNewConstMetric(membersDesc, prometheus.GaugeValue, counts[[2]string{role, tunnel}],
					cl.Name, role, tunnel)
			}
		}
	}
	for status, n := range byStatus {
		ch <- prometheus.MustNewConstMetric(clustersDesc, prometheus.GaugeValue, n, status)
	}
}
