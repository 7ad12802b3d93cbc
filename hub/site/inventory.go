package site

import (
	"context"
	"fmt"
	"maps"
	"strings"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// inventory applies one site_nodes message. Names arrive relative to the
// site (control validated each); here they get the site's name appended,
// which must still be a valid name at this hub.
func (c *Children) inventory(ctx context.Context, ch *child, in *siteproto.Nodes) error {
	nodes := make([]store.SiteNode, 0, len(in.Nodes))
	for _, n := range in.Nodes {
		sn, err := siteNodeOf(ch.Name, ch.NodeID, n)
		if err != nil {
			return err
		}
		nodes = append(nodes, sn)
	}
	for _, r := range in.Removed {
		if err := siteproto.ValidNodePath(r + "." + ch.Name); err != nil {
			return fmt.Errorf("site %s: inventory removal %q: %w", ch.Name, r, err)
		}
	}
	c.mu.Lock()
	if in.Full {
		ch.staging, ch.inFull = nil, true
	}
	if ch.inFull {
		if len(ch.staging)+len(nodes) > maxInventory {
			c.mu.Unlock()
			return fmt.Errorf("site %s: inventory of more than %d nodes", ch.Name, maxInventory)
		}
		ch.staging = append(ch.staging, nodes...)
		if !in.Done {
			c.mu.Unlock()
			return nil
		}
		nodes, ch.staging, ch.inFull = ch.staging, nil, false
		c.mu.Unlock()
		if err := c.cfg.Store.ReplaceSiteNodes(ctx, ch.NodeID, nodes); err != nil {
			c.log.Error("record site inventory", "site", ch.Name, "err", err)
			return nil
		}
		c.cfg.Changed()
		return nil
	}
	c.mu.Unlock()
	if err := c.cfg.Store.ApplySiteNodes(ctx, ch.NodeID, nodes, in.Removed); err != nil {
		c.log.Error("record site inventory change", "site", ch.Name, "err", err)
		return nil
	}
	c.cfg.Changed()
	return nil
}

// maxInventory bounds one site's full inventory held in memory.
const maxInventory = 200_000

// siteNodeOf is n as this hub stores it: named relative to site, with the
// label site=SUFFIX (its site path relative to this hub).
func siteNodeOf(site, siteID string, n siteproto.Node) (store.SiteNode, error) {
	full := n.Name + "." + site
	if err := siteproto.ValidNodePath(full); err != nil {
		return store.SiteNode{}, fmt.Errorf("site %s: inventory name %q: %w", site, n.Name, err)
	}
	suffix := site
	if _, rest, ok := strings.Cut(n.Name, "."); ok {
		suffix = rest + "." + site
	}
	labels := maps.Clone(n.Labels)
	if labels == nil {
		labels = map[string]string{}
	}
	labels["site"] = suffix
	return store.SiteNode{SiteID: siteID, Site: site, Name: n.Name, ID: n.ID, Labels: labels, Online: n.Online,
		LastSeen: n.LastSeen, Transport: n.Transport, Revoked: n.Revoked}, nil
}
