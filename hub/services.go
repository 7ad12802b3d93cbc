package hub

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/registry"
	"github.com/tether-dev/tether/hub/service"
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

// startServices builds the relay and starts the bindings pusher; stop ends
// it. Call it before sessions are accepted.
func (s *Server) startServices(ctx context.Context) (stop func(), err error) {
	h := &serviceHub{s: s, log: s.log.With("component", "services"), kick: make(chan struct{}, 1), consumers: map[*registry.Conn]*consumer{}}
	h.relay, err = service.New(service.Config{Store: s.store, HubID: s.ca.Pin(), DialDown: h.dialDown, Audit: s.audit,
		Metrics: s.metrics.Registry, Logger: h.log})
	if err != nil {
		return nil, fmt.Errorf("hub: %w", err)
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
func (h *serviceHub) dialDown(ctx context.Context, target string, port uint16, _ *control.RouteRequest) (tunnel.Stream, string, error) {
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

// HubID implements api.Services.
func (h *serviceHub) HubID() string { return h.s.ca.Pin() }

// Changed implements api.Services: the consumers' bindings are pushed
// again (by the pusher, so an API call never waits for a slow agent).
func (h *serviceHub) Changed(ctx context.Context, sv store.Service, deleted bool) {
	h.log.Info("service changed", "service", sv.Name, "generation", sv.Generation, "deleted", deleted)
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

func (h *serviceHub) runPusher(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-h.kick:
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
