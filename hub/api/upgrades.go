package api

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/hub/upgrade"
	"github.com/tether-dev/tether/tunnel/control"
)

// Upgrades is the rollout controller behind the /v1/upgrades endpoints
// (hub/upgrade).
type Upgrades interface {
	Create(ctx context.Context, req upgrade.CreateRequest) (store.Upgrade, error)
	Pause(ctx context.Context, name, by string) (store.Upgrade, error)
	Resume(ctx context.Context, name, by string) (store.Upgrade, error)
	Cancel(ctx context.Context, name, by string) (store.Upgrade, error)
	Confirm(ctx context.Context, name string, node store.Node, by string) (store.UpgradeNode, error)
}

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
	Name      string              `json:"name"`
	Kind      control.UpgradeKind `json:"kind"`
	Reference string              `json:"reference"`
	// Digest is what was pinned at creation; nodes get nothing else.
	Digest    string            `json:"digest"`
	Version   string            `json:"version"`
	Spec      store.UpgradeSpec `json:"spec"`
	State     string            `json:"state"` // running, paused, halted, cancelled, done
	Reason    string            `json:"reason,omitempty"`
	CreatedBy string            `json:"created_by"`
	CreatedAt time.Time         `json:"created_at"`
	UpdatedAt time.Time         `json:"updated_at"`
	// Counts are the nodes by step; Total is their sum.
	Counts map[control.UpgradeStep]int `json:"counts"`
	Total  int                         `json:"total"`
}

// UpgradeNode is one target node's place in an upgrade: its step, each
// step's time and reason, who confirmed.
type UpgradeNode = store.UpgradeNode

// UpgradeDetail answers GET /v1/upgrades/{name}.
type UpgradeDetail struct {
	Upgrade
	Nodes []UpgradeNode `json:"nodes"`
}

// Upgrade states (the rollout's).
const (
	UpgradeRunning   = store.UpgradeRunning
	UpgradePaused    = store.UpgradePaused
	UpgradeHalted    = store.UpgradeHalted
	UpgradeCancelled = store.UpgradeCancelled
	UpgradeDone      = store.UpgradeDone
)

func upgradeFrom(u store.Upgrade, nodes []store.UpgradeNode) Upgrade {
	out := Upgrade{Name: u.Name, Kind: u.Kind, Reference: u.Reference, Digest: u.Digest, Version: u.Version, Spec: u.Spec, State: u.State,
		Reason: u.Reason, CreatedBy: u.CreatedBy, CreatedAt: u.CreatedAt, UpdatedAt: u.UpdatedAt, Counts: map[control.UpgradeStep]int{}, Total: len(nodes)}
	for _, n := range nodes {
		out.Counts[n.Step]++
	}
	return out
}

func (h *handler) upgradesEnabled(w http.ResponseWriter, r *http.Request) bool {
	if h.Upgrades == nil {
		h.writeErr(w, r, fail(ErrNotFound, "upgrades are not enabled on this hub"))
		return false
	}
	return true
}

// upgradeErr gives the controller's errors their HTTP kind.
func upgradeErr(err error) error {
	switch {
	case errors.Is(err, upgrade.ErrInvalid):
		return fail(ErrInvalid, "%s", strings.TrimPrefix(err.Error(), upgrade.ErrInvalid.Error()+": "))
	case errors.Is(err, upgrade.ErrConflict):
		return fail(ErrConflict, "%s", strings.TrimPrefix(err.Error(), upgrade.ErrConflict.Error()+": "))
	case errors.Is(err, store.ErrNotFound):
		return fail(ErrNotFound, "%s", strings.TrimPrefix(err.Error(), "store: "))
	}
	return err
}

// authorizeUpgrade asks the door about every target: an upgrade replaces
// software as root, so the door's rule is stricter than jobs'. Refusals
// are audited.
func (h *handler) authorizeUpgrade(r *http.Request, c caller, targets []store.Node) error {
	var denied []string
	for _, n := range targets {
		if h.Door == nil || h.Door.AuthorizeUpgrade(c.Caller, n) != nil {
			denied = append(denied, n.Name)
		}
	}
	if len(denied) == 0 {
		return nil
	}
	if len(denied) > 5 {
		denied = append(denied[:5], fmt.Sprintf("and %d more", len(denied)-5))
	}
	h.audit(store.AuditEvent{Kind: "upgrade_create", Operator: c.Name, Remote: r.RemoteAddr, Result: "refused", Detail: "nodes " + strings.Join(denied, ", ")})
	return fail(ErrRefused, "%s may not upgrade %s: rolling out upgrades is for the hub admin", c.Name, strings.Join(denied, ", "))
}

