package sshconn

import (
	"context"
	"errors"
	"testing"

	"github.com/tether-dev/tether/tunnel"
)

// recordingRoute is an access.Route that records its dials.
type recordingRoute struct{ dials []tunnel.Header }

var errRouteDialed = errors.New("route dialed")

func (r *recordingRoute) Dial(_ context.Context, h tunnel.Header) (tunnel.Stream, error) {
	r.dials = append(r.dials, h)
	return nil, errRouteDialed
}
func (r *recordingRoute) String() string { return "recording" }

// TestProvisionDialUsesConnectsRoute: the runner's dial reuses the route
// connect resolved for the same node ID and name (one store read per node
// of a fan-out instead of two), and refuses a dial that carries no node ID.
func TestProvisionDialUsesConnectsRoute(t *testing.T) {
	p := &Connector{} // no door: a second look-up would panic
	route := &recordingRoute{}
	ctx := context.WithValue(t.Context(), nodeIDKey{}, resolvedNode{id: "id-1", name: "node-1", route: route})
	if _, err := p.dial(ctx, "node-1"); !errors.Is(err, errRouteDialed) {
		t.Fatalf("dial = %v, want the resolved route's dial", err)
	}
	if len(route.dials) != 1 || route.dials[0].Service != tunnel.ServiceSSH {
		t.Fatalf("route dials = %+v, want one ssh stream", route.dials)
	}
	if _, err := p.dial(t.Context(), "node-1"); err == nil {
		t.Fatal("dial without a node id succeeded")
	}
}
