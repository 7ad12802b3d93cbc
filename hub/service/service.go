// Package service is the hub's side of service tunnels: a node's
// allow-listed TCP port published under a name (`tether service expose`),
// and consumer nodes that listen on a loopback port for it (`tether service
// connect`). A consumer's agent opens a tunnel.ServiceConnect stream per
// connection it accepts; the consumer's hub carries it to the target's node
// through the nearest common hub of the tree: down through the door when
// the target is inside its own subtree, up its uplink otherwise.
//
// Names. A service is created at one hub (its origin) and sent as a desired
// object to every site below it; every hub holding it keeps the target and
// the consumers as the origin names them ("n3.berlin"), and reads them
// relative to itself by stripping its own suffix under the origin
// (Relative). A hub outside the origin's subtree never holds the service,
// so no stream for it ever goes above its origin.
//
// What a stream may reach is the service and nothing else: a consumer
// agent reaches the target's one port only if it is a bound consumer, and
// a child site's route request must name the service's exact target and
// port and come from a site with a consumer below it (Check*).
//
// Tunnels (tunnels.go) wires them into a hub: the Relay that carries the
// streams, the bindings pushed to consumer agents, services as a kind of
// desired state; API (api.go) serves /v1/services.
package service

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// Kind is the desired-object kind of services.
const Kind = "service"

// ErrInvalid is wrapped by every validation error of a service or binding.
var ErrInvalid = errors.New("service: invalid")

// ErrRefused is wrapped by every refusal of a stream for a service.
var ErrRefused = errors.New("service: refused")

// Spec is the desired object's document of a service: target and bindings
// named as the origin hub names them.
type Spec struct {
	Target   string        `json:"target"`
	Port     uint16        `json:"port"`
	Bindings []SpecBinding `json:"bindings,omitempty"`
}

// SpecBinding is one consumer in a Spec.
type SpecBinding struct {
	Consumer string `json:"consumer"`
	Port     uint16 `json:"port"`
}

// SpecOf is the desired document of sv.
func SpecOf(sv store.Service) json.RawMessage {
	sp := Spec{Target: sv.Target, Port: sv.Port}
	for _, b := range sv.Bindings {
		sp.Bindings = append(sp.Bindings, SpecBinding{Consumer: b.Consumer, Port: b.Port})
	}
	out, _ := json.Marshal(sp)
	return out
}

// FromSpec decodes and validates a desired object's document into the
// service it describes.
func FromSpec(origin, name string, generation int64, raw json.RawMessage) (store.Service, error) {
	var sp Spec
	dec := json.NewDecoder(strings.NewReader(string(raw)))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&sp); err != nil {
		return store.Service{}, fmt.Errorf("%w: service %s: spec: %v", ErrInvalid, name, err)
	}
	sv := store.Service{Name: name, Origin: origin, Target: sp.Target, Port: sp.Port, Generation: generation}
	for _, b := range sp.Bindings {
		sv.Bindings = append(sv.Bindings, store.ServiceBinding{Consumer: b.Consumer, Port: b.Port})
	}
	return sv, Validate(sv)
}

