package upgrade

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/store"
)

// API serves the upgrade endpoints (/v1/upgrades): the admin (or an API
// token) creates and steers rollouts; whoever may list nodes sees the
// upgrades of the nodes it may see, and confirms where the door lets it.
type API struct {
	// Rollouts is nil on a hub without upgrades: the endpoints answer 404.
	Rollouts Rollouts
	Store    APIStore
	Door     *access.Door
	// Targets finds the nodes an upgrade targets (the hub's own nodes and
	// those below its sites).
	Targets interface {
		Select(ctx context.Context, selector string, names []string) ([]store.Node, error)
	}
	Audit func(store.AuditEvent)

	rt route.Routes
}

// APIStore is what the upgrade endpoints read.
type APIStore interface {
	GetNode(ctx context.Context, id string) (store.Node, error)
	GetNodeByName(ctx context.Context, name string) (store.Node, error)
	GetUpgrade(ctx context.Context, name string) (store.Upgrade, error)
	ListUpgrades(ctx context.Context) ([]store.Upgrade, error)
	ListUpgradeNodes(ctx context.Context, name string) ([]store.UpgradeNode, error)
}

// Register implements route.Feature.
func (a *API) Register(rt route.Routes) {
	a.rt = rt
	rt.Handle("POST /v1/upgrades", rt.Automation(a.create))
	rt.Handle("GET /v1/upgrades", rt.Lister(a.list))
	rt.Handle("GET /v1/upgrades/{name}", rt.Lister(a.get))
	rt.Handle("POST /v1/upgrades/{name}/pause", rt.Automation(a.action("pause", Rollouts.Pause)))
	rt.Handle("POST /v1/upgrades/{name}/resume", rt.Automation(a.action("resume", Rollouts.Resume)))
	rt.Handle("POST /v1/upgrades/{name}/cancel", rt.Automation(a.action("cancel", Rollouts.Cancel)))
	rt.Handle("POST /v1/upgrades/{name}/confirm", rt.Lister(a.confirm))
}

func (a *API) audit(e store.AuditEvent) {
	if a.Audit != nil {
		a.Audit(e)
	}
}

func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return route.Decode(w, r, v, route.MaxBody)
}

// Rollouts is the rollout controller behind the endpoints (Controller).
type Rollouts interface {
	Create(ctx context.Context, req CreateRequest) (store.Upgrade, error)
	Pause(ctx context.Context, name, by string) (store.Upgrade, error)
	Resume(ctx context.Context, name, by string) (store.Upgrade, error)
	Cancel(ctx context.Context, name, by string) (store.Upgrade, error)
	Confirm(ctx context.Context, name string, node store.Node, by string) (store.UpgradeNode, error)
}

// View is u as the API shows it, counting nodes by step.
func View(u store.Upgrade, nodes []store.UpgradeNode) apitype.Upgrade {
	out := apitype.Upgrade{Name: u.Name, Kind: apitype.UpgradeKind(u.Kind), Reference: u.Reference, Digest: u.Digest,
		Version: u.Version, Spec: apitype.UpgradeSpec(u.Spec), State: u.State, Reason: u.Reason, CreatedBy: u.CreatedBy,
		CreatedAt: u.CreatedAt, UpdatedAt: u.UpdatedAt, Counts: map[apitype.UpgradeStep]int{}, Total: len(nodes)}
	for _, n := range nodes {
		out.Counts[apitype.UpgradeStep(n.Step)]++
	}
	return out
}

func detailView(u store.Upgrade, nodes []store.UpgradeNode) apitype.UpgradeDetail {
	out := apitype.UpgradeDetail{Upgrade: View(u, nodes), Nodes: make([]apitype.UpgradeNode, len(nodes))}
	for i, n := range nodes {
		out.Nodes[i] = NodeView(n)
	}
	return out
}

// NodeView is n as the API shows it.
func NodeView(n store.UpgradeNode) apitype.UpgradeNode {
	out := apitype.UpgradeNode{Upgrade: n.Upgrade, NodeID: n.NodeID, Node: n.Node, Batch: n.Batch,
		Step: apitype.UpgradeStep(n.Step), Reason: n.Reason, FromVersion: n.FromVersion, ConfirmedBy: n.ConfirmedBy,
		JobID: n.JobID, StartedAt: n.StartedAt, UpdatedAt: n.UpdatedAt}
	if n.History != nil {
		out.History = make([]apitype.UpgradeTransition, len(n.History))
		for i, t := range n.History {
			out.History[i] = apitype.UpgradeTransition{Step: apitype.UpgradeStep(t.Step), At: t.At, Reason: t.Reason}
		}
	}
	return out
}

func (a *API) enabled(w http.ResponseWriter, r *http.Request) bool {
	if a.Rollouts == nil {
		a.rt.Error(w, r, route.Fail(apitype.ErrNotFound, "upgrades are not enabled on this hub"))
		return false
	}
	return true
}

