package api

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/api/route"
	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/validate"
)

// Operators decides which operator API client certificates the API accepts.
// `tether login` gives every operator one; it admits them to the node
// listing only (the nodes their roles select), never to an admin endpoint.
type Operators interface {
	// Authorize decides whether a TLS client certificate chain (leaf
	// first) is an operator's API identity that is valid now, and names
	// the operator. A chain that is no operator identity at all is
	// ErrNotOperatorIdentity (the admin check comes next); other refusals
	// say what to do.
	Authorize(chain []*x509.Certificate) (operator string, err error)
}

// ErrNotOperatorIdentity is wrapped by Operators.Authorize when the
// certificate is not an operator's API identity (it may be an admin's).
var ErrNotOperatorIdentity = route.ErrNotOperatorIdentity

// NodeSite is the site a node is shown under, from its hub-set labels: the
// site label, which the door sets on every node below a site hub to its
// site path (access.SiteNodeLabels) and which operators set on their own
// nodes (site=berlin). Roles and -l selectors match that same label, so the
// CLI's SITE column and the console show what site=… selects.
func NodeSite(labels map[string]string) string { return labels[access.SiteLabel] }

// lister wraps endpoints every authenticated caller may use, each seeing
// only the nodes the door lets it list (access.Door.AuthorizeList): the
// admin, an API token, or an operator's API identity from `tether login`.
func (h *handler) lister(next func(http.ResponseWriter, *http.Request, caller)) http.HandlerFunc {
	admitted := h.automation(next)
	return func(w http.ResponseWriter, r *http.Request) {
		if c, ok := consoleCaller(r); ok {
			next(w, r, caller{Caller: c, Door: h.Door})
			return
		}
		if r.Header.Get("Authorization") == "" && r.TLS != nil && len(r.TLS.PeerCertificates) > 0 && h.Operators != nil &&
			h.Door != nil {
			name, err := h.Operators.Authorize(r.TLS.PeerCertificates)
			switch {
			case err == nil:
				next(w, r, caller{Caller: access.Caller{Operator: name, Name: "operator:" + name}, Door: h.Door})
				return
			case !errors.Is(err, ErrNotOperatorIdentity):
				h.writeErr(w, r, fail(ErrRefused, "operator API certificate refused: %s", err.Error()))
				return
			}
		}
		admitted(w, r)
	}
}

// nodeSelector parses the selector of a node query: "" or "*" select all.
func nodeSelector(s string) (func(map[string]string) bool, error) {
	if s == "" || s == "*" {
		return func(map[string]string) bool { return true }, nil
	}
	sel, err := roles.ParseSelector(s)
	if err != nil {
		return nil, fail(ErrInvalid, "%s", clean(err)) // the error names the selector
	}
	return sel.Matches, nil
}

// listNodes answers GET /v1/nodes[?selector=S]: the nodes the caller may
// see, matching the selector (on hub-set labels), with liveness from the
// registry and cluster state from the store.
func (h *handler) listNodes(w http.ResponseWriter, r *http.Request, c caller) {
	match, err := nodeSelector(r.URL.Query().Get("selector"))
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	all, err := h.Store.ListNodes(r.Context())
	if err != nil {
		h.writeErr(w, r, internal("list nodes", err))
		return
	}
	all, below, err := h.withInventory(r.Context(), all)
	if err != nil {
		h.writeErr(w, r, internal("list the sites' nodes", err))
		return
	}
	nodes := all[:0]
	for _, n := range all {
		if match(n.Labels) && c.Sees(n) {
			nodes = append(nodes, n)
		}
	}
	members, err := h.Store.ListClusterMembers(r.Context())
	if err != nil {
		h.writeErr(w, r, internal("list cluster members", err))
		return
	}
	cluster := make(map[string]store.ClusterMember, len(members))
	for _, m := range members {
		cluster[m.NodeID] = m
	}
	var holders map[string]string // nodes on other hub replicas
	if h.Replicas != nil {
		if holders, err = h.Replicas.Holders(r.Context()); err != nil {
			h.writeErr(w, r, internal("list replicas' nodes", err))
			return
		}
	}
	for i := range nodes {
		if below[nodes[i].ID] {
			continue // a site's node: its site reported whether it is online
		}
		// The registry is the truth about liveness; the store may lag.
		rc, ok := h.Conns.Get(nodes[i].Name)
		nodes[i].Online = ok && rc.NodeID == nodes[i].ID || holders[nodes[i].ID] != ""
		if m, ok := cluster[nodes[i].ID]; ok {
			nodes[i].ClusterEngine, nodes[i].ClusterState = m.Engine, m.State
		}
	}
	writeJSON(w, http.StatusOK, convertAll(nodes, nodeFrom))
}

