package replica

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/tunnel"
)

// peerRoute reaches a node through the replica holding its tunnel. The
// caller (the bastion, a job) was authorized on this replica; the holder
// checks only that the request comes from a replica and is for a node it
// holds, and is the only one to touch the node's tunnel. A holder that
// stopped answering fails the stream at once (*access.ReplicaGoneError)
// rather than when the request times out.
type peerRoute struct {
	p       *Peers
	replica string
	addr    string
	started time.Time // the replica's run (store.Replica.Started)
	nodeID  string
	node    string // the node's name, for errors
}

func (r peerRoute) String() string { return "peer " + r.replica }

func (r peerRoute) Dial(ctx context.Context, h tunnel.Header) (tunnel.Stream, error) {
	st, err := r.dial(ctx, h)
	result := "ok"
	var (
		refused *refusedError
		gone    *access.ReplicaGoneError
	)
	switch {
	case errors.As(err, &refused):
		result = "refused"
	case errors.As(err, &gone):
		result = "gone"
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
	sess, err := r.p.dial(ctx, r.replica, r.addr, r.started)
	if err != nil {
		return nil, r.gone(ctx, err)
	}
	st, err := sess.OpenStream(ctx)
	if err != nil {
		return nil, r.lost(ctx, sess, fmt.Errorf("replica: open stream to replica %s: %w", r.replica, err))
	}
	deadline, _ := ctx.Deadline()
	_ = st.SetDeadline(deadline)
	if err := WriteRequest(st, Request{NodeID: r.nodeID, Header: h}); err != nil {
		st.Close()
		return nil, r.lost(ctx, sess, fmt.Errorf("replica: forward to replica %s: %w", r.replica, err))
	}
	rep, err := tunnel.ReadReply(st)
	if err != nil {
		st.Close()
		return nil, r.lost(ctx, sess, fmt.Errorf("replica: answer from replica %s: %w", r.replica, err))
	}
	if !rep.OK {
		st.Close()
		return nil, &refusedError{replica: r.replica, reason: rep.Reason}
	}
	_ = st.SetDeadline(time.Time{})
	return st, nil
}

// lost is err, from a stream on link sess: the holder is gone if the link
// ended with it (a stream sees its link's end first, so a moment is given
// for the link to say so).
func (r peerRoute) lost(ctx context.Context, sess tunnel.Session, err error) error {
	t := time.NewTimer(linkEndGrace)
	defer t.Stop()
	select {
	case <-sess.Done():
		return r.gone(ctx, err)
	case <-t.C:
		return err
	}
}

// linkEndGrace is how long lost waits for a failed stream's link to end.
const linkEndGrace = 200 * time.Millisecond

// gone is the error for a holder the peer link cannot reach: the node's
// agent is on its way to a live replica. A caller that gave up, or this
// replica shutting down, says nothing of the holder: then err as it is.
func (r peerRoute) gone(ctx context.Context, err error) error {
	if ctx.Err() != nil || r.p.ctx.Err() != nil {
		return err
	}
	since, first := r.p.lostSince(r.replica)
	if first {
		r.p.log.Warn("replica holding nodes stopped answering; streams to its nodes fail until they reconnect",
			"replica", r.replica, "node", r.node, "since", since, "err", err)
	}
	return &access.ReplicaGoneError{Node: r.node, Replica: r.replica, Since: since, Err: err}
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
	poked      prometheus.Counter
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
				"and result (ok, refused, gone: the holder stopped answering, error, malformed)."},
			[]string{"direction", "result"}),
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "tether_peer_bytes_total",
			Help: "Payload bytes of forwarded streams on peer links, by direction (to_peer, from_peer)."},
			[]string{"direction"}),
		dialErrors: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_peer_dial_errors_total",
			Help: "Failed dials of a peer link to another hub replica."}),
		poked: prometheus.NewCounter(prometheus.CounterOpts{Name: "tether_peer_agents_poked_total",
			Help: "QUIC agents of hub replicas found dead that this replica asked to reconnect (pokes)."}),
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
	return []prometheus.Collector{m.links, m.streams, m.bytes, m.dialErrors, m.poked}
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
