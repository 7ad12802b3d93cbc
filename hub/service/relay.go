package service

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/resume"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// requestTimeout bounds reading a stream's request frame and reaching the
// target before the stream is refused.
const requestTimeout = 15 * time.Second

// Config is what a Relay works with.
type Config struct {
	// Store holds the services this hub knows.
	Store interface {
		GetService(ctx context.Context, name string) (store.Service, error)
	}
	// HubID is this hub's ID (services created here have it as origin).
	HubID string
	// Suffixes tells how hubs above name this one; nil means this hub has
	// no parent (only its own services).
	Suffixes Suffixes
	// DialDown opens a TCP stream to port on node target (relative to this
	// hub: one of its own nodes, or one below a site) through the door,
	// answered by the node; route says which way it went, for audit.
	DialDown func(
		ctx context.Context, target string, port uint16, req *siteproto.RouteRequest,
	) (st tunnel.Stream, route string, err error)
	// OpenUp sends a route request up this hub's uplink and returns the
	// answered stream; nil when the hub has no parent.
	OpenUp func(ctx context.Context, req *siteproto.RouteRequest) (tunnel.Stream, error)
	// Audit records one audit event.
	Audit func(store.AuditEvent)
	// Metrics, if set, registers the byte and stream counters.
	Metrics prometheus.Registerer
	Logger  *slog.Logger
}

// Relay carries service tunnel streams at one hub.
type Relay struct {
	cfg     Config
	bytes   *prometheus.CounterVec // service, direction
	streams *prometheus.CounterVec // service, from, result
	collect []prometheus.Collector
}

// New builds a relay; its counters are registered on cfg.Metrics (Close
// unregisters them).
func New(cfg Config) (*Relay, error) {
	if cfg.Store == nil || cfg.DialDown == nil || cfg.Audit == nil || cfg.HubID == "" {
		return nil, errors.New("service: Store, HubID, DialDown and Audit are required")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	r := &Relay{cfg: cfg,
		bytes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_service_bytes_total",
			Help: "Bytes this hub carried for service tunnels, by service and direction (to_target, from_target).",
		}, []string{"service", "direction"}),
		streams: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "tether_service_streams_total",
			Help: "Service tunnel streams this hub handled, by service, where they came from (agent, site, parent) and result.",
		}, []string{"service", "from", "result"}),
	}
	r.collect = []prometheus.Collector{r.bytes, r.streams}
	if cfg.Metrics != nil {
		for _, c := range r.collect {
			if err := cfg.Metrics.Register(c); err != nil {
				return nil, fmt.Errorf("service: metrics: %w", err)
			}
		}
	}
	return r, nil
}

// Close unregisters the relay's metrics.
func (r *Relay) Close() {
	if r.cfg.Metrics != nil {
		for _, c := range r.collect {
			r.cfg.Metrics.Unregister(c)
		}
	}
}

// Suffix is this hub's suffix under origin ("" for itself); ok is false
// for a hub it does not know above it.
func (r *Relay) Suffix(origin string) (string, bool) {
	if origin == r.cfg.HubID {
		return "", true
	}
	if r.cfg.Suffixes == nil {
		return "", false
	}
	return r.cfg.Suffixes(origin)
}

