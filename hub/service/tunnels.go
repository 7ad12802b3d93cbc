package service

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/desired"
	"github.com/tether-dev/tether/hub/mission"
	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/site"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// Door resolves a node, by name relative to this hub, to its route; every
// decision about reaching a node is the door's (access.Door).
type Door interface {
	Resolve(ctx context.Context, ref access.NodeRef) (store.Node, access.Route, error)
}

// Uplink is this hub's session with its parent (site.Uplink).
type Uplink interface {
	Path() string
	Ancestors() []string
	Connected() bool
	ParentCapabilities() []string
	OpenRoute(ctx context.Context, req *siteproto.RouteRequest) (tunnel.Stream, error)
}

// Desired is the desired-state sync that sends services down the tree of
// hubs (desired.Sync).
type Desired interface {
	Register(k desired.Kind) error
	Put(ctx context.Context, kind, name string, spec json.RawMessage) (siteproto.DesiredObject, bool, error)
	Delete(ctx context.Context, kind, name string) (siteproto.DesiredObject, error)
	List(ctx context.Context, kind string) ([]store.DesiredRecord, error)
}

// Children takes the service streams child sites open (site.Children).
type Children interface {
	ServeStreams(f func(ctx context.Context, c site.Child, st tunnel.Stream, req *siteproto.RouteRequest))
}

// TunnelsConfig is what a hub's service tunnels work with.
type TunnelsConfig struct {
	Store interface {
		GetService(ctx context.Context, name string) (store.Service, error)
		ListServices(ctx context.Context) ([]store.Service, error)
		UpdateService(ctx context.Context, name string,
			f func(cur *store.Service) (*store.Service, error)) (*store.Service, error)
	}
	HubID string
	Door  Door
	// Uplink is nil on a hub without a parent.
	Uplink Uplink
	// Desired is nil when services are not sent down to sites.
	Desired Desired
	// Children is nil on a hub that takes no sites.
	Children Children
	Audit    func(store.AuditEvent)
	Metrics  prometheus.Registerer
	Logger   *slog.Logger
}

// Tunnels wires service tunnels into a hub: the relay that carries their
// streams, the bindings pushed to this hub's consumer agents (those that
// announced siteproto.CapServiceConnect), and the API's hooks.
type Tunnels struct {
	cfg   TunnelsConfig
	relay *Relay
	log   *slog.Logger
	kick  chan struct{} // a service changed: push bindings again

	mu        sync.Mutex // guards consumers
	consumers map[*nodeconn.Conn]*consumer
}

// consumer is one connected agent that runs service listeners.
type consumer struct {
	name string
	mu   sync.Mutex // serializes pushes to the agent
	sent []byte     // the bindings last sent (JSON), nil before the first
}

// NewTunnels builds the relay (its counters registered on cfg.Metrics
// until Start's stop), registers services as a kind of desired state (sent
// down to every site) and hooks the streams of the tree (from child sites
// up; ServeFromParent for those from the parent down). Call it before the
// desired-state sync runs, and Start before sessions are accepted.
func NewTunnels(cfg TunnelsConfig) (*Tunnels, error) {
	h := &Tunnels{cfg: cfg, log: cfg.Logger, kick: make(chan struct{}, 1), consumers: map[*nodeconn.Conn]*consumer{}}
	rcfg := Config{Store: cfg.Store, HubID: cfg.HubID, DialDown: h.dialDown, Audit: cfg.Audit, Metrics: cfg.Metrics,
		Logger: h.log}
	if u := cfg.Uplink; u != nil {
		self := cfg.HubID
		rcfg.Suffixes = func(origin string) (string, bool) {
			return mission.RelativePath(self, origin, u.Path(), u.Ancestors())
		}
		rcfg.OpenUp = h.openUp
	}
	var err error
	h.relay, err = New(rcfg)
	if err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	if cfg.Desired != nil {
		if err := cfg.Desired.Register(desired.Kind{Name: Kind, Validate: ValidateSpec, Apply: h.apply}); err != nil {
			h.relay.Close()
			return nil, fmt.Errorf("hub: %w", err)
		}
	}
	if cfg.Children != nil {
		cfg.Children.ServeStreams(h.serveSiteStream)
	}
	return h, nil
}