func (h *handler) createUpgrade(w http.ResponseWriter, r *http.Request, c caller) {
	if !h.upgradesEnabled(w, r) {
		return
	}
	var req UpgradeCreateRequest
	if !decode(w, r, &req) {
		return
	}
	if !c.Admin {
		h.writeErr(w, r, h.authorizeUpgrade(r, c, []store.Node{{Name: "any node"}}))
		return
	}
	if req.Artifact == "" {
		h.writeErr(w, r, fail(ErrInvalid, "artifact: give the oci:// reference of the agent or bundle to roll out"))
		return
	}
	targets, err := h.selectNodes(r.Context(), req.Selector, req.Nodes)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	if err := h.authorizeUpgrade(r, c, targets); err != nil {
		h.writeErr(w, r, err)
		return
	}
	spec := store.UpgradeSpec{Selector: req.Selector, Nodes: req.Nodes, Batch: req.Batch, Canary: req.Canary, MaxUnavailable: req.MaxUnavailable,
		FailureTolerance: req.FailureTolerance, RequireConfirmation: req.RequireConfirmation, AllowDowngrade: req.AllowDowngrade,
		Deadline: req.Deadline, HealthTimeoutSeconds: req.HealthTimeoutSeconds, TimeoutSeconds: req.TimeoutSeconds, Role: c.jobFilterRole()}
	u, err := h.Upgrades.Create(r.Context(), upgrade.CreateRequest{Name: req.Name, Reference: req.Artifact, Spec: spec, Targets: targets, By: c.Name})
	if err != nil {
		h.audit(store.AuditEvent{Kind: "upgrade_create", Operator: c.Name, Remote: r.RemoteAddr, Result: "failed", Detail: fmt.Sprintf("upgrade %.64q of %.200q: %s", req.Name, req.Artifact, err)})
		h.writeErr(w, r, upgradeErr(err))
		return
	}
	nodes, err := h.Store.ListUpgradeNodes(r.Context(), u.Name)
	if err != nil {
		h.writeErr(w, r, internal("read the upgrade's nodes", err))
		return
	}
	writeJSON(w, http.StatusCreated, UpgradeDetail{Upgrade: upgradeFrom(u, nodes), Nodes: nodes})
}

// upgradeView is u as caller c may see it, visible being the nodes of all
// (the upgrade's) that c may see. The admin sees u as created; anyone else
// learns no name of a node outside its roles: spec.nodes keeps the names it
// sees, the reason names other nodes as "another node", and the selector
// (which may name labels of nodes it does not see) is left out.
func upgradeView(c caller, u store.Upgrade, all, visible []store.UpgradeNode) store.Upgrade {
	if c.Admin {
		return u
	}
	seen := map[string]bool{}
	for _, n := range visible {
		seen[n.Node] = true
	}
	var hidden []string
	for _, n := range all {
		if !seen[n.Node] {
			hidden = append(hidden, n.Node)
		}
	}
	var names []string
	for _, n := range u.Spec.Nodes {
		if seen[n] {
			names = append(names, n)
		}
	}
	u.Spec.Nodes, u.Spec.Selector = names, ""
	u.Reason = withoutNames(u.Reason, hidden)
	return u
}

// withoutNames replaces every whole occurrence of one of names in text
// with "another node". A node name is a DNS label, so an occurrence is
// whole when no letter, digit or '-' touches it.
func withoutNames(text string, names []string) string {
	label := func(b byte) bool {
		return b == '-' || b >= 'a' && b <= 'z' || b >= 'A' && b <= 'Z' || b >= '0' && b <= '9'
	}
	for _, name := range names {
		if name == "" {
			continue
		}
		var out strings.Builder
		rest := text
		for {
			i := strings.Index(rest, name)
			if i < 0 {
				out.WriteString(rest)
				break
			}
			end := i + len(name)
			if (i > 0 && label(rest[i-1])) || (end < len(rest) && label(rest[end])) {
				out.WriteString(rest[:end])
			} else {
				out.WriteString(rest[:i] + "another node")
			}
			rest = rest[end:]
		}
		text = out.String()
	}
	return text
}

// visibleNodes are the upgrade's nodes the caller may see.
func (h *handler) visibleNodes(ctx context.Context, c caller, nodes []store.UpgradeNode) []store.UpgradeNode {
	if c.Admin {
		return nodes
	}
	out := []store.UpgradeNode{}
	for _, un := range nodes {
		if n, err := h.Store.GetNode(ctx, un.NodeID); err == nil && c.sees(n) {
			out = append(out, un)
		}
	}
	return out
}

// listUpgrades answers GET /v1/upgrades: every caller sees the upgrades
// of the nodes it may list, counting those nodes only.
func (h *handler) listUpgrades(w http.ResponseWriter, r *http.Request, c caller) {
	if !h.upgradesEnabled(w, r) {
		return
	}
	ups, err := h.Store.ListUpgrades(r.Context())
	if err != nil {
		h.writeErr(w, r, internal("list upgrades", err))
		return
	}
	out := []Upgrade{}
	for _, u := range ups {
		nodes, err := h.Store.ListUpgradeNodes(r.Context(), u.Name)
		if err != nil {
			h.writeErr(w, r, internal("list upgrades", err))
			return
		}
		if visible := h.visibleNodes(r.Context(), c, nodes); len(visible) > 0 || c.Admin {
			out = append(out, upgradeFrom(upgradeView(c, u, nodes, visible), visible))
		}
	}
	writeJSON(w, http.StatusOK, out)
}

