package api

import (
	"context"
	"errors"
	"slices"
	"strings"

	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
)

// Targets finds the nodes that features acting on nodes (jobs, upgrades)
// target: the hub's own nodes and, through Inventory, the nodes below its
// sites, as GET /v1/nodes lists them.
type Targets struct {
	Store interface {
		ListNodes(ctx context.Context) ([]store.Node, error)
		ListSites(ctx context.Context) ([]store.Site, error)
		GetNode(ctx context.Context, id string) (store.Node, error)
	}
	// Inventory lists the nodes below this hub's sites; nil: none.
	Inventory func(ctx context.Context) ([]store.Node, error)
}

// Node finds a node by ID, below a site too; store.ErrNotFound if none.
func (t Targets) Node(ctx context.Context, id string) (store.Node, error) {
	n, err := t.Store.GetNode(ctx, id)
	if errors.Is(err, store.ErrNotFound) && id != "" {
		inv, ok, ierr := inventoryNode(ctx, t.Inventory, id)
		switch {
		case ierr != nil:
			return store.Node{}, ierr
		case ok:
			return inv, nil
		}
	}
	return n, err
}

// Select finds the nodes a selector or a list of names targets (revoked
// nodes never); the caller authorizes them.
func (t Targets) Select(ctx context.Context, selector string, names []string) ([]store.Node, error) {
	if (selector == "") == (len(names) == 0) {
		return nil, fail(
			ErrInvalid,
			"give the target nodes as names (--nodes n1,n2) or as a label selector (-l site=lab, or -l '*' for all), not both",
		)
	}
	all, err := t.Store.ListNodes(ctx)
	if err != nil {
		return nil, err
	}
	// A site hub has a node row here but serves only route streams: a
	// job reaches the nodes below it, never the site itself.
	sites, err := t.Store.ListSites(ctx)
	if err != nil {
		return nil, err
	}
	isSite := make(map[string]bool, len(sites))
	siteNamed := make(map[string]bool, len(sites))
	for _, st := range sites {
		isSite[st.NodeID], siteNamed[st.Name] = true, true
	}
	all = slices.DeleteFunc(all, func(n store.Node) bool { return isSite[n.ID] })
	if all, _, err = withInventory(ctx, t.Inventory, all); err != nil { // nodes below sites, keyed on their IDs too
		return nil, err
	}
	byName := make(map[string]store.Node, len(all))
	for _, n := range all {
		byName[n.Name] = n
	}
	var targets []store.Node
	if selector != "" {
		var sel roles.Selector
		if selector != "*" {
			if sel, err = roles.ParseSelector(selector); err != nil {
				return nil, fail(ErrInvalid, "%s", clean(err))
			}
		}
		for _, n := range all {
			if n.RevokedAt.IsZero() && (selector == "*" || sel.Matches(n.Labels)) {
				targets = append(targets, n)
			}
		}
		if len(targets) == 0 {
			return nil, fail(ErrInvalid, "selector %q matches no node (see `tether nodes`)", selector)
		}
	} else {
		seen := map[string]bool{}
		var unknown []string
		for _, name := range names {
			if seen[name] {
				continue
			}
			seen[name] = true
			n, ok := byName[name]
			switch {
			case !ok && siteNamed[name]:
				return nil, fail(ErrInvalid, "%q is a site hub, not a node: target the nodes below it (-l site=%s)", name, name)
			case !ok:
				unknown = append(unknown, name)
			case !n.RevokedAt.IsZero():
				return nil, fail(ErrInvalid, "node %q is revoked; it cannot run jobs", name)
			default:
				targets = append(targets, n)
			}
		}
		if len(unknown) > 0 {
			return nil, fail(ErrInvalid, "no such node: %s (see `tether nodes`)", strings.Join(unknown, ", "))
		}
	}
	return targets, nil
}

// selectNodes is Targets.Select over the handler's store and inventory.
func (h *handler) selectNodes(ctx context.Context, selector string, names []string) ([]store.Node, error) {
	return Targets{Store: h.Store, Inventory: h.Inventory}.Select(ctx, selector, names)
}