// apiErr gives the controller's errors their HTTP kind.
func apiErr(err error) error {
	switch {
	case errors.Is(err, ErrInvalid):
		return route.Fail(apitype.ErrInvalid, "%s", strings.TrimPrefix(err.Error(), ErrInvalid.Error()+": "))
	case errors.Is(err, ErrConflict):
		return route.Fail(apitype.ErrConflict, "%s", strings.TrimPrefix(err.Error(), ErrConflict.Error()+": "))
	case errors.Is(err, store.ErrNotFound):
		return route.Fail(apitype.ErrNotFound, "%s", strings.TrimPrefix(err.Error(), "store: "))
	}
	return err
}

// authorize asks the door about every target: an upgrade replaces
// software as root, so the door's rule is stricter than jobs'. Refusals
// are audited.
func (a *API) authorize(r *http.Request, c route.Caller, targets []store.Node) error {
	var denied []string
	for _, n := range targets {
		if a.Door == nil || a.Door.AuthorizeUpgrade(c.Caller, n) != nil {
			denied = append(denied, n.Name)
		}
	}
	if len(denied) == 0 {
		return nil
	}
	if len(denied) > 5 {
		denied = append(denied[:5], fmt.Sprintf("and %d more", len(denied)-5))
	}
	a.audit(
		store.AuditEvent{
			Kind:     "upgrade_create",
			Operator: c.Name,
			Remote:   r.RemoteAddr,
			Result:   "refused",
			Detail:   "nodes " + strings.Join(denied, ", "),
		},
	)
	return route.Fail(
		apitype.ErrRefused,
		"%s may not upgrade %s: rolling out upgrades is for the hub admin",
		c.Name,
		strings.Join(denied, ", "),
	)
}

func (a *API) create(w http.ResponseWriter, r *http.Request, c route.Caller) {
	if !a.enabled(w, r) {
		return
	}
	var req apitype.UpgradeCreateRequest
	if !decode(w, r, &req) {
		return
	}
	if !c.Admin {
		a.rt.Error(w, r, a.authorize(r, c, []store.Node{{Name: "any node"}}))
		return
	}
	if req.Artifact == "" {
		a.rt.Error(
			w,
			r,
			route.Fail(apitype.ErrInvalid, "artifact: give the oci:// reference of the agent or bundle to roll out"),
		)
		return
	}
	targets, err := a.Targets.Select(r.Context(), req.Selector, req.Nodes)
	if err != nil {
		a.rt.Error(w, r, err)
		return
	}
	if err := a.authorize(r, c, targets); err != nil {
		a.rt.Error(w, r, err)
		return
	}
	spec := store.UpgradeSpec{
		Selector:             req.Selector,
		Nodes:                req.Nodes,
		Batch:                req.Batch,
		Canary:               req.Canary,
		MaxUnavailable:       req.MaxUnavailable,
		FailureTolerance:     req.FailureTolerance,
		RequireConfirmation:  req.RequireConfirmation,
		AllowDowngrade:       req.AllowDowngrade,
		Deadline:             req.Deadline,
		HealthTimeoutSeconds: req.HealthTimeoutSeconds,
		TimeoutSeconds:       req.TimeoutSeconds,
		Role:                 c.JobFilterRole(),
	}
	u, err := a.Rollouts.Create(
		r.Context(),
		CreateRequest{Name: req.Name, Reference: req.Artifact, Spec: spec, Targets: targets, By: c.Name},
	)
	if err != nil {
		a.audit(
			store.AuditEvent{
				Kind:     "upgrade_create",
				Operator: c.Name,
				Remote:   r.RemoteAddr,
				Result:   "failed",
				Detail:   fmt.Sprintf("upgrade %.64q of %.200q: %s", req.Name, req.Artifact, err),
			},
		)
		a.rt.Error(w, r, apiErr(err))
		return
	}
	nodes, err := a.Store.ListUpgradeNodes(r.Context(), u.Name)
	if err != nil {
		a.rt.Error(w, r, route.Internal("read the upgrade's nodes", err))
		return
	}
	route.JSON(w, http.StatusCreated, detailView(u, nodes))
}