// Start brings the services table and the desired state into step (a hub
// may have died between storing one and the other) and pushes the
// consumers' bindings until stop is called; stop also unregisters the
// relay's counters, as does a failed Start.
func (h *Tunnels) Start(ctx context.Context) (stop func(), err error) {
	if h.cfg.Desired != nil {
		if err := h.reconcile(ctx); err != nil {
			h.relay.Close()
			return nil, err
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.runPusher(ctx)
	}()
	return func() { cancel(); <-done; h.relay.Close() }, nil
}

// ServeConnect carries a consumer agent's tunnel.ServiceConnect stream.
func (h *Tunnels) ServeConnect(ctx context.Context, st tunnel.Stream, consumer, remote string) {
	h.relay.ServeConnect(ctx, st, consumer, remote)
}

// ServeFromParent serves a service route stream the parent opened on this
// site hub's uplink.
func (h *Tunnels) ServeFromParent(ctx context.Context, st tunnel.Stream, req *siteproto.RouteRequest) {
	h.relay.ServeFromParent(ctx, st, req, "parent")
}

// dialDown reaches port on node target (relative to this hub) through the
// door. A site route below carries the service's name, origin and trace,
// so every hub on the way checks and audits it.
func (h *Tunnels) dialDown(ctx context.Context, target string, port uint16,
	req *siteproto.RouteRequest) (tunnel.Stream, string, error) {
	ctx = access.WithHop(ctx, access.Hop{Purpose: siteproto.PurposeService, Operator: req.Operator, Origin: req.Origin,
		Trace: req.Trace, Service: req.ServiceName})
	_, route, err := h.cfg.Door.Resolve(ctx, access.ByName(target))
	if err != nil {
		return nil, "", err
	}
	st, err := route.Dial(ctx, tunnel.Header{Service: tunnel.ServiceTCP, Port: port})
	if err != nil {
		return nil, "", fmt.Errorf("node %s port %d: %w", target, port, err)
	}
	return st, route.String(), nil
}

// openUp sends a service stream up the uplink, to a parent that takes
// them (its welcome listed siteproto.HubCapSiteStreams).
func (h *Tunnels) openUp(ctx context.Context, req *siteproto.RouteRequest) (tunnel.Stream, error) {
	u := h.cfg.Uplink
	if !u.Connected() {
		return nil, fmt.Errorf("the uplink to the parent hub is down: %w", site.ErrUplinkDown)
	}
	if !slices.Contains(u.ParentCapabilities(), siteproto.HubCapSiteStreams) {
		return nil, errors.New("the parent hub takes no service streams from its sites (upgrade it)")
	}
	return u.OpenRoute(ctx, req)
}

// serveSiteStream serves a service route stream child site c opened on
// its session to this hub (hub/site read and checked the header and
// request): services turn at the nearest common hub, so the request is
// checked against the service this hub holds and carried on.
func (h *Tunnels) serveSiteStream(ctx context.Context, c site.Child, st tunnel.Stream, req *siteproto.RouteRequest) {
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	h.relay.ServeRoute(ctx, st, c.Name, req, "site "+c.Name)
}

// apply mirrors a service object stored by the desired-state sync into
// this hub's services (at a site: one created above; at the origin the API
// stored it already), then pushes the consumers' bindings again.
func (h *Tunnels) apply(ctx context.Context, o siteproto.DesiredObject) {
	if o.Origin != h.cfg.HubID {
		if err := h.mirror(ctx, o); err != nil {
			h.log.Error("service from a hub above not applied", "service", o.Name, "origin", o.Origin,
				"generation", o.Generation, "err", err)
		}
	}
	h.Changed(ctx, store.Service{Name: o.Name, Origin: o.Origin, Generation: o.Generation}, o.Deleted)
}

func (h *Tunnels) mirror(ctx context.Context, o siteproto.DesiredObject) error {
	var next *store.Service
	if !o.Deleted {
		sv, err := FromSpec(o.Origin, o.Name, o.Generation, o.Spec)
		if err != nil {
			return err
		}
		next = &sv
	}
	_, err := h.cfg.Store.UpdateService(ctx, o.Name, func(cur *store.Service) (*store.Service, error) {
		switch {
		case cur != nil && cur.Origin != o.Origin:
			return nil, fmt.Errorf("a service named %s from another hub (%.16s…) is held here; the names clash",
				o.Name, cur.Origin)
		case cur != nil && cur.Generation >= o.Generation:
			return cur, nil // nothing newer
		case next == nil:
			return nil, nil
		}
		now := time.Now().UTC()
		next.CreatedAt, next.UpdatedAt, next.CreatedBy = now, now, "hub "+o.Origin[:12]
		if cur != nil {
			next.CreatedAt = cur.CreatedAt
		}
		return next, nil
	})
	return err
}

// reconcile brings the services table and the desired state into step at
// start: a hub that died between storing one and the other, or an Apply
// that was never run, leaves them apart.
func (h *Tunnels) reconcile(ctx context.Context) error {
	self := h.cfg.HubID
	svcs, err := h.cfg.Store.ListServices(ctx)
	if err != nil {
		return fmt.Errorf("hub: services: %w", err)
	}
	local := map[string]bool{}
	for _, sv := range svcs {
		if sv.Origin == self {
			local[sv.Name] = true
			if _, _, err := h.cfg.Desired.Put(ctx, Kind, sv.Name, SpecOf(sv)); err != nil {
				h.log.Error("service not sent to the sites", "service", sv.Name, "err", err)
			}
		}
	}
	recs, err := h.cfg.Desired.List(ctx, Kind)
	if err != nil {
		return fmt.Errorf("hub: services: %w", err)
	}
	for _, r := range recs {
		o := r.DesiredObject
		switch {
		case o.Origin == self && !o.Deleted && !local[o.Name]:
			if _, err := h.cfg.Desired.Delete(ctx, Kind, o.Name); err != nil {
				h.log.Error("deleted service not withdrawn from the sites", "service", o.Name, "err", err)
			}
		case o.Origin != self:
			if err := h.mirror(ctx, o); err != nil {
				h.log.Error("service from a hub above not applied", "service", o.Name, "origin", o.Origin, "err", err)
			}
		}
	}
	return nil
}

// HubID implements api.Services.
func (h *Tunnels) HubID() string { return h.cfg.HubID }

// Changed implements api.Services: the consumers' bindings are pushed
// again (by the pusher, so an API call never waits for a slow agent).
func (h *Tunnels) Changed(ctx context.Context, sv store.Service, deleted bool) {
	h.log.Info("service changed", "service", sv.Name, "generation", sv.Generation, "deleted", deleted)
	if sv.Origin == h.cfg.HubID && sv.Target != "" && h.cfg.Desired != nil {
		// Created or changed here (the API): every site below gets it.
		var err error
		if deleted {
			_, err = h.cfg.Desired.Delete(ctx, Kind, sv.Name)
		} else {
			_, _, err = h.cfg.Desired.Put(ctx, Kind, sv.Name, SpecOf(sv))
		}
		if err != nil {
			h.log.Error("service change not sent to the sites; it is sent at the next start", "service", sv.Name,
				"err", err)
		}
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// Connected registers a consumer agent's session and pushes its bindings
// (an empty list too: it closes listeners of a previous session's).
// The returned function unregisters it.
func (h *Tunnels) Connected(ctx context.Context, conn *nodeconn.Conn) (gone func()) {
	c := &consumer{name: conn.Name}
	h.mu.Lock()
	h.consumers[conn] = c
	h.mu.Unlock()
	if svcs, err := h.cfg.Store.ListServices(ctx); err != nil {
		h.log.Error("service bindings: list services", "err", err)
	} else {
		h.push(conn, c, svcs)
	}
	return func() {
		h.mu.Lock()
		delete(h.consumers, conn)
		h.mu.Unlock()
	}
}

// bindingsRecheck is how often the pusher compares every consumer's
// bindings with the store even without a change here: a change made at
// another hub replica sharing the store reaches this one's consumers
// within it (only differences are sent).
const bindingsRecheck = 30 * time.Second

func (h *Tunnels) runPusher(ctx context.Context) {
	t := time.NewTicker(bindingsRecheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.kick:
		case <-t.C:
		}
		svcs, err := h.cfg.Store.ListServices(ctx)
		if err != nil {
			h.log.Error("service bindings: list services", "err", err)
			continue
		}
		h.mu.Lock()
		all := make(map[*nodeconn.Conn]*consumer, len(h.consumers))
		for conn, c := range h.consumers {
			all[conn] = c
		}
		h.mu.Unlock()
		for conn, c := range all {
			h.push(conn, c, svcs)
		}
	}
}

// push sends conn its bindings if they differ from what it last got.
func (h *Tunnels) push(conn *nodeconn.Conn, c *consumer, svcs []store.Service) {
	c.mu.Lock()
	defer c.mu.Unlock()
	bs := BindingsFor(svcs, h.relay.Suffix, c.name)
	sum, _ := json.Marshal(bs)
	if c.sent != nil && slices.Equal(sum, c.sent) {
		return
	}
	if err := conn.Send(&control.Message{Type: siteproto.TypeServiceBindings, ServiceBindings: bs}); err != nil {
		h.log.Info("service bindings not sent", "node", c.name, "err", err)
		return
	}
	c.sent = sum
}