// labelNodes changes hub-set labels (admin only): durably for every target
// at once, audited per node, and effective for access at once (the door
// reloads, and each live node is pushed the keys and principals its new
// labels give it).
func (h *handler) labelNodes(w http.ResponseWriter, r *http.Request) {
	var req apitype.NodeLabelRequest
	if !decode(w, r, &req) {
		return
	}
	change, err := labelChange(req)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	targets, err := h.labelTargets(r.Context(), req)
	if err != nil {
		h.writeErr(w, r, err)
		return
	}
	before := make(map[string]map[string]string, len(targets))
	ids := make([]string, len(targets))
	for i, n := range targets {
		ids[i], before[n.ID] = n.ID, n.Labels
	}
	changed, err := h.Store.LabelNodes(r.Context(), ids, change, func(n store.Node) error {
		if err := validate.Labels(n.Labels); err != nil {
			return fail(ErrInvalid, "node %q: %s", n.Name, err.Error())
		}
		return nil
	})
	switch {
	case errors.Is(err, store.ErrNotFound):
		h.writeErr(w, r, fail(ErrConflict, "a target node was removed meanwhile; nothing was changed, try again"))
		return
	case errors.Is(err, ErrInvalid):
		h.writeErr(w, r, err)
		return
	case err != nil:
		h.writeErr(w, r, internal("change node labels", err))
		return
	}
	for _, n := range changed {
		// The live session's labels decide what access pushes send it.
		if c, ok := h.Conns.Get(n.Name); ok && c.NodeID == n.ID {
			c.PushMu.Lock()
			c.Labels = n.Labels
			c.PushMu.Unlock()
		}
	}
	h.OperatorsChanged()
	by := "admin:" + adminName(r)
	for _, n := range changed {
		h.audit(store.AuditEvent{Kind: "node_label", Operator: by, Node: n.Name, Remote: r.RemoteAddr, Result: "ok",
			Detail: fmt.Sprintf("labels %s (were %s)", orNone(apitype.FormatLabels(n.Labels)),
				orNone(apitype.FormatLabels(before[n.ID])))})
	}
	h.Logger.Info("node labels changed", "nodes", len(changed), "by", by, "set", apitype.FormatLabels(req.Set), "remove",
		req.Remove)
	writeJSON(w, http.StatusOK, convertAll(changed, nodeFrom))
}

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// labelTargets resolves the nodes of a label request.
func (h *handler) labelTargets(ctx context.Context, req apitype.NodeLabelRequest) ([]store.Node, error) {
	if (req.Selector == "") == (len(req.Nodes) == 0) {
		return nil, fail(ErrInvalid, "name the nodes (NAME...) or give a selector (-l env=dev, or -l '*' for all), not both")
	}
	all, err := h.Store.ListNodes(ctx)
	if err != nil {
		return nil, internal("list nodes", err)
	}
	if req.Selector != "" {
		match, err := nodeSelector(req.Selector)
		if err != nil {
			return nil, err
		}
		var out []store.Node
		for _, n := range all {
			if match(n.Labels) {
				out = append(out, n)
			}
		}
		if len(out) == 0 {
			return nil, fail(ErrInvalid, "selector %q matches no node (see `tether nodes`)", req.Selector)
		}
		return out, nil
	}
	var out []store.Node
	var unknown []string
	for _, name := range req.Nodes {
		i := slices.IndexFunc(all, func(n store.Node) bool { return n.Name == name })
		if i < 0 {
			unknown = append(unknown, name)
			continue
		}
		if !slices.ContainsFunc(out, func(n store.Node) bool { return n.Name == name }) {
			out = append(out, all[i])
		}
	}
	if len(unknown) > 0 {
		return nil, fail(ErrNotFound, "no node named %s (see `tether nodes`)", strings.Join(unknown, ", "))
	}
	return out, nil
}

// labelChange checks the requested edit with the one label vocabulary.
func labelChange(req apitype.NodeLabelRequest) (store.LabelChange, error) {
	if len(req.Set) == 0 && len(req.Remove) == 0 {
		return store.LabelChange{}, fail(ErrInvalid, "no label change given: KEY=VALUE sets a label, KEY- removes one")
	}
	if err := validate.Labels(req.Set); err != nil {
		return store.LabelChange{}, fail(ErrInvalid, "%s", err.Error())
	}
	for _, k := range req.Remove {
		if err := validate.LabelKey(k); err != nil {
			return store.LabelChange{}, fail(ErrInvalid, "%s", err.Error())
		}
		if _, ok := req.Set[k]; ok {
			return store.LabelChange{}, fail(ErrInvalid, "label %q is both set and removed", k)
		}
	}
	return store.LabelChange{Set: req.Set, Remove: req.Remove}, nil
}