// Validate checks a service's name, target, port and bindings: at most one
// binding per consumer, at most siteproto.MaxServiceBindings in all.
func Validate(sv store.Service) error {
	if err := siteproto.ValidLabel("service name", sv.Name); err != nil {
		return fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := siteproto.ValidNodePath(sv.Target); err != nil {
		return fmt.Errorf("%w: service %s target: %v", ErrInvalid, sv.Name, err)
	}
	if sv.Port == 0 {
		return fmt.Errorf("%w: service %s: port 0 (want 1..65535)", ErrInvalid, sv.Name)
	}
	if len(sv.Bindings) > siteproto.MaxServiceBindings*16 {
		return fmt.Errorf("%w: service %s has %d consumers, at most %d", ErrInvalid, sv.Name, len(sv.Bindings),
			siteproto.MaxServiceBindings*16)
	}
	seen := map[string]bool{}
	for _, b := range sv.Bindings {
		if err := ValidateBinding(b); err != nil {
			return fmt.Errorf("service %s: %w", sv.Name, err)
		}
		if b.Consumer == sv.Target {
			return fmt.Errorf("%w: service %s: node %s is its own target; connect to the port directly", ErrInvalid, sv.Name,
				b.Consumer)
		}
		if seen[b.Consumer] {
			return fmt.Errorf("%w: service %s: node %s is bound twice", ErrInvalid, sv.Name, b.Consumer)
		}
		seen[b.Consumer] = true
	}
	return nil
}

// ValidateBinding checks one consumer binding: a node path and a port.
func ValidateBinding(b store.ServiceBinding) error {
	if err := siteproto.ValidNodePath(b.Consumer); err != nil {
		return fmt.Errorf("%w: consumer: %v", ErrInvalid, err)
	}
	if b.Port == 0 {
		return fmt.Errorf("%w: consumer %s: local port 0 (want 1..65535)", ErrInvalid, b.Consumer)
	}
	return nil
}

// Relative is path (named as a hub above this one names it) as this hub
// names it, given this hub's suffix under that hub ("" when it is that
// hub): "n3.berlin" with suffix "berlin" is "n3". ok is false when path is
// not inside this hub's subtree.
func Relative(path, suffix string) (rel string, ok bool) {
	if suffix == "" {
		return path, true
	}
	rel, ok = strings.CutSuffix(path, "."+suffix)
	if !ok || rel == "" {
		return "", false
	}
	return rel, true
}

// Under reports whether node path rel (relative to a hub) lies below that
// hub's child site child: "n3.berlin" and "n3.sub.berlin" are under
// "berlin".
func Under(rel, child string) bool { return strings.HasSuffix(rel, "."+child) }

// Suffixes tells how a hub is named by the hubs above it.
type Suffixes func(origin string) (suffix string, ok bool)

// BindingsFor are the listeners node (one of this hub's own nodes, by its
// name) runs for services, in the wire form the agent takes, sorted by
// name. A binding port already taken by an earlier service (by name) on
// the same node is left out: the hub refuses such a connect, so only
// objects sent from different origins can collide.
func BindingsFor(svcs []store.Service, suffixes Suffixes, node string) []siteproto.ServiceBinding {
	out := []siteproto.ServiceBinding{}
	used := map[uint16]bool{}
	for _, sv := range svcs {
		sfx, ok := suffixes(sv.Origin)
		if !ok {
			continue
		}
		for _, b := range sv.Bindings {
			rel, ok := Relative(b.Consumer, sfx)
			if !ok || rel != node || used[b.Port] {
				continue
			}
			used[b.Port] = true
			out = append(out, siteproto.ServiceBinding{Name: sv.Name, Listen: fmt.Sprintf("127.0.0.1:%d", b.Port)})
		}
	}
	slices.SortFunc(out, func(a, b siteproto.ServiceBinding) int { return strings.Compare(a.Name, b.Name) })
	if len(out) > siteproto.MaxServiceBindings {
		out = out[:siteproto.MaxServiceBindings]
	}
	return out
}

// Consumers are the nodes of this hub (names without a dot) that consume
// sv, given this hub's suffix under its origin.
func Consumers(sv store.Service, suffix string) []string {
	var out []string
	for _, b := range sv.Bindings {
		if rel, ok := Relative(b.Consumer, suffix); ok && !strings.Contains(rel, ".") {
			out = append(out, rel)
		}
	}
	return out
}

// CheckConsumer decides whether this hub's own node consumer may open a
// stream for sv: it must be one of sv's bound consumers.
func CheckConsumer(sv store.Service, suffix, consumer string) error {
	if slices.Contains(Consumers(sv, suffix), consumer) {
		return nil
	}
	return fmt.Errorf("%w: node %s is not a consumer of service %s (`tether service connect %s --from %s --local-port P`)",
		ErrRefused, consumer, sv.Name, sv.Name, consumer)
}

// CheckRoute decides whether a route request that came up from this hub's
// child site child may be carried for sv: it must name sv's origin, its
// exact target as the origin names it, its port over TCP, and sv must have
// a consumer below child. So a site cannot use a service to reach anything
// but the one node and port the service names.
func CheckRoute(sv store.Service, suffix, child string, req *siteproto.RouteRequest) error {
	switch {
	case req.Purpose != siteproto.PurposeService || req.ServiceName != sv.Name:
		return fmt.Errorf("%w: route for %s %q is not for service %s", ErrRefused, req.Purpose, req.ServiceName, sv.Name)
	case req.Origin != sv.Origin:
		return fmt.Errorf("%w: service %s: route names origin %.16s…, the service's is %.16s…", ErrRefused, sv.Name,
			req.Origin, sv.Origin)
	case req.Target != sv.Target || req.Service != 2 || req.Port != sv.Port:
		return fmt.Errorf("%w: service %s leads to %s:%d only, not %s:%d", ErrRefused, sv.Name, sv.Target, sv.Port,
			req.Target, req.Port)
	}
	for _, b := range sv.Bindings {
		if rel, ok := Relative(b.Consumer, suffix); ok && Under(rel, child) {
			return nil
		}
	}
	return fmt.Errorf("%w: service %s has no consumer below site %s", ErrRefused, sv.Name, child)
}

// CheckFromParent decides whether a route request that came down from this
// hub's parent may be carried for sv: it must name sv's origin, and sv's
// exact target (as this hub names it, inside its own subtree) and port
// over TCP.
func CheckFromParent(sv store.Service, suffix string, req *siteproto.RouteRequest) error {
	rel, inside := Relative(sv.Target, suffix)
	switch {
	case req.Purpose != siteproto.PurposeService || req.ServiceName != sv.Name:
		return fmt.Errorf("%w: route for %s %q is not for service %s", ErrRefused, req.Purpose, req.ServiceName, sv.Name)
	case req.Origin != sv.Origin:
		return fmt.Errorf("%w: service %s: route names origin %.16s…, the service's is %.16s…", ErrRefused, sv.Name,
			req.Origin, sv.Origin)
	case !inside:
		return fmt.Errorf("%w: service %s's target %s is not below this hub", ErrRefused, sv.Name, sv.Target)
	case req.Target != rel || req.Service != 2 || req.Port != sv.Port:
		return fmt.Errorf("%w: service %s leads to %s:%d only, not %s:%d", ErrRefused, sv.Name, rel, sv.Port, req.Target,
			req.Port)
	}
	return nil
}

// ValidateSpec checks a desired object's document of a service.
func ValidateSpec(spec json.RawMessage) error {
	_, err := FromSpec(strings.Repeat("0", 64), "spec", 1, spec)
	return err
}
