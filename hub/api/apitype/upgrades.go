package apitype

import (
	"time"
)

// UpgradeCreateRequest is the body of POST /v1/upgrades. Targets are Nodes
// (names) or Selector (labels; "*" is every node), not both.
type UpgradeCreateRequest struct {
	Name string `json:"name"`
	// Artifact is oci://HOST[:PORT]/REPO(:TAG|@sha256:…); a tag is
	// resolved to its digest now, once.
	Artifact string   `json:"artifact"`
	Selector string   `json:"selector,omitempty"`
	Nodes    []string `json:"nodes,omitempty"`
	// Batch: "N" nodes or "P%" of the targets per batch ("" = all).
	Batch string `json:"batch,omitempty"`
	// Canary: size of a first batch the others wait for (0 = none).
	Canary int `json:"canary,omitempty"`
	// MaxUnavailable bounds the nodes being upgraded at once (0 = the batch size).
	MaxUnavailable int `json:"max_unavailable,omitempty"`
	// FailureTolerance: "N" or "P%" of the targets that may fail before the
	// rollout halts ("" = none).
	FailureTolerance    string `json:"failure_tolerance,omitempty"`
	RequireConfirmation bool   `json:"require_confirmation,omitempty"`
	AllowDowngrade      bool   `json:"allow_downgrade,omitempty"`
	// Deadline: offline nodes wait until then, and fail after (zero: forever).
	Deadline             time.Time `json:"deadline,omitzero"`
	HealthTimeoutSeconds int       `json:"health_timeout_seconds,omitempty"` // default 60
	TimeoutSeconds       int       `json:"timeout_seconds,omitempty"`        // one node's drive; default 1800
}

// UpgradeConfirmRequest is the body of POST /v1/upgrades/{name}/confirm.
type UpgradeConfirmRequest struct {
	Node string `json:"node"`
}

// Upgrade is an upgrade as the API shows it.
type Upgrade struct {
	Name      string      `json:"name"`
	Kind      UpgradeKind `json:"kind"`
	Reference string      `json:"reference"`
	// Digest is what was pinned at creation; nodes get nothing else.
	Digest    string      `json:"digest"`
	Version   string      `json:"version"`
	Spec      UpgradeSpec `json:"spec"`
	State     string      `json:"state"` // running, paused, halted, cancelled, done
	Reason    string      `json:"reason,omitempty"`
	CreatedBy string      `json:"created_by"`
	CreatedAt time.Time   `json:"created_at"`
	UpdatedAt time.Time   `json:"updated_at"`
	// Counts are the nodes by step; Total is their sum.
	Counts map[UpgradeStep]int `json:"counts"`
	Total  int                 `json:"total"`
}

// UpgradeSpec is how an upgrade rolls out, as it was given.
type UpgradeSpec struct {
	Selector string   `json:"selector,omitempty"` // as given, for display
	Nodes    []string `json:"nodes,omitempty"`    // as given, for display
	// Batch is "N" nodes or "P%" of the targets per batch ("" = all at once).
	Batch string `json:"batch,omitempty"`
	// Canary is the size of a first batch before the others (0 = none).
	Canary int `json:"canary,omitempty"`
	// MaxUnavailable bounds the nodes being upgraded at once (0 = the batch).
	MaxUnavailable int `json:"max_unavailable,omitempty"`
	// FailureTolerance is "N" or "P%" of the targets that may fail before
	// the rollout halts ("" = none may).
	FailureTolerance     string    `json:"failure_tolerance,omitempty"`
	RequireConfirmation  bool      `json:"require_confirmation,omitempty"`
	AllowDowngrade       bool      `json:"allow_downgrade,omitempty"`
	Deadline             time.Time `json:"deadline,omitzero"` // offline nodes wait until then (zero: forever)
	HealthTimeoutSeconds int       `json:"health_timeout_seconds"`
	// TimeoutSeconds bounds one node's offer, upload and apply.
	TimeoutSeconds int    `json:"timeout_seconds"`
	Role           string `json:"role,omitempty"` // role of an API-token creator
}

// UpgradeNode is one target node's place in an upgrade: its step, each
// step's time and reason, who confirmed.
type UpgradeNode struct {
	Upgrade     string              `json:"upgrade"`
	NodeID      string              `json:"node_id"`
	Node        string              `json:"node"` // the node's name when the upgrade was created
	Batch       int                 `json:"batch"`
	Step        UpgradeStep         `json:"step"`
	Reason      string              `json:"reason,omitempty"`
	FromVersion string              `json:"from_version,omitempty"`
	ConfirmedBy string              `json:"confirmed_by,omitempty"`
	History     []UpgradeTransition `json:"history"`
	JobID       string              `json:"job_id,omitempty"` // the last job that drove the node
	StartedAt   time.Time           `json:"started_at,omitzero"`
	UpdatedAt   time.Time           `json:"updated_at"`
}

// UpgradeDetail answers GET /v1/upgrades/{name}.
type UpgradeDetail struct {
	Upgrade
	Nodes []UpgradeNode `json:"nodes"`
}

// Upgrade states (the rollout's).
const (
	UpgradeRunning   = "running"
	UpgradePaused    = "paused"
	UpgradeHalted    = "halted"
	UpgradeCancelled = "cancelled"
	UpgradeDone      = "done"
)

// UpgradeKind is what an upgrade replaces.
type UpgradeKind string

// The kinds of upgrade.
const (
	UpgradeAgent  UpgradeKind = "agent"  // the tether-edge agent itself
	UpgradeBundle UpgradeKind = "bundle" // software installed by a script
)

// UpgradeStep is a node's place in the per-node upgrade state machine.
type UpgradeStep string

// The steps, in order. Failed and RolledBack carry a reason. Skipped and
// Cancelled are the hub's own: a node already at the target, a node the
// rollout never reached before it was cancelled.
const (
	StepPending              UpgradeStep = "pending"
	StepAwaitingConfirmation UpgradeStep = "awaiting_confirmation"
	StepDownloading          UpgradeStep = "downloading"
	StepVerifying            UpgradeStep = "verifying"
	StepInstalling           UpgradeStep = "installing"
	StepHealthCheck          UpgradeStep = "health_check"
	StepSucceeded            UpgradeStep = "succeeded"
	StepFailed               UpgradeStep = "failed"
	StepRolledBack           UpgradeStep = "rolled_back"
	StepSkipped              UpgradeStep = "skipped"
	StepCancelled            UpgradeStep = "cancelled"
)

// Terminal reports whether s ends the node's upgrade.
func (s UpgradeStep) Terminal() bool {
	switch s {
	case StepSucceeded, StepFailed, StepRolledBack, StepSkipped, StepCancelled:
		return true
	}
	return false
}

// UpgradeTransition is one step of a node's upgrade, with its time.
type UpgradeTransition struct {
	Step   UpgradeStep `json:"step"`
	At     time.Time   `json:"at"`
	Reason string      `json:"reason,omitempty"`
}
