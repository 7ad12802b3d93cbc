// Package metrics defines the hub's Prometheus metrics. Every name starts
// with tether_ and carries its unit.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
)

// Metrics is the hub's set of collectors, registered on its own registry so
// tests can run several hubs in one process.
type Metrics struct {
	Registry          *prometheus.Registry
	NodesConnected    *prometheus.GaugeVec   // transport
	StreamsOpened     *prometheus.CounterVec // service, result
	StreamsActive     prometheus.Gauge
	RelayedBytes      *prometheus.CounterVec // direction: to_node|from_node
	JumpAttempts      *prometheus.CounterVec // result
	HandshakeDuration *prometheus.HistogramVec
	Joins             *prometheus.CounterVec // result

	JobsFinished      *prometheus.CounterVec   // kind, state
	JobsRunning       prometheus.Gauge         //
	NodeRuns          *prometheus.CounterVec   // result: the per-node final state
	NodeRunDuration   *prometheus.HistogramVec // result
	SSHDialDuration   *prometheus.HistogramVec // result: ok|error
	ClusterMembers    *prometheus.GaugeVec     // state
	ClusterTransition *prometheus.CounterVec   // from, to

	AccessPushes       *prometheus.CounterVec // kind: keys|trust, result: sent|error
	AccessPushDuration prometheus.Histogram

	// ResumeEvents: event detached|resumed|expired|refused|ended (resumable
	// streams, hub/nodeconn).
	ResumeEvents *prometheus.CounterVec
}

// New creates and registers the metrics.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		NodesConnected: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tether_nodes_connected", Help: "Nodes with a live tunnel, by transport.",
		}, []string{"transport"}),
		StreamsOpened: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_streams_opened_total", Help: "Streams the hub opened to nodes, by service and result.",
		}, []string{"service", "result"}),
		StreamsActive: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_streams_active", Help: "Streams to nodes currently relaying.",
		}),
		RelayedBytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_relayed_bytes_total", Help: "Bytes relayed between operators and nodes, by direction.",
		}, []string{"direction"}),
		JumpAttempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_jump_attempts_total", Help: "SSH jump (direct-tcpip) requests, by result.",
		}, []string{"result"}),
		HandshakeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_tunnel_handshake_duration_seconds",
			Help:    "Time from session accept to the node being registered (control hello), by transport.",
			Buckets: prometheus.ExponentialBuckets(0.0005, 2, 16),
		}, []string{"transport"}),
		Joins: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_joins_total", Help: "Join requests, by result.",
		}, []string{"result"}),
		JobsFinished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_jobs_finished_total", Help: "Jobs that reached a final state, by kind and state.",
		}, []string{"kind", "state"}),
		JobsRunning: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "tether_jobs_running", Help: "Jobs currently running.",
		}),
		NodeRuns: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_job_node_runs_total",
			Help: "Per-node runs of jobs that finished, by result (ok, failed, skipped, cancelled).",
		}, []string{"result"}),
		NodeRunDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_job_node_run_duration_seconds",
			Help:    "Wall time of a per-node run (connect, uploads, command), by result.",
			Buckets: prometheus.ExponentialBuckets(0.01, 2, 18),
		}, []string{"result"}),
		SSHDialDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "tether_provision_ssh_dial_duration_seconds",
			Help:    "Time for the hub's provisioning SSH client to reach a node: stream open plus SSH handshake, by result.",
			Buckets: prometheus.ExponentialBuckets(0.001, 2, 16),
		}, []string{"result"}),
		ClusterMembers: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "tether_cluster_members",
			Help: "Cluster members by state of the cluster-agent state machine " +
				"(inactive, registering, install_in_progress, active, deregistering, uninstall_in_progress).",
		}, []string{"state"}),
		ClusterTransition: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_cluster_transitions_total", Help: "Cluster state machine transitions, by from and to state.",
		}, []string{"from", "to"}),
	}
	m.AccessPushes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_access_pushes_total",
		Help: "Authorized-keys and SSH-trust updates sent to nodes after connects, renewals and access changes, " +
			"by kind and result.",
	}, []string{"kind", "result"})
	m.AccessPushDuration = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "tether_access_push_duration_seconds",
		Help:    "Time from an operator or role change to every connected node having been sent its new access state.",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 18),
	})
	m.Registry.MustRegister(m.AccessPushes, m.AccessPushDuration)
	m.ResumeEvents = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "tether_resume_events_total",
		Help: "Resumable streams to nodes: detached (the node's link went down), resumed (re-attached after its " +
			"reconnect), expired (the resume window passed), refused (a resume request that matched no stream), " +
			"ended (kept for an uplink process that restarted since).",
	}, []string{"event"})
	m.Registry.MustRegister(m.ResumeEvents)
	for _, e := range []string{"detached", "resumed", "expired", "refused", "ended"} {
		m.ResumeEvents.WithLabelValues(e)
	}
	m.Registry.MustRegister(
		m.JobsFinished, m.JobsRunning, m.NodeRuns, m.NodeRunDuration, m.SSHDialDuration, m.ClusterMembers,
		m.ClusterTransition,
	)
	m.Registry.MustRegister(
		m.NodesConnected, m.StreamsOpened, m.StreamsActive, m.RelayedBytes, m.JumpAttempts, m.HandshakeDuration,
		m.Joins, collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	)
	for _, t := range []string{"quic", "tcp"} {
		m.NodesConnected.WithLabelValues(t)
	}
	return m
}

