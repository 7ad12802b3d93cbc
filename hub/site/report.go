package site

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"time"

	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

// report sends the status heartbeat and the inventory for one session: at
// once the latest status (saying since when it was queued) and a full
// inventory, then the status every interval and on change, and inventory
// changes as they happen.
func (s *uplinkSession) report(ctx context.Context, queuedSince time.Time) error {
	u := s.u
	inv, err := s.sendFullInventory(ctx)
	if err != nil {
		return err
	}
	last, err := s.sendStatus(ctx, queuedSince)
	if err != nil {
		return err
	}
	lastAt := time.Now()
	tick := time.NewTicker(max(u.cfg.StatusInterval/4, 100*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C:
		case <-u.kick:
		}
		if inv, err = s.sendInventoryChanges(ctx, inv); err != nil {
			return err
		}
		st, err := u.buildStatus(ctx, time.Time{})
		if err != nil {
			s.log.Warn("build site status", "err", err)
			continue
		}
		if time.Since(lastAt) < u.cfg.StatusInterval && sameStatus(st, last) {
			continue
		}
		if last, err = s.sendBuilt(st); err != nil {
			return err
		}
		lastAt = time.Now()
	}
}

func (s *uplinkSession) sendStatus(ctx context.Context, queuedSince time.Time) (*siteproto.Status, error) {
	st, err := s.u.buildStatus(ctx, queuedSince)
	if err != nil {
		return nil, err
	}
	return s.sendBuilt(st)
}

func (s *uplinkSession) sendBuilt(st *siteproto.Status) (*siteproto.Status, error) {
	seq, err := s.u.seqs.take()
	if err != nil {
		return nil, err
	}
	st.Seq, st.At = seq, time.Now().UTC()
	if err := s.send(&control.Message{Type: siteproto.TypeStatus, SiteStatus: st}); err != nil {
		return nil, err
	}
	return st, nil
}

// buildStatus is the site's status now, hooks applied (Seq and At unset).
func (u *Uplink) buildStatus(ctx context.Context, queuedSince time.Time) (*siteproto.Status, error) {
	st, err := u.cfg.Status(ctx)
	if err != nil {
		return nil, err
	}
	u.hmu.Lock()
	hooks := slices.Clone(u.addStatus)
	u.hmu.Unlock()
	for _, f := range hooks {
		f(st)
	}
	st.QueuedSince = queuedSince
	if err := (&control.Message{Type: siteproto.TypeStatus, SiteStatus: st}).Validate(); err != nil {
		return nil, fmt.Errorf("site status: %w", err)
	}
	return st, nil
}

// sameStatus compares two statuses without Seq, At and QueuedSince.
func sameStatus(a, b *siteproto.Status) bool {
	if a == nil || b == nil {
		return a == b
	}
	x, y := *a, *b
	x.Seq, x.At, x.QueuedSince = 0, time.Time{}, time.Time{}
	y.Seq, y.At, y.QueuedSince = 0, time.Time{}, time.Time{}
	bx, _ := json.Marshal(x)
	by, _ := json.Marshal(y)
	return string(bx) == string(by)
}

// invKey is what an inventory entry is compared by (LastSeen moves on its
// own and is sent with the next real change).
type invKey struct {
	ID, Transport   string
	Online, Revoked bool
	Labels          string
}

func keyOf(n siteproto.Node) invKey {
	l, _ := json.Marshal(n.Labels)
	return invKey{ID: n.ID, Transport: n.Transport, Online: n.Online, Revoked: n.Revoked, Labels: string(l)}
}

// sendFullInventory sends the whole inventory in pages, Full first and Done
// last, and returns what was sent.
func (s *uplinkSession) sendFullInventory(ctx context.Context) (map[string]invKey, error) {
	nodes, err := s.u.cfg.Inventory(ctx)
	if err != nil {
		return nil, fmt.Errorf("site inventory: %w", err)
	}
	sent := make(map[string]invKey, len(nodes))
	for i := 0; i == 0 || i < len(nodes); i += inventoryPage {
		page := nodes[i:min(i+inventoryPage, len(nodes))]
		m := &siteproto.Nodes{Full: i == 0, Done: i+inventoryPage >= len(nodes), Nodes: page}
		if err := s.send(&control.Message{Type: siteproto.TypeNodes, SiteNodes: m}); err != nil {
			return nil, err
		}
	}
	for _, n := range nodes {
		sent[n.Name] = keyOf(n)
	}
	return sent, nil
}

// sendInventoryChanges sends what changed since sent, and returns the new
// state.
func (s *uplinkSession) sendInventoryChanges(ctx context.Context, sent map[string]invKey) (map[string]invKey, error) {
	nodes, err := s.u.cfg.Inventory(ctx)
	if err != nil {
		s.log.Warn("site inventory", "err", err)
		return sent, nil
	}
	now, pages := inventoryChanges(sent, nodes)
	for _, m := range pages {
		if err := s.send(&control.Message{Type: siteproto.TypeNodes, SiteNodes: m}); err != nil {
			return nil, err
		}
	}
	return now, nil
}

// inventoryChanges is the inventory state of nodes and the change
// messages (upserts, removals; at most inventoryPage entries each) that
// turn sent into it.
func inventoryChanges(sent map[string]invKey, nodes []siteproto.Node) (map[string]invKey, []*siteproto.Nodes) {
	now := make(map[string]invKey, len(nodes))
	var up []siteproto.Node
	for _, n := range nodes {
		k := keyOf(n)
		now[n.Name] = k
		if old, ok := sent[n.Name]; !ok || old != k {
			up = append(up, n)
		}
	}
	var removed []string
	for name := range sent {
		if _, ok := now[name]; !ok {
			removed = append(removed, name)
		}
	}
	slices.Sort(removed)
	var pages []*siteproto.Nodes
	for len(up) > 0 || len(removed) > 0 {
		m := &siteproto.Nodes{}
		n := min(len(up), inventoryPage)
		m.Nodes, up = up[:n], up[n:]
		r := min(len(removed), inventoryPage-n)
		m.Removed, removed = removed[:r], removed[r:]
		pages = append(pages, m)
	}
	return now, pages
}
