package mission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// Desired is the desired-state sync missions are created through
// (hub/desired.Sync).
type Desired interface {
	Put(ctx context.Context, kind, name string, spec json.RawMessage) (siteproto.DesiredObject, bool, error)
	Delete(ctx context.Context, kind, name string) (siteproto.DesiredObject, error)
}

// ErrNotFound: no such mission at this hub.
var ErrNotFound = store.ErrNotFound

// CreateRequest is a mission as `tether mission create` gives it.
type CreateRequest struct {
	Name                 string            `json:"name"`
	Script               string            `json:"script"`
	ScriptName           string            `json:"script_name,omitempty"`
	StateCheck           string            `json:"state_check,omitempty"`
	CheckIntervalSeconds int               `json:"check_interval_seconds,omitempty"`
	TimeoutSeconds       int               `json:"timeout_seconds,omitempty"`
	Sites                []string          `json:"sites,omitempty"`
	MatchLabels          map[string]string `json:"match_labels,omitempty"`
}

// Summary is one mission in a list.
type Summary struct {
	Name   string `json:"name"`
	Origin string `json:"origin"`
	// Local: created at this hub (else received from a hub above).
	Local      bool      `json:"local"`
	Generation int64     `json:"generation"`
	Placement  Placement `json:"placement"`
	// Placed: the placement takes this hub's own nodes.
	Placed    bool      `json:"placed"`
	Total     Counts    `json:"total"`
	UpdatedAt time.Time `json:"updated_at"`
}

// Detail is one mission: its spec and its state per site and per node,
// named relative to this hub.
type Detail struct {
	Summary
	// Created: this request made a new generation (create only).
	Created bool      `json:"created,omitempty"`
	Deleted bool      `json:"deleted,omitempty"`
	Spec    Spec      `json:"spec"`
	State   State     `json:"state"`
	Sites   []SiteRow `json:"sites"`
	Nodes   []NodeRow `json:"nodes"`
}

// Create stores a mission created at this hub: a new generation when its
// spec differs from the stored one, else nothing changes.
func (m *Manager) Create(ctx context.Context, d Desired, req CreateRequest, by string) (Detail, error) {
	spec := Spec{
		Script:               req.Script,
		ScriptName:           req.ScriptName,
		StateCheck:           req.StateCheck,
		CheckIntervalSeconds: req.CheckIntervalSeconds,
		TimeoutSeconds:       req.TimeoutSeconds,
		Placement:            Placement{Sites: req.Sites, MatchLabels: req.MatchLabels},
	}
	if err := siteproto.ValidLabel("mission name", req.Name); err != nil {
		return Detail{}, fmt.Errorf("%w: %v", ErrInvalid, err)
	}
	if err := spec.Validate(); err != nil {
		return Detail{}, err
	}
	raw, err := json.Marshal(spec)
	if err != nil {
		return Detail{}, err
	}
	if len(raw) > siteproto.MaxDesiredSpec {
		return Detail{}, fmt.Errorf("%w: the mission is %d bytes encoded; the limit is %d", ErrInvalid, len(raw),
			siteproto.MaxDesiredSpec)
	}
	o, changed, err := d.Put(ctx, Kind, req.Name, raw)
	if err != nil {
		return Detail{}, err
	}
	if changed {
		m.audit(store.AuditEvent{Kind: "mission_create", Operator: by, Result: "ok",
			Detail: fmt.Sprintf("mission %s generation %d: %s, placement %s", req.Name, o.Generation, scriptLabel(spec),
				describePlacement(spec.Placement))})
	}
	det, err := m.Get(ctx, m.cfg.HubID, req.Name)
	det.Created = changed
	return det, err
}

func scriptLabel(s Spec) string {
	if s.ScriptName != "" {
		return "script " + s.ScriptName
	}
	return fmt.Sprintf("script of %d bytes", len(s.Script))
}

// Delete writes the tombstone of a mission created at this hub: every hub
// below drops it when the tombstone reaches it. Work already done on nodes
// is not undone.
func (m *Manager) Delete(ctx context.Context, d Desired, name, by string) (siteproto.DesiredObject, error) {
	o, err := d.Delete(ctx, Kind, name)
	if errors.Is(err, store.ErrNotFound) {
		return o, fmt.Errorf("mission %q: %w (only missions created at this hub can be deleted here)", name, ErrNotFound)
	}
	if err != nil {
		return o, err
	}
	m.audit(store.AuditEvent{
		Kind:     "mission_delete",
		Operator: by,
		Result:   "ok",
		Detail:   fmt.Sprintf("mission %s: tombstone at generation %d", name, o.Generation),
	})
	return o, nil
}

// List summarizes the missions this hub holds.
func (m *Manager) List(ctx context.Context) ([]Summary, error) {
	states, err := m.States(ctx, "", "")
	if err != nil {
		return nil, err
	}
	held, err := m.Missions(ctx)
	if err != nil {
		return nil, err
	}
	byKey := map[missionKey]State{}
	for _, s := range states {
		byKey[missionKey{s.Origin, s.Name}] = s
	}
	out := make([]Summary, 0, len(held))
	for _, h := range held {
		out = append(out, m.summary(h, byKey[missionKey{h.Origin, h.Name}]))
	}
	return out, nil
}

func (m *Manager) summary(h Held, st State) Summary {
	return Summary{Name: h.Name, Origin: h.Origin, Local: h.Origin == m.cfg.HubID, Generation: h.Generation,
		Placement: h.Spec.Placement, Placed: st.Placed, Total: st.Total, UpdatedAt: h.UpdatedAt}
}

// Get returns the mission origin/name; an empty origin takes the one
// created here, else the only one of that name.
func (m *Manager) Get(ctx context.Context, origin, name string) (Detail, error) {
	held, err := m.Missions(ctx)
	if err != nil {
		return Detail{}, err
	}
	var found []Held
	for _, h := range held {
		if h.Name == name && (origin == "" || h.Origin == origin) {
			found = append(found, h)
		}
	}
	if len(found) > 1 {
		for _, h := range found {
			if h.Origin == m.cfg.HubID {
				found = []Held{h}
				break
			}
		}
	}
	switch len(found) {
	case 0:
		return Detail{}, fmt.Errorf("mission %q: %w", name, ErrNotFound)
	case 1:
	default:
		return Detail{}, fmt.Errorf("%w: %d missions are named %q (from different hubs); give the origin", ErrInvalid,
			len(found), name)
	}
	h := found[0]
	states, err := m.States(ctx, h.Origin, h.Name)
	if err != nil {
		return Detail{}, err
	}
	var st State
	if len(states) == 1 {
		st = states[0]
	}
	sites, nodes := Flatten(st)
	if sites == nil {
		sites = []SiteRow{}
	}
	if nodes == nil {
		nodes = []NodeRow{}
	}
	return Detail{Summary: m.summary(h, st), Spec: h.Spec, State: st, Sites: sites, Nodes: nodes}, nil
}
