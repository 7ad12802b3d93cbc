package hub

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/desired"
	"github.com/tether-dev/tether/hub/mission"
	"github.com/tether-dev/tether/hub/registry"
	"github.com/tether-dev/tether/hub/service"
	"github.com/tether-dev/tether/hub/site"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// serviceHub wires service tunnels into the hub: the relay that carries
// their streams (hub/service), the bindings pushed to this hub's consumer
// agents (those that announced control.CapServiceConnect), and the API's
// hooks.
type serviceHub struct {
	s     *Server
	relay *service.Relay
	log   *slog.Logger
	kick  chan struct{} // a service changed: push bindings again

	mu        sync.Mutex // guards consumers
	consumers map[*registry.Conn]*consumer
}

// consumer is one connected agent that runs service listeners.
type consumer struct {
	mu   sync.Mutex // serializes pushes to the agent
	sent []byte     // the bindings last sent (JSON), nil before the first
}

// startServices builds the relay, registers services as a kind of desired
// state (sent down to every site), hooks the streams of the tree (from
// child sites up, from the parent down) and starts the bindings pusher;
// stop ends it. Call it before the desired-state sync runs and before
// sessions are accepted.
func (s *Server) startServices(ctx context.Context) (stop func(), err error) {
	h := &serviceHub{s: s, log: s.log.With("component", "services"), kick: make(chan struct{}, 1), consumers: map[*registry.Conn]*consumer{}}
	cfg := service.Config{Store: s.store, HubID: s.ca.Pin(), DialDown: h.dialDown, Audit: s.audit, Metrics: s.metrics.Registry, Logger: h.log}
	if u := s.uplink; u != nil {
		self := s.ca.Pin()
		cfg.Suffixes = func(origin string) (string, bool) { return mission.RelativePath(self, origin, u.Path(), u.Ancestors()) }
		cfg.OpenUp = h.openUp
	}
	h.relay, err = service.New(cfg)
	if err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	if s.desired != nil {
		if err := s.desired.Register(desired.Kind{Name: service.Kind, Validate: service.ValidateSpec, Apply: h.apply}); err != nil {
			h.relay.Close()
			return nil, fmt.Errorf("hub: %w", err)
		}
		if err := h.reconcile(ctx); err != nil {
			h.relay.Close()
			return nil, err
		}
	}
	if s.children != nil {
		s.children.ServeStreams(h.serveSiteStream)
	}
	s.siteServiceRoutes = func(ctx context.Context, st tunnel.Stream, req *control.RouteRequest) {
		h.relay.ServeFromParent(ctx, st, req, "parent")
	}
	s.services = h
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		h.runPusher(ctx)
	}()
	return func() { cancel(); <-done; h.relay.Close() }, nil
}

