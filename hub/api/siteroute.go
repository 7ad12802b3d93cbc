package api

import (
	"context"
	"net/http"

	"github.com/tether-dev/tether/hub/store"
)

// sshTrust answers GET /v1/ssh/trust: the hub's CA keys and bastion, and
// the host CAs of the sites below it.
func (h *handler) sshTrust(w http.ResponseWriter, r *http.Request) {
	t := h.SSHTrust
	if h.SiteHostCAs != nil {
		t.Sites = h.SiteHostCAs()
	}
	writeJSON(w, http.StatusOK, t)
}

// withInventory is this hub's own nodes followed by the nodes below its
// sites (Deps.Inventory), and the IDs of the latter.
func (h *handler) withInventory(ctx context.Context, own []store.Node) ([]store.Node, map[string]bool, error) {
	return withInventory(ctx, h.Inventory, own)
}

func withInventory(ctx context.Context, inventory func(context.Context) ([]store.Node, error), own []store.Node) (
	[]store.Node, map[string]bool, error) {
	if inventory == nil {
		return own, nil, nil
	}
	inv, err := inventory(ctx)
	if err != nil {
		return nil, nil, err
	}
	below := make(map[string]bool, len(inv))
	for _, n := range inv {
		below[n.ID] = true
	}
	return append(own, inv...), below, nil
}

// inventoryNode finds a node below a site by ID (ok false if none).
func (h *handler) inventoryNode(ctx context.Context, id string) (store.Node, bool, error) {
	return inventoryNode(ctx, h.Inventory, id)
}

func inventoryNode(ctx context.Context, inventory func(context.Context) ([]store.Node, error), id string) (
	store.Node, bool, error) {
	if inventory == nil {
		return store.Node{}, false, nil
	}
	inv, err := inventory(ctx)
	if err != nil {
		return store.Node{}, false, err
	}
	for _, n := range inv {
		if n.ID == id {
			return n, true, nil
		}
	}
	return store.Node{}, false, nil
}
