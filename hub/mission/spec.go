// Package mission runs missions: a script placed down the tree of hubs
// (sites by name, nodes by labels), run once per generation on every
// matching node by the job engine of the hub the node belongs to, with an
// optional state check run periodically on each node. A mission is a
// desired object of kind "mission" (hub/desired carries it down the tree);
// its per-node state is kept at the node's hub and reported up in the
// site status heartbeat, aggregated at every level.
//
// Once per generation per node: before a node's run starts, its record
// moves from pending to running in one conditional update of the store
// (StartMissionNode); a run that cannot make that move does not start.
// A hub that stops (even killed -9) while a node's run is live finds that
// record running at start and marks it failed as interrupted: the script
// may have run in part, so it is never run again for that generation (the
// job engine's rule for interrupted runs: they are not re-run by
// themselves). The state check then tells whether the node is as it should
// be, and a changed spec (the next generation) runs it again. Nodes whose
// run had not started are still pending and run after the restart.
//
// AtHub makes a hub's Manager and Start runs it (hub.go); API serves
// /v1/missions (api.go).
package mission

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tether-dev/tether/internal/validate"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// Kind is the desired object kind of missions.
const Kind = "mission"

// Bounds of a mission spec (the whole spec stays under
// siteproto.MaxDesiredSpec).
const (
	MaxScript             = 128 << 10
	MaxStateCheck         = 16 << 10
	DefaultCheckInterval  = 60 * time.Second
	MinCheckInterval      = 5 * time.Second
	MaxCheckInterval      = 24 * time.Hour
	DefaultTimeout        = 10 * time.Minute
	MaxTimeout            = 24 * time.Hour
	MaxPlacementSites     = 256
	MaxPlacementLabels    = 32
	checkTimeoutCap       = time.Minute
	maxCheckOutput        = 512
	maxReportedNodes      = 200
	maxReportBytes        = 512 << 10
	defaultReconcileEvery = 5 * time.Second
	retryUnreachable      = 15 * time.Second
)

// ErrInvalid wraps every error about a malformed mission spec.
var ErrInvalid = errors.New("mission: invalid spec")

// Spec is a mission as its origin created it: content, placement and the
// state check (DesiredObject.Spec of kind "mission").
type Spec struct {
	// Script is run once per generation on every matching node (as a
	// script file, like `tether run --script`).
	Script     string `json:"script"`
	ScriptName string `json:"script_name,omitempty"`
	// StateCheck, when set, runs on every node that ran the mission every
	// CheckIntervalSeconds; exit 0 means the node is as it should be.
	StateCheck           string `json:"state_check,omitempty"`
	CheckIntervalSeconds int    `json:"check_interval_seconds,omitempty"`
	// TimeoutSeconds bounds one node's run (default 10 minutes).
	TimeoutSeconds int       `json:"timeout_seconds,omitempty"`
	Placement      Placement `json:"placement"`
}

// Placement is where a mission runs.
type Placement struct {
	// Sites are site paths relative to the origin ("berlin",
	// "sub.berlin"); each takes the mission with its whole subtree. Empty:
	// every site below the origin and the origin's own nodes.
	Sites []string `json:"sites,omitempty"`
	// MatchLabels select nodes by their labels at their own hub; below
	// the origin a node also carries site=PATH (its site's path relative
	// to the origin), as `-l site=…` selects it there. Empty: every node.
	MatchLabels map[string]string `json:"match_labels,omitempty"`
}

// CheckInterval is the state check's period.
func (s Spec) CheckInterval() time.Duration {
	if s.CheckIntervalSeconds <= 0 {
		return DefaultCheckInterval
	}
	return time.Duration(s.CheckIntervalSeconds) * time.Second
}

// Timeout bounds one node's run.
func (s Spec) Timeout() time.Duration {
	if s.TimeoutSeconds <= 0 {
		return DefaultTimeout
	}
	return time.Duration(s.TimeoutSeconds) * time.Second
}