// ServeConnect serves a tunnel.ServiceConnect stream (its header already
// read) that this hub's own node consumer opened: it reads the request,
// checks the node is a bound consumer of the service, reaches the target,
// answers the agent, and relays until both sides end. It closes st. A
// stream that outlives the consumer's session (resume.Pending) is kept as
// a resumable one from the answer on, as is one from the parent
// (ServeFromParent).
func (r *Relay) ServeConnect(ctx context.Context, st tunnel.Stream, consumer, remote string) {
	_ = st.SetReadDeadline(time.Now().Add(requestTimeout))
	req, err := siteproto.ReadServiceConnect(st)
	_ = st.SetReadDeadline(time.Time{})
	if err != nil {
		r.refuse(st, "?", "agent", store.AuditEvent{Kind: "service_connect", Node: consumer, Remote: remote},
			fmt.Errorf("%w: bad service connect request: %v", ErrRefused, err))
		return
	}
	ev := store.AuditEvent{Kind: "service_connect", Node: consumer, Remote: remote}
	sv, err := r.cfg.Store.GetService(ctx, req.Name)
	if errors.Is(err, store.ErrNotFound) {
		r.refuse(st, req.Name, "agent", ev, fmt.Errorf("%w: no service named %q on this hub", ErrRefused, req.Name))
		return
	}
	if err != nil {
		r.refuse(st, req.Name, "agent", ev, fmt.Errorf("look up service %s: %w", req.Name, err))
		return
	}
	sfx, ok := r.Suffix(sv.Origin)
	if !ok {
		r.refuse(st, sv.Name, "agent", ev,
			fmt.Errorf("%w: service %s comes from a hub this hub no longer knows", ErrRefused, sv.Name))
		return
	}
	if err := CheckConsumer(sv, sfx, consumer); err != nil {
		r.refuse(st, sv.Name, "agent", ev, err)
		return
	}
	rr := &siteproto.RouteRequest{
		Target:      sv.Target,
		Service:     uint8(tunnel.ServiceTCP),
		Port:        sv.Port,
		Purpose:     siteproto.PurposeService,
		Origin:      sv.Origin,
		ServiceName: sv.Name,
		Operator:    "node:" + consumer,
		Trace:       newTrace(),
	}
	r.carry(ctx, st, sv, sfx, "", rr, "agent", ev)
}

// ServeRoute serves a tunnel.ServiceRoute stream that child site child
// opened on its uplink to this hub (header and request already read): it
// checks the request against the service this hub holds, then carries it
// on (down to the target, or further up). It closes st.
func (r *Relay) ServeRoute(
	ctx context.Context, st tunnel.Stream, child string, req *siteproto.RouteRequest, remote string,
) {
	ev := store.AuditEvent{Kind: "service_route", Node: req.Target, Operator: req.Operator, Remote: remote}
	if req.Purpose != siteproto.PurposeService {
		r.refuse(st, "?", "site", ev,
			fmt.Errorf("%w: a site may open route streams to its parent only for service tunnels, not %s", ErrRefused,
				req.Purpose))
		return
	}
	sv, err := r.cfg.Store.GetService(ctx, req.ServiceName)
	if err != nil {
		r.refuse(st, req.ServiceName, "site", ev,
			fmt.Errorf("%w: no service named %q on this hub", ErrRefused, req.ServiceName))
		return
	}
	sfx, ok := r.Suffix(sv.Origin)
	if !ok {
		r.refuse(st, sv.Name, "site", ev,
			fmt.Errorf("%w: service %s comes from a hub this hub no longer knows", ErrRefused, sv.Name))
		return
	}
	if err := CheckRoute(sv, sfx, child, req); err != nil {
		r.refuse(st, sv.Name, "site", ev, err)
		return
	}
	r.carry(ctx, st, sv, sfx, child, req, "site", ev)
}

// ServeFromParent serves a tunnel.ServiceRoute stream for a service that
// this hub's parent opened on its uplink (header and request already
// read): the request must match the service this hub holds, whose target
// must be inside this hub's subtree; the stream goes down to it. It closes
// st.
func (r *Relay) ServeFromParent(ctx context.Context, st tunnel.Stream, req *siteproto.RouteRequest, remote string) {
	ev := store.AuditEvent{Kind: "service_route", Node: req.Target, Operator: req.Operator, Remote: remote}
	sv, err := r.cfg.Store.GetService(ctx, req.ServiceName)
	if err != nil {
		r.refuse(st, req.ServiceName, "parent", ev,
			fmt.Errorf("%w: no service named %q on this hub", ErrRefused, req.ServiceName))
		return
	}
	sfx, ok := r.Suffix(sv.Origin)
	if !ok {
		r.refuse(st, sv.Name, "parent", ev,
			fmt.Errorf("%w: service %s comes from a hub this hub no longer knows", ErrRefused, sv.Name))
		return
	}
	if err := CheckFromParent(sv, sfx, req); err != nil {
		r.refuse(st, sv.Name, "parent", ev, err)
		return
	}
	r.carry(ctx, st, sv, sfx, "", req, "parent", ev)
}