// dialDown reaches port on node target (relative to this hub) through the
// door: every decision about reaching a node, and its route, is the door's.
// A site route below carries the service's name, origin and trace, so
// every hub on the way checks and audits it.
func (h *serviceHub) dialDown(ctx context.Context, target string, port uint16, req *control.RouteRequest) (tunnel.Stream, string, error) {
	ctx = access.WithHop(ctx, access.Hop{Purpose: control.PurposeService, Operator: req.Operator, Origin: req.Origin, Trace: req.Trace, Service: req.ServiceName})
	_, route, err := h.s.door.Resolve(ctx, access.ByName(target))
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
// them (its welcome listed control.HubCapSiteStreams).
func (h *serviceHub) openUp(ctx context.Context, req *control.RouteRequest) (tunnel.Stream, error) {
	u := h.s.uplink
	if !u.Connected() {
		return nil, fmt.Errorf("the uplink to the parent hub is down: %w", site.ErrUplinkDown)
	}
	if !slices.Contains(u.ParentCapabilities(), control.HubCapSiteStreams) {
		return nil, errors.New("the parent hub takes no service streams from its sites (upgrade it)")
	}
	return u.OpenRoute(ctx, req)
}

// serveSiteStream serves a service route stream child site c opened on
// its session to this hub (hub/site read and checked the header and
// request): services turn at the nearest common hub, so the request is
// checked against the service this hub holds and carried on.
func (h *serviceHub) serveSiteStream(ctx context.Context, c site.Child, st tunnel.Stream, req *control.RouteRequest) {
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	h.relay.ServeRoute(ctx, st, c.Name, req, "site "+c.Name)
}

// apply mirrors a service object stored by the desired-state sync into
// this hub's services (at a site: one created above; at the origin the API
// stored it already), then pushes the consumers' bindings again.
func (h *serviceHub) apply(ctx context.Context, o control.DesiredObject) {
	if o.Origin != h.s.ca.Pin() {
		if err := h.mirror(ctx, o); err != nil {
			h.log.Error("service from a hub above not applied", "service", o.Name, "origin", o.Origin, "generation", o.Generation, "err", err)
		}
	}
	h.Changed(ctx, store.Service{Name: o.Name, Origin: o.Origin, Generation: o.Generation}, o.Deleted)
}

func (h *serviceHub) mirror(ctx context.Context, o control.DesiredObject) error {
	var next *store.Service
	if !o.Deleted {
		sv, err := service.FromSpec(o.Origin, o.Name, o.Generation, o.Spec)
		if err != nil {
			return err
		}
		next = &sv
	}
	_, err := h.s.store.UpdateService(ctx, o.Name, func(cur *store.Service) (*store.Service, error) {
		switch {
		case cur != nil && cur.Origin != o.Origin:
			return nil, fmt.Errorf("a service named %s from another hub (%.16s…) is held here; the names clash", o.Name, cur.Origin)
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
func (h *serviceHub) reconcile(ctx context.Context) error {
	self := h.s.ca.Pin()
	svcs, err := h.s.store.ListServices(ctx)
	if err != nil {
		return fmt.Errorf("hub: services: %w", err)
	}
	local := map[string]bool{}
	for _, sv := range svcs {
		if sv.Origin == self {
			local[sv.Name] = true
			if _, _, err := h.s.desired.Put(ctx, service.Kind, sv.Name, service.SpecOf(sv)); err != nil {
				h.log.Error("service not sent to the sites", "service", sv.Name, "err", err)
			}
		}
	}
	recs, err := h.s.desired.List(ctx, service.Kind)
	if err != nil {
		return fmt.Errorf("hub: services: %w", err)
	}
	for _, r := range recs {
		o := r.DesiredObject
		switch {
		case o.Origin == self && !o.Deleted && !local[o.Name]:
			if _, err := h.s.desired.Delete(ctx, service.Kind, o.Name); err != nil {
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
func (h *serviceHub) HubID() string { return h.s.ca.Pin() }

// Changed implements api.Services: the consumers' bindings are pushed
// again (by the pusher, so an API call never waits for a slow agent).
func (h *serviceHub) Changed(ctx context.Context, sv store.Service, deleted bool) {
	h.log.Info("service changed", "service", sv.Name, "generation", sv.Generation, "deleted", deleted)
	if sv.Origin == h.s.ca.Pin() && sv.Target != "" && h.s.desired != nil {
		// Created or changed here (the API): every site below gets it.
		var err error
		if deleted {
			_, err = h.s.desired.Delete(ctx, service.Kind, sv.Name)
		} else {
			_, _, err = h.s.desired.Put(ctx, service.Kind, sv.Name, service.SpecOf(sv))
		}
		if err != nil {
			h.log.Error("service change not sent to the sites; it is sent at the next start", "service", sv.Name, "err", err)
		}
	}
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// connected registers a consumer agent's session and pushes its bindings
// (an empty list too: it closes listeners of a previous session's).
// The returned function unregisters it.
func (h *serviceHub) connected(ctx context.Context, conn *registry.Conn) (gone func()) {
	c := &consumer{}
	h.mu.Lock()
	h.consumers[conn] = c
	h.mu.Unlock()
	if svcs, err := h.s.store.ListServices(ctx); err != nil {
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

func (h *serviceHub) runPusher(ctx context.Context) {
	t := time.NewTicker(bindingsRecheck)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.kick:
		case <-t.C:
		}
		svcs, err := h.s.store.ListServices(ctx)
		if err != nil {
			h.log.Error("service bindings: list services", "err", err)
			continue
		}
		h.mu.Lock()
		all := make(map[*registry.Conn]*consumer, len(h.consumers))
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
func (h *serviceHub) push(conn *registry.Conn, c *consumer, svcs []store.Service) {
	c.mu.Lock()
	defer c.mu.Unlock()
	bs := service.BindingsFor(svcs, h.relay.Suffix, conn.Name)
	sum, _ := json.Marshal(bs)
	if c.sent != nil && slices.Equal(sum, c.sent) {
		return
	}
	if err := conn.Send(&control.Message{Type: control.TypeServiceBindings, ServiceBindings: bs}); err != nil {
		h.log.Info("service bindings not sent", "node", conn.Name, "err", err)
		return
	}
	c.sent = sum
}
