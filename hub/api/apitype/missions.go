package apitype

import (
	"encoding/json"
	"time"
)

// The mission types mirror hub/mission's JSON (a test holds them to it):
// the CLI reads them without linking the mission service.

// MissionCreateRequest is the body of POST /v1/missions.
type MissionCreateRequest struct {
	Name                 string            `json:"name"`
	Script               string            `json:"script"`
	ScriptName           string            `json:"script_name,omitempty"`
	StateCheck           string            `json:"state_check,omitempty"`
	CheckIntervalSeconds int               `json:"check_interval_seconds,omitempty"`
	TimeoutSeconds       int               `json:"timeout_seconds,omitempty"`
	Sites                []string          `json:"sites,omitempty"`
	MatchLabels          map[string]string `json:"match_labels,omitempty"`
}

// Mission is a mission in a list (GET /v1/missions).
type Mission struct {
	Name   string `json:"name"`
	Origin string `json:"origin"`
	// Local: created at this hub (else received from a hub above).
	Local      bool             `json:"local"`
	Generation int64            `json:"generation"`
	Placement  MissionPlacement `json:"placement"`
	// Placed: the placement takes this hub's own nodes.
	Placed    bool          `json:"placed"`
	Total     MissionCounts `json:"total"`
	UpdatedAt time.Time     `json:"updated_at"`
}

// MissionDetail answers GET and POST /v1/missions[/{name}]: the spec and
// the state per site and per node, named relative to the hub asked.
type MissionDetail struct {
	Mission
	// Created: this request made a new generation (create only).
	Created bool             `json:"created,omitempty"`
	Deleted bool             `json:"deleted,omitempty"`
	Spec    MissionSpec      `json:"spec"`
	State   MissionState     `json:"state"`
	Sites   []MissionSiteRow `json:"sites"`
	Nodes   []MissionNodeRow `json:"nodes"`
}

// MissionSpec is what a mission runs and where.
type MissionSpec struct {
	Script               string           `json:"script"`
	ScriptName           string           `json:"script_name,omitempty"`
	StateCheck           string           `json:"state_check,omitempty"`
	CheckIntervalSeconds int              `json:"check_interval_seconds,omitempty"`
	TimeoutSeconds       int              `json:"timeout_seconds,omitempty"`
	Placement            MissionPlacement `json:"placement"`
}

// MissionPlacement is where a mission runs: site paths relative to the
// origin (empty: every site and the origin's own nodes) and the labels
// its nodes match (empty: every node).
type MissionPlacement struct {
	Sites       []string          `json:"sites,omitempty"`
	MatchLabels map[string]string `json:"match_labels,omitempty"`
}

// MissionCounts counts a mission's nodes by phase and check result.
type MissionCounts struct {
	Nodes       int `json:"nodes"`
	Pending     int `json:"pending"`
	Running     int `json:"running"`
	Applied     int `json:"applied"`
	Failed      int `json:"failed"`
	CheckOK     int `json:"check_ok"`
	CheckFailed int `json:"check_failed"`
}

// MissionNodeState is one node's state in a mission, named relative to the
// hub that reports it.
type MissionNodeState struct {
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

// MissionState is one mission at one hub: its own nodes and, nested, its
// sites'.
type MissionState struct {
	Origin             string             `json:"origin"`
	Name               string             `json:"name"`
	Generation         int64              `json:"generation"`
	ObservedGeneration int64              `json:"observed_generation"`
	Placed             bool               `json:"placed"`
	Own                MissionCounts      `json:"own"`
	Total              MissionCounts      `json:"total"`
	Nodes              []MissionNodeState `json:"nodes,omitempty"`
	NodesOmitted       int                `json:"nodes_omitted,omitempty"`
	Sites              []MissionSiteState `json:"sites,omitempty"`
}

// MissionSiteState is a sub-site's part of a mission, as its parent last
// heard.
type MissionSiteState struct {
	Name          string        `json:"name"`
	Connected     bool          `json:"connected"`
	Stale         bool          `json:"stale,omitempty"`
	StaleFor      time.Duration `json:"stale_for,omitempty"`
	LastHeartbeat time.Time     `json:"last_heartbeat,omitzero"`
	Mission       *MissionState `json:"mission,omitempty"`
}

// MissionSiteRow is one site's line in a mission's detail.
type MissionSiteRow struct {
	Path      string `json:"path"`
	Connected bool   `json:"connected"`
	// Stale: the site (or a site above it on the way here) is silent
	// beyond the stale timeout; its state is the last one heard.
	Stale              bool          `json:"stale"`
	StaleFor           time.Duration `json:"stale_for,omitempty"`
	LastHeartbeat      time.Time     `json:"last_heartbeat,omitzero"`
	Reported           bool          `json:"reported"`
	Generation         int64         `json:"generation,omitempty"`
	ObservedGeneration int64         `json:"observed_generation,omitempty"`
	Placed             bool          `json:"placed"`
	Own                MissionCounts `json:"own"`
}

// MissionNodeRow is one node's line, named relative to the hub asked
// ("n1.berlin"), with the site path it belongs to ("" for the hub's own).
type MissionNodeRow struct {
	Site string `json:"site"`
	MissionNodeState
}

// DesiredObject answers DELETE /v1/missions/{name}: the tombstone written,
// as the site protocol carries it down the tree.
type DesiredObject struct {
	Kind       string          `json:"kind"`
	Name       string          `json:"name"`
	Origin     string          `json:"origin"`
	Generation int64           `json:"generation"`
	Deleted    bool            `json:"deleted,omitempty"`
	Spec       json.RawMessage `json:"spec,omitempty"`
}
