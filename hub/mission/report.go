package mission

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// Check results of a node's state check.
const (
	CheckOK     = "ok"
	CheckFailed = "failed"
)

// Report is the missions document of a site's status heartbeat
// (SiteStatus.Missions): the state of every mission the site holds, its
// own nodes and its totals over its whole subtree. The sub-sites' detail
// is in their statuses, nested in the same heartbeat (SiteStatus.Sites).
type Report struct {
	Missions []State `json:"missions"`
}

// Counts are nodes by phase and state check result.
type Counts struct {
	Nodes       int `json:"nodes"`
	Pending     int `json:"pending"`
	Running     int `json:"running"`
	Applied     int `json:"applied"`
	Failed      int `json:"failed"`
	CheckOK     int `json:"check_ok"`
	CheckFailed int `json:"check_failed"`
}

func (c *Counts) add(o Counts) {
	c.Nodes += o.Nodes
	c.Pending += o.Pending
	c.Running += o.Running
	c.Applied += o.Applied
	c.Failed += o.Failed
	c.CheckOK += o.CheckOK
	c.CheckFailed += o.CheckFailed
}

// NodeState is one node's state in a mission, named relative to the hub
// that reports it.
type NodeState struct {
	Node       string    `json:"node"`
	Generation int64     `json:"generation"`
	Phase      string    `json:"phase"`
	Error      string    `json:"error,omitempty"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
	// Check is the state check's last result ("ok", "failed", "" before
	// the first); CheckedAt is when it ran.
	Check       string    `json:"check,omitempty"`
	CheckOutput string    `json:"check_output,omitempty"`
	CheckedAt   time.Time `json:"checked_at,omitzero"`
}

// State is one mission at one hub: its own nodes and, nested, its sites'.
type State struct {
	Origin string `json:"origin"`
	Name   string `json:"name"`
	// Generation is the generation this hub holds.
	Generation int64 `json:"generation"`
	// ObservedGeneration is the generation this hub has placed on its
	// nodes (0 until it did).
	ObservedGeneration int64 `json:"observed_generation"`
	// Placed: the placement takes this hub's own nodes.
	Placed bool `json:"placed"`
	// Own counts this hub's nodes; Total adds every site below.
	Own   Counts `json:"own"`
	Total Counts `json:"total"`
	// Nodes are this hub's own nodes (at most 200; NodesOmitted says how
	// many more).
	Nodes        []NodeState `json:"nodes,omitempty"`
	NodesOmitted int         `json:"nodes_omitted,omitempty"`
	Sites        []SiteState `json:"sites,omitempty"`
}

// SiteState is a sub-site's part of a mission, as its parent last heard.
type SiteState struct {
	Name      string `json:"name"`
	Connected bool   `json:"connected"`
	Stale     bool   `json:"stale,omitempty"`
	// StaleFor is how long the site has been silent, when stale.
	StaleFor      time.Duration `json:"stale_for,omitempty"`
	LastHeartbeat time.Time     `json:"last_heartbeat,omitzero"`
	// Mission is the site's state of the mission; nil when the site has
	// not reported it (yet).
	Mission *State `json:"mission,omitempty"`
}

// Held is one mission this hub holds, with its spec.
type Held struct {
	store.DesiredRecord
	Spec Spec
}

// Missions lists the missions this hub holds (not deleted), by origin and
// name.
func (m *Manager) Missions(ctx context.Context) ([]Held, error) {
	objs, err := m.cfg.Store.ListDesired(ctx, Kind)
	if err != nil {
		return nil, err
	}
	var out []Held
	for _, o := range objs {
		if o.Deleted {
			continue
		}
		spec, _ := ParseSpec(o.Spec)
		out = append(out, Held{DesiredRecord: o, Spec: spec})
	}
	return out, nil
}

// States builds the state of every mission this hub holds (or of the
// one named origin/name when both are set), over its own nodes and the
// last reports of its sites.
func (m *Manager) States(ctx context.Context, origin, name string) ([]State, error) {
	held, err := m.Missions(ctx)
	if err != nil {
		return nil, err
	}
	recs, err := m.cfg.Store.ListMissionNodes(ctx, origin, name)
	if err != nil {
		return nil, err
	}
	byMission := map[missionKey][]store.MissionNode{}
	for _, r := range recs {
		k := missionKey{r.Origin, r.Mission}
		byMission[k] = append(byMission[k], r)
	}
	sites := m.cfg.Sites()
	m.mu.Lock()
	observed := make(map[missionKey]int64, len(m.observed))
	for k, v := range m.observed {
		observed[k] = v
	}
	m.mu.Unlock()

	var out []State
	for _, h := range held {
		k := missionKey{h.Origin, h.Name}
		if origin != "" && (k.origin != origin || k.name != name) {
			continue
		}
		st := State{Origin: h.Origin, Name: h.Name, Generation: h.Generation, ObservedGeneration: observed[k]}
		if rel, ok := m.cfg.Where(h.Origin); ok && h.Spec.Script != "" {
			st.Placed = h.Spec.Placement.PlacesHub(rel)
		}
		for _, r := range byMission[k] {
			st.Own.count(r, h.Generation)
			if len(st.Nodes) < maxReportedNodes {
				st.Nodes = append(st.Nodes, NodeState{Node: r.Node, Generation: r.Generation, Phase: r.Phase, Error: r.Error,
					FinishedAt: r.FinishedAt, Check: r.CheckState, CheckOutput: r.CheckOutput, CheckedAt: r.CheckedAt})
			} else {
				st.NodesOmitted++
			}
		}
		st.Total = st.Own
		for _, s := range sites {
			ss := SiteState{
				Name:          s.Name,
				Connected:     s.Connected,
				Stale:         s.Stale,
				StaleFor:      s.StaleFor,
				LastHeartbeat: s.LastHeartbeat,
			}
			if ss.Mission = stateFrom(s.Status, k, 0); ss.Mission != nil {
				st.Total.add(ss.Mission.Total)
			}
			st.Sites = append(st.Sites, ss)
		}
		out = append(out, st)
	}
	return out, nil
}

// count adds one node record: phases count at the current generation (an
// older record is about to be planned again: pending).
func (c *Counts) count(r store.MissionNode, gen int64) {
	c.Nodes++
	phase := r.Phase
	if r.Generation < gen {
		phase = store.MissionPending
	}
	switch phase {
	case store.MissionPending:
		c.Pending++
	case store.MissionRunning:
		c.Running++
	case store.MissionApplied:
		c.Applied++
	case store.MissionFailed:
		c.Failed++
	}
	switch r.CheckState {
	case CheckOK:
		c.CheckOK++
	case CheckFailed:
		c.CheckFailed++
	}
}

// stateFrom is mission k as a site's status reports it, with the sites
// below it from the statuses nested in it (each hub reports only its own
// nodes and its totals: the subtree's detail travels once, in the nested
// statuses). nil when the site has not reported the mission.
func stateFrom(st *siteproto.Status, k missionKey, depth int) *State {
	if st == nil || depth > siteproto.MaxDepth {
		return nil
	}
	s := parseReport(st.Missions)[k]
	if s == nil {
		return nil
	}
	s.Sites = nil
	for _, sub := range st.Sites {
		ss := SiteState{Name: sub.Name, Connected: sub.Connected, LastHeartbeat: sub.LastHeartbeat}
		if sub.Status != nil && sub.Status.Health == siteproto.Stale {
			ss.Stale = true
			if !sub.LastHeartbeat.IsZero() && st.At.After(sub.LastHeartbeat) {
				ss.StaleFor = st.At.Sub(sub.LastHeartbeat).Round(time.Second)
			}
		}
		ss.Mission = stateFrom(sub.Status, k, depth+1)
		s.Sites = append(s.Sites, ss)
	}
	return s
}

func parseReport(raw json.RawMessage) map[missionKey]*State {
	out := map[missionKey]*State{}
	if len(raw) == 0 {
		return out
	}
	var r Report
	if json.Unmarshal(raw, &r) != nil {
		return out
	}
	for i := range r.Missions {
		s := &r.Missions[i]
		out[missionKey{s.Origin, s.Name}] = s
	}
	return out
}

// FillStatus is the site status hook: it sets the missions document and
// the received and active missions (Origin/Name; active: placed on this
// hub's own nodes).
func (m *Manager) FillStatus(ctx context.Context, st *siteproto.Status) {
	states, err := m.States(ctx, "", "")
	if err != nil {
		m.cfg.Logger.Warn("mission states for the site status", "err", err)
		return
	}
	st.ReceivedMissions, st.ActiveMissions = nil, nil
	for _, s := range states {
		id := s.Origin + "/" + s.Name
		if len(st.ReceivedMissions) < siteproto.MaxRoles*4 {
			st.ReceivedMissions = append(st.ReceivedMissions, id)
		}
		if s.Placed && len(st.ActiveMissions) < siteproto.MaxRoles*4 {
			st.ActiveMissions = append(st.ActiveMissions, id)
		}
	}
	// The sites' detail goes up in their own nested statuses: the report
	// carries this hub's nodes and the totals.
	for i := range states {
		states[i].Sites = nil
	}
	raw, err := json.Marshal(Report{Missions: states})
	if err == nil && len(raw) > maxReportBytes {
		// Too big for the heartbeat: counts only, no node lists.
		for i := range states {
			stripNodes(&states[i])
		}
		raw, err = json.Marshal(Report{Missions: states})
	}
	if err == nil && len(raw) <= maxReportBytes {
		st.Missions = raw
	}
}

func stripNodes(s *State) {
	s.NodesOmitted += len(s.Nodes)
	s.Nodes = nil
	for i := range s.Sites {
		if s.Sites[i].Mission != nil {
			stripNodes(s.Sites[i].Mission)
		}
	}
}

// SiteRow is one site's line in a mission's view from the hub asked:
// its path relative to that hub and its own nodes' counts.
type SiteRow struct {
	Path      string `json:"path"`
	Connected bool   `json:"connected"`
	// Stale: the site (or a site above it on the way here) is silent
	// beyond the stale timeout; its state is the last one heard.
	Stale         bool          `json:"stale"`
	StaleFor      time.Duration `json:"stale_for,omitempty"`
	LastHeartbeat time.Time     `json:"last_heartbeat,omitzero"`
	// Reported: the site has reported this mission.
	Reported           bool   `json:"reported"`
	Generation         int64  `json:"generation,omitempty"`
	ObservedGeneration int64  `json:"observed_generation,omitempty"`
	Placed             bool   `json:"placed"`
	Own                Counts `json:"own"`
}

// NodeRow is one node's line, named relative to the hub asked
// ("n1.berlin"), with the site path it belongs to ("" for the hub's own).
type NodeRow struct {
	Site string `json:"site"`
	NodeState
}

// Flatten lists a mission's sites and nodes under st, named relative to
// the hub st belongs to.
func Flatten(st State) (sites []SiteRow, nodes []NodeRow) {
	flatten(st, "", false, 0, &sites, &nodes)
	slices.SortStableFunc(sites, func(a, b SiteRow) int { return strings.Compare(a.Path, b.Path) })
	return sites, nodes
}

func flatten(st State, path string, staleAbove bool, staleFor time.Duration, sites *[]SiteRow, nodes *[]NodeRow) {
	for _, n := range st.Nodes {
		row := NodeRow{Site: path, NodeState: n}
		if path != "" {
			row.Node = n.Node + "." + path
		}
		*nodes = append(*nodes, row)
	}
	for _, s := range st.Sites {
		p := s.Name
		if path != "" {
			p += "." + path
		}
		row := SiteRow{
			Path:          p,
			Connected:     s.Connected && !staleAbove,
			Stale:         s.Stale || staleAbove,
			StaleFor:      s.StaleFor,
			LastHeartbeat: s.LastHeartbeat,
		}
		if staleAbove && staleFor > row.StaleFor {
			row.StaleFor = staleFor
		}
		if s.Mission != nil {
			row.Reported, row.Generation, row.ObservedGeneration, row.Placed, row.Own =
				true, s.Mission.Generation, s.Mission.ObservedGeneration, s.Mission.Placed, s.Mission.Own
		}
		*sites = append(*sites, row)
		if s.Mission != nil {
			flatten(*s.Mission, p, row.Stale, row.StaleFor, sites, nodes)
		}
	}
}