// upgradeFor loads an upgrade as the caller may see it (upgradeView) and
// the nodes of it the caller sees; one the caller sees no node of does not
// exist for it.
func (h *handler) upgradeFor(w http.ResponseWriter, r *http.Request, c caller) (store.Upgrade, []store.UpgradeNode, bool) {
	name := r.PathValue("name")
	u, err := h.Store.GetUpgrade(r.Context(), name)
	var all, nodes []store.UpgradeNode
	if err == nil {
		all, err = h.Store.ListUpgradeNodes(r.Context(), name)
	}
	if err == nil {
		nodes = h.visibleNodes(r.Context(), c, all)
		if len(nodes) == 0 && !c.Admin {
			err = store.ErrNotFound
		}
		u = upgradeView(c, u, all, nodes)
	}
	if errors.Is(err, store.ErrNotFound) {
		h.writeErr(w, r, fail(ErrNotFound, "no upgrade %q (see `tether upgrade list`)", name))
		return u, nil, false
	}
	if err != nil {
		h.writeErr(w, r, internal("read upgrade", err))
		return u, nil, false
	}
	return u, nodes, true
}

func (h *handler) getUpgrade(w http.ResponseWriter, r *http.Request, c caller) {
	if !h.upgradesEnabled(w, r) {
		return
	}
	u, nodes, ok := h.upgradeFor(w, r, c)
	if !ok {
		return
	}
	writeJSON(w, http.StatusOK, UpgradeDetail{Upgrade: upgradeFrom(u, nodes), Nodes: nodes})
}

// upgradeAction serves pause, resume and cancel: the admin's.
func (h *handler) upgradeAction(verb string, act func(Upgrades, context.Context, string, string) (store.Upgrade, error)) func(http.ResponseWriter, *http.Request, caller) {
	return func(w http.ResponseWriter, r *http.Request, c caller) {
		if !h.upgradesEnabled(w, r) {
			return
		}
		name := r.PathValue("name")
		if !c.Admin {
			h.audit(store.AuditEvent{Kind: "upgrade_" + verb, Operator: c.Name, Remote: r.RemoteAddr, Result: "refused", Detail: "upgrade " + name})
			h.writeErr(w, r, fail(ErrRefused, "%s may not %s upgrades: that is for the hub admin", c.Name, verb))
			return
		}
		u, err := act(h.Upgrades, r.Context(), name, c.Name)
		if err != nil {
			h.writeErr(w, r, upgradeErr(err))
			return
		}
		nodes, err := h.Store.ListUpgradeNodes(r.Context(), name)
		if err != nil {
			h.writeErr(w, r, internal("read the upgrade's nodes", err))
			return
		}
		writeJSON(w, http.StatusOK, upgradeFrom(u, nodes))
	}
}

// confirmUpgrade answers POST /v1/upgrades/{name}/confirm: a person with
// the confirm permission on the node says yes; refusals are audited.
func (h *handler) confirmUpgrade(w http.ResponseWriter, r *http.Request, c caller) {
	if !h.upgradesEnabled(w, r) {
		return
	}
	var req UpgradeConfirmRequest
	if !decode(w, r, &req) {
		return
	}
	name := r.PathValue("name")
	n, err := h.Store.GetNodeByName(r.Context(), req.Node)
	if errors.Is(err, store.ErrNotFound) {
		h.writeErr(w, r, fail(ErrNotFound, "no node %q (see `tether nodes`)", req.Node))
		return
	}
	if err != nil {
		h.writeErr(w, r, internal("read node", err))
		return
	}
	if h.Door == nil {
		h.writeErr(w, r, fail(ErrRefused, "confirmations are not served by this hub"))
		return
	}
	if err := h.Door.AuthorizeConfirm(c.Caller, n); err != nil {
		h.audit(store.AuditEvent{Kind: "upgrade_confirm", Operator: c.Name, Node: n.Name, Remote: r.RemoteAddr, Result: "refused", Detail: "upgrade " + name + ": " + err.Error()})
		if !c.sees(n) {
			// Who may not see the node learns nothing about it.
			h.writeErr(w, r, fail(ErrNotFound, "no node %q (see `tether nodes`)", req.Node))
			return
		}
		h.writeErr(w, r, fail(ErrRefused, "%s", err.Error()))
		return
	}
	un, err := h.Upgrades.Confirm(r.Context(), name, n, c.Name)
	if err != nil {
		h.writeErr(w, r, upgradeErr(err))
		return
	}
	writeJSON(w, http.StatusOK, un)
}
