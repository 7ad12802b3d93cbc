package replica

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/tunnel"
)

// peerRoute reaches a node through the replica holding its tunnel. The
// caller (the bastion, a job) was authorized on this replica; the holder
// checks only that the request comes from a replica and is for a node it
// holds, and is the only one to touch the node's tunnel.
type peerRoute struct {
	p       *Peers
	replica string
	addr    string
	nodeID  string
}

func (r peerRoute) String() string { return "peer " + r.replica }

func (r peerRoute) Dial(ctx context.Context, h tunnel.Header) (tunnel.Stream, error) {
	st, err := r.dial(ctx, h)
	result := "ok"
	var refused *refusedError
	switch {
	case errors.As(err, &refused):
		result = "refused"
	case err != nil:
		result = "error"
	}
	r.p.m.streams.WithLabelValues("out", result).Inc()
	if err != nil {
		return nil, err
	}
	return &countedStream{Stream: st, m: r.p.m}, nil
}

func (r peerRoute) dial(ctx context.Context, h tunnel.Header) (tunnel.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, requestTimeout)
	defer cancel()
	sess, err := r.p.dial(ctx, r.replica, r.addr)
	if err != nil {
		return nil, err
	}
	st, err := sess.OpenStream(ctx)
	if err != nil {
		return nil, fmt.Errorf("replica: open stream to replica %s: %w", r.replica, err)
	}
	deadline, _ := ctx.Deadline()
	_ = st.SetDeadline(deadline)
	if err := WriteRequest(st, Request{NodeID: r.nodeID, Header: h}); err != nil {
		st.Close()
		return nil, fmt.Errorf("replica: forward to replica %s: %w", r.replica, err)
	}
	rep, err := tunnel.ReadReply(st)
	if err != nil {
		st.Close()
		return nil, fmt.Errorf("replica: answer from replica %s: %w", r.replica, err)
	}
	if !rep.OK {
		st.Close()
		return nil, &refusedError{replica: r.replica, reason: rep.Reason}
	}
	_ = st.SetDeadline(time.Time{})
	return st, nil
}

// refusedError is the holder's (or the agent's, relayed) refusal.
type refusedError struct{ replica, reason string }

func (e *refusedError) Error() string {
	return fmt.Sprintf("through replica %s: %s", e.replica, e.reason)
}

// Unwrap lets callers treat it as the agent refusing a stream.
func (e *refusedError) Unwrap() error { return nodeconn.ErrRefused }

// countedStream meters a forwarded stream's bytes on the entry replica.
type countedStream struct {
	tunnel.Stream
	m *peerMetrics
}

func (c *countedStream) Read(b []byte) (int, error) {
	n, err := c.Stream.Read(b)
	if n > 0 {
		c.m.bytes.WithLabelValues("from_peer").Add(float64(n))
	}
	return n, err
}

func (c *countedStream) Write(b []byte) (int, error) {
	n, err := c.Stream.Write(b)
	if n > 0 {
		c.m.bytes.WithLabelValues("to_peer").Add(float64(n))
	}
	return n, err
}

// peerMetrics are the tether_peer_* metrics.
type peerMetrics struct {
	reg        prometheus.Registerer
	links      *prometheus.GaugeVec
	streams    *prometheus.CounterVec
	bytes      *prometheus.CounterVec
	dialErrors prometheus.Counter
	once       sync.Once
}

func newPeerMetrics(reg prometheus.Registerer) *peerMetrics {
	m := &peerMetrics{
		reg: reg,
		links: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "tether_peer_links",
			Help: "Live peer links to other hub replicas, by direction (out: dialed by this replica, in: accepted)."},
			[]string{"direction"}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_peer_streams_total",
			Help: "Streams forwarded over peer links, by direction (out: to the holder, in: from an entry replica) " +
				"and result (ok, refused, error, malformed)."},
			[]string{"direction", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_peer_bytes_total",
			Help: "Payload bytes of forwarded streams on peer links, by direction (to_peer, from_peer)."},
			[]string{"direction"}),
		dialErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_peer_dial_errors_total",
			Help: "Failed dials of a peer link to another hub replica."}),
	}
	for _, d := range []string{"in", "out"} {
		m.links.WithLabelValues(d)
	}
	if reg != nil {
		for _, c := range m.collectors() {
			reg.MustRegister(c)
		}
	}
	return m
}

func (m *peerMetrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.links, m.streams, m.bytes, m.dialErrors}
}

func (m *peerMetrics) unregister() {
	m.once.Do(func() {
		if m.reg != nil {
			for _, c := range m.collectors() {
				m.reg.Unregister(c)
			}
		}
	})
}