// view is u as caller c may see it, visible being the nodes of all
// (the upgrade's) that c may see. The admin sees u as created; anyone else
// learns no name of a node outside its roles: spec.nodes keeps the names it
// sees, the reason names other nodes as "another node", and the selector
// (which may name labels of nodes it does not see) is left out.
func view(c route.Caller, u store.Upgrade, all, visible []store.UpgradeNode) store.Upgrade {
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

// visible are the upgrade's nodes the caller may see.
func (a *API) visible(ctx context.Context, c route.Caller, nodes []store.UpgradeNode) []store.UpgradeNode {
	if c.Admin {
		return nodes
	}
	out := []store.UpgradeNode{}
	for _, un := range nodes {
		if n, err := a.Store.GetNode(ctx, un.NodeID); err == nil && c.Sees(n) {
			out = append(out, un)
		}
	}
	return out
}

// list answers GET /v1/upgrades: every caller sees the upgrades
// of the nodes it may list, counting those nodes only.
func (a *API) list(w http.ResponseWriter, r *http.Request, c route.Caller) {
	if !a.enabled(w, r) {
		return
	}
	ups, err := a.Store.ListUpgrades(r.Context())
	if err != nil {
		a.rt.Error(w, r, route.Internal("list upgrades", err))
		return
	}
	out := []apitype.Upgrade{}
	for _, u := range ups {
		nodes, err := a.Store.ListUpgradeNodes(r.Context(), u.Name)
		if err != nil {
			a.rt.Error(w, r, route.Internal("list upgrades", err))
			return
		}
		if visible := a.visible(r.Context(), c, nodes); len(visible) > 0 || c.Admin {
			out = append(out, View(view(c, u, nodes, visible), visible))
		}
	}
	route.JSON(w, http.StatusOK, out)
}

// load loads an upgrade as the caller may see it (view) and
// the nodes of it the caller sees; one the caller sees no node of does not
// exist for it.
func (a *API) load(w http.ResponseWriter, r *http.Request, c route.Caller) (store.Upgrade, []store.UpgradeNode, bool) {
	name := r.PathValue("name")
	u, err := a.Store.GetUpgrade(r.Context(), name)
	var all, nodes []store.UpgradeNode
	if err == nil {
		all, err = a.Store.ListUpgradeNodes(r.Context(), name)
	}
	if err == nil {
		nodes = a.visible(r.Context(), c, all)
		if len(nodes) == 0 && !c.Admin {
			err = store.ErrNotFound
		}
		u = view(c, u, all, nodes)
	}
	if errors.Is(err, store.ErrNotFound) {
		a.rt.Error(w, r, route.Fail(apitype.ErrNotFound, "no upgrade %q (see `tether upgrade list`)", name))
		return u, nil, false
	}
	if err != nil {
		a.rt.Error(w, r, route.Internal("read upgrade", err))
		return u, nil, false
	}
	return u, nodes, true
}

func (a *API) get(w http.ResponseWriter, r *http.Request, c route.Caller) {
	if !a.enabled(w, r) {
		return
	}
	u, nodes, ok := a.load(w, r, c)
	if !ok {
		return
	}
	route.JSON(w, http.StatusOK, detailView(u, nodes))
}

// action serves pause, resume and cancel: the admin's.
func (a *API) action(
	verb string,
	act func(Rollouts, context.Context, string, string) (store.Upgrade, error),
) route.Handler {
	return func(w http.ResponseWriter, r *http.Request, c route.Caller) {
		if !a.enabled(w, r) {
			return
		}
		name := r.PathValue("name")
		if !c.Admin {
			a.audit(
				store.AuditEvent{
					Kind:     "upgrade_" + verb,
					Operator: c.Name,
					Remote:   r.RemoteAddr,
					Result:   "refused",
					Detail:   "upgrade " + name,
				},
			)
			a.rt.Error(
				w,
				r,
				route.Fail(apitype.ErrRefused, "%s may not %s upgrades: that is for the hub admin", c.Name, verb),
			)
			return
		}
		u, err := act(a.Rollouts, r.Context(), name, c.Name)
		if err != nil {
			a.rt.Error(w, r, apiErr(err))
			return
		}
		nodes, err := a.Store.ListUpgradeNodes(r.Context(), name)
		if err != nil {
			a.rt.Error(w, r, route.Internal("read the upgrade's nodes", err))
			return
		}
		route.JSON(w, http.StatusOK, View(u, nodes))
	}
}

// confirm answers POST /v1/upgrades/{name}/confirm: a person with
// the confirm permission on the node says yes; refusals are audited.
func (a *API) confirm(w http.ResponseWriter, r *http.Request, c route.Caller) {
	if !a.enabled(w, r) {
		return
	}
	var req apitype.UpgradeConfirmRequest
	if !decode(w, r, &req) {
		return
	}
	name := r.PathValue("name")
	n, err := a.Store.GetNodeByName(r.Context(), req.Node)
	if errors.Is(err, store.ErrNotFound) {
		a.rt.Error(w, r, route.Fail(apitype.ErrNotFound, "no node %q (see `tether nodes`)", req.Node))
		return
	}
	if err != nil {
		a.rt.Error(w, r, route.Internal("read node", err))
		return
	}
	if a.Door == nil {
		a.rt.Error(w, r, route.Fail(apitype.ErrRefused, "confirmations are not served by this hub"))
		return
	}
	if err := a.Door.AuthorizeConfirm(c.Caller, n); err != nil {
		a.audit(
			store.AuditEvent{
				Kind:     "upgrade_confirm",
				Operator: c.Name,
				Node:     n.Name,
				Remote:   r.RemoteAddr,
				Result:   "refused",
				Detail:   "upgrade " + name + ": " + err.Error(),
			},
		)
		if !c.Sees(n) {
			// Who may not see the node learns nothing about it.
			a.rt.Error(w, r, route.Fail(apitype.ErrNotFound, "no node %q (see `tether nodes`)", req.Node))
			return
		}
		a.rt.Error(w, r, route.Fail(apitype.ErrRefused, "%s", err.Error()))
		return
	}
	un, err := a.Rollouts.Confirm(r.Context(), name, n, c.Name)
	if err != nil {
		a.rt.Error(w, r, apiErr(err))
		return
	}
	route.JSON(w, http.StatusOK, NodeView(un))
}