// Validate checks a spec's shape and bounds.
func (s Spec) Validate() error {
	switch {
	case strings.TrimSpace(s.Script) == "":
		return fmt.Errorf("%w: the script is empty", ErrInvalid)
	case len(s.Script) > MaxScript:
		return fmt.Errorf("%w: the script is %d bytes; the limit is %d (ship large payloads in a job upload or an artifact "+
			"the script fetches)", ErrInvalid, len(s.Script), MaxScript)
	case len(s.StateCheck) > MaxStateCheck:
		return fmt.Errorf("%w: the state check is %d bytes; the limit is %d", ErrInvalid, len(s.StateCheck), MaxStateCheck)
	case strings.ContainsRune(s.Script, 0) || strings.ContainsRune(s.StateCheck, 0):
		return fmt.Errorf("%w: the script or state check contains a NUL byte", ErrInvalid)
	case len(s.ScriptName) > 256:
		return fmt.Errorf("%w: script name longer than 256 bytes", ErrInvalid)
	}
	if s.CheckIntervalSeconds != 0 {
		if d := s.CheckInterval(); d < MinCheckInterval || d > MaxCheckInterval {
			return fmt.Errorf("%w: state check interval %s: want %s..%s", ErrInvalid, d, MinCheckInterval, MaxCheckInterval)
		}
	}
	if s.TimeoutSeconds < 0 || s.Timeout() > MaxTimeout {
		return fmt.Errorf("%w: timeout %ds: want 1s..%s", ErrInvalid, s.TimeoutSeconds, MaxTimeout)
	}
	return s.Placement.Validate()
}

// Validate checks a placement.
func (p Placement) Validate() error {
	if len(p.Sites) > MaxPlacementSites {
		return fmt.Errorf("%w: %d sites; the limit is %d", ErrInvalid, len(p.Sites), MaxPlacementSites)
	}
	for _, s := range p.Sites {
		if err := siteproto.ValidPath(s); err != nil {
			return fmt.Errorf("%w: placement: %v", ErrInvalid, err)
		}
	}
	if len(p.MatchLabels) > MaxPlacementLabels {
		return fmt.Errorf("%w: %d match labels; the limit is %d", ErrInvalid, len(p.MatchLabels), MaxPlacementLabels)
	}
	for k, v := range p.MatchLabels {
		if err := validate.LabelKey(k); err != nil {
			return fmt.Errorf("%w: match label: %v", ErrInvalid, err)
		}
		if err := validate.LabelValue(v); err != nil {
			return fmt.Errorf("%w: match label %s: %v", ErrInvalid, k, err)
		}
	}
	return nil
}

// ParseSpec decodes and validates a mission's desired object spec.
func ParseSpec(raw json.RawMessage) (Spec, error) {
	var s Spec
	if err := json.Unmarshal(raw, &s); err != nil {
		return Spec{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	return s, s.Validate()
}

// ValidateSpec is the mission kind's spec validation (desired.Kind).
func ValidateSpec(raw json.RawMessage) error {
	_, err := ParseSpec(raw)
	return err
}

// PlacesHub reports whether a mission placed by p runs at a hub whose
// path relative to the mission's origin is rel ("" for the origin itself):
// an empty site list places it everywhere; a site entry places it at that
// site and every site below it.
func (p Placement) PlacesHub(rel string) bool {
	if len(p.Sites) == 0 {
		return true
	}
	if rel == "" {
		return false
	}
	for _, s := range p.Sites {
		if rel == s || strings.HasSuffix(rel, "."+s) {
			return true
		}
	}
	return false
}

// MatchesNode reports whether a node with these labels, at a hub whose
// path relative to the origin is rel, is selected: every match label
// equal, with site=rel standing in for the node's own site label below the
// origin.
func (p Placement) MatchesNode(rel string, labels map[string]string) bool {
	if len(p.MatchLabels) == 0 {
		return true
	}
	l := labels
	if rel != "" {
		l = maps.Clone(labels)
		if l == nil {
			l = map[string]string{}
		}
		l["site"] = rel
	}
	for k, v := range p.MatchLabels {
		if got, ok := l[k]; !ok || got != v {
			return false
		}
	}
	return true
}

// RelativePath is this hub's path relative to origin: "" when origin is
// this hub, else the first labels of path (this hub's path as the root
// names it) up to the ancestor origin (ancestors: hub IDs from the parent
// up). ok is false when origin is neither.
func RelativePath(self, origin, path string, ancestors []string) (rel string, ok bool) {
	if origin == self {
		return "", true
	}
	i := slices.Index(ancestors, origin)
	if i < 0 || path == "" {
		return "", false
	}
	labels := strings.Split(path, ".")
	if i+1 > len(labels) {
		return "", false
	}
	return strings.Join(labels[:i+1], "."), true
}