// Admission is a reading of the tunnel listener's handshake admission: the
// connections refused at its handshake limit, by transport and whether a
// retry hint went with the refusal, and the admission rate the hints are
// paced by.
type Admission struct {
	RefusedQUIC, RefusedTCPHinted, RefusedTCPPlain uint64
	RatePerSecond                                  float64
	// HandshakesFailed took a handshake slot and ended without a session;
	// FailedHeldSeconds is how long they held their slots, in all.
	HandshakesFailed  uint64
	FailedHeldSeconds float64
}

// RegisterAdmission exports read as tether_tunnel_busy_refusals_total{transport,
// hinted}, tether_tunnel_admission_rate_per_second,
// tether_tunnel_handshakes_failed_total and
// tether_tunnel_handshake_failed_slot_seconds_total, read at each scrape.
func (m *Metrics) RegisterAdmission(read func() Admission) {
	m.Registry.MustRegister(admissionCollector{read: read})
}

var (
	refusedDesc = prometheus.NewDesc("tether_tunnel_busy_refusals_total",
		"Tunnel connections refused at the hub's handshake limit before any cryptography, "+
			"by transport and whether the refusal carried a retry hint "+
			"(hinted=no: too many refusals at once; the agent waits out its own backoff).",
		[]string{"transport", "hinted"}, nil)
	admitRateDesc = prometheus.NewDesc("tether_tunnel_admission_rate_per_second",
		"Sessions per second the hub is estimated to admit at its handshake limit; "+
			"refused agents are asked back in a queue drained at this rate (0: not measured yet).",
		nil, nil)
	hsFailedDesc = prometheus.NewDesc("tether_tunnel_handshakes_failed_total",
		"Tunnel connections that took one of the hub's handshake slots and ended without a session (both transports).",
		nil, nil)
	hsFailedHeldDesc = prometheus.NewDesc("tether_tunnel_handshake_failed_slot_seconds_total",
		"Time the failed handshakes held their handshake slots, in all: slots that admitted nobody.",
		nil, nil)
)

type admissionCollector struct{ read func() Admission }

func (c admissionCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- refusedDesc
	ch <- admitRateDesc
	ch <- hsFailedDesc
	ch <- hsFailedHeldDesc
}

func (c admissionCollector) Collect(ch chan<- prometheus.Metric) {
	a := c.read()
	ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(a.RefusedQUIC), "quic", "yes")
	ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(a.RefusedTCPHinted), "tcp", "yes")
	ch <- prometheus.MustNewConstMetric(refusedDesc, prometheus.CounterValue, float64(a.RefusedTCPPlain), "tcp", "no")
	ch <- prometheus.MustNewConstMetric(admitRateDesc, prometheus.GaugeValue, a.RatePerSecond)
	ch <- prometheus.MustNewConstMetric(hsFailedDesc, prometheus.CounterValue, float64(a.HandshakesFailed))
	ch <- prometheus.MustNewConstMetric(hsFailedHeldDesc, prometheus.CounterValue, a.FailedHeldSeconds)
}

// RegisterResume exports tether_resume_streams{state} (resumable streams the
// hub holds: attached, detached) and tether_resume_buffered_bytes (bytes
// kept unacknowledged for them), read at each scrape.
func (m *Metrics) RegisterResume(streams func() (all, detached int), buffered func() int64) {
	m.Registry.MustRegister(resumeCollector{streams: streams, buffered: buffered})
}

var (
	resumeStreamsDesc = prometheus.NewDesc("tether_resume_streams",
		"Resumable streams to nodes the hub holds, by state: attached, or detached waiting for the node to reconnect.",
		[]string{"state"}, nil)
	resumeBufferedDesc = prometheus.NewDesc("tether_resume_buffered_bytes",
		"Bytes the hub keeps for resumable streams until the node acknowledges them (all nodes).", nil, nil)
)

type resumeCollector struct {
	streams  func() (all, detached int)
	buffered func() int64
}

func (c resumeCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- resumeStreamsDesc
	ch <- resumeBufferedDesc
}

func (c resumeCollector) Collect(ch chan<- prometheus.Metric) {
	all, detached := c.streams()
	ch <- prometheus.MustNewConstMetric(resumeStreamsDesc, prometheus.GaugeValue, float64(all-detached), "attached")
	ch <- prometheus.MustNewConstMetric(resumeStreamsDesc, prometheus.GaugeValue, float64(detached), "detached")
	ch <- prometheus.MustNewConstMetric(resumeBufferedDesc, prometheus.GaugeValue, float64(c.buffered()))
}