// carry reaches sv's target from this hub, answers st, and relays.
// fromChild is the child site the stream came up from ("" for an agent of
// this hub): the stream never goes back down into it.
func (r *Relay) carry(
	ctx context.Context, st tunnel.Stream, sv store.Service, sfx, fromChild string, req *siteproto.RouteRequest,
	from string, ev store.AuditEvent,
) {
	ev.Detail = fmt.Sprintf("service %s → %s:%d (trace %s)", sv.Name, sv.Target, sv.Port, req.Trace)
	dctx, cancel := context.WithTimeout(ctx, requestTimeout)
	out, route, err := r.reach(dctx, sv, sfx, fromChild, req)
	cancel()
	if err != nil {
		r.refuse(st, sv.Name, from, ev, err)
		return
	}
	if err := tunnel.WriteReply(st, tunnel.Reply{OK: true}); err != nil {
		st.Close()
		out.Close()
		return
	}
	// A stream that outlives its tunnel session (resume.Pending) is kept
	// as a resumable one from its answer on.
	st, err = resume.Answered(st)
	if err != nil {
		r.cfg.Logger.Info("service stream not kept", "service", sv.Name, "from", from, "err", err)
		out.Close()
		return
	}
	r.streams.WithLabelValues(sv.Name, from, "ok").Inc()
	toTarget, fromTarget := r.bytes.WithLabelValues(sv.Name, "to_target"), r.bytes.WithLabelValues(sv.Name, "from_target")
	stop := context.AfterFunc(ctx, func() { st.Close(); out.Close() })
	defer stop()
	start := time.Now()
	n := tunnel.Pipe(st, out, func(aToB bool, n int) {
		if aToB {
			toTarget.Add(float64(n))
		} else {
			fromTarget.Add(float64(n))
		}
	})
	ev.At, ev.Result, ev.EndedAt = start, "ok", time.Now()
	ev.BytesToNode, ev.BytesFromNode = n.AtoB, n.BtoA
	ev.Detail += " via " + route
	r.cfg.Audit(ev)
}

// reach opens the stream to sv's target: down when it is inside this
// hub's subtree, up otherwise.
func (r *Relay) reach(
	ctx context.Context, sv store.Service, sfx, fromChild string, req *siteproto.RouteRequest,
) (tunnel.Stream, string, error) {
	rel, inside := Relative(sv.Target, sfx)
	if inside {
		if fromChild != "" && Under(rel, fromChild) {
			return nil, "", fmt.Errorf("%w: service %s's target %s is below site %s, which sent the stream up", ErrRefused,
				sv.Name, rel, fromChild)
		}
		return r.cfg.DialDown(ctx, rel, sv.Port, req)
	}
	if r.cfg.OpenUp == nil {
		return nil, "", fmt.Errorf("%w: service %s's target %s is outside this hub's subtree and the hub has no parent",
			ErrRefused, sv.Name, sv.Target)
	}
	st, err := r.cfg.OpenUp(ctx, req)
	if err != nil {
		return nil, "", fmt.Errorf("service %s: up to the parent hub: %w", sv.Name, err)
	}
	return st, "parent", nil
}

func (r *Relay) refuse(st tunnel.Stream, name, from string, ev store.AuditEvent, err error) {
	r.streams.WithLabelValues(name, from, "refused").Inc()
	r.cfg.Logger.Info("service stream refused", "service", name, "from", from, "node", ev.Node, "err", err)
	ev.At, ev.Result = time.Now(), "refused"
	if ev.Detail == "" {
		ev.Detail = "service " + name
	}
	ev.Detail += ": " + err.Error()
	r.cfg.Audit(ev)
	_ = st.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = tunnel.WriteReply(st, tunnel.Reply{OK: false, Reason: reason(err)})
	st.Close()
}

// reason fits an error into a stream reply's reason.
func reason(err error) string {
	s := strings.Map(func(r rune) rune {
		if unicode.IsControl(r) {
			return ' '
		}
		return r
	}, err.Error())
	if len(s) > tunnel.MaxReasonLen {
		s = s[:tunnel.MaxReasonLen-3] + "..."
	}
	return strings.ToValidUTF8(s, "?")
}

func newTrace() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}
