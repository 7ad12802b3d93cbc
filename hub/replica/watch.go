package replica

import (
	"context"
	"encoding/json"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
)

// Every replica keeps a peer link to every other live replica, dialed at
// each heartbeat if it has none, not only to those it forwards streams
// to. A link ends at once when the peer's process dies (its machine
// resets the connection) and within peerDeadAfter when its machine falls
// silent. Then the replica dials the peer once more, for
// peerConfirmTimeout; if that fails too, the peer is taken for dead and
// its QUIC agents are poked over (Config.Poke): each node session a
// replica holds is recorded with its agent's address and the session's
// poke token (SessionInfo.Poke, in presence), and a poke with that token
// from any hub makes the agent drop the session and dial its hubs again,
// where the dead replica's address fails and the next one answers. A TCP
// agent needs none: the dead process's machine resets its connection too.
// Without the poke a QUIC agent would notice at its dead-peer timeout
// (50 s at the defaults), since an idle agent sends nothing for 25 s.
//
// A poke on a false alarm (the replicas cannot reach each other, but the
// agents can reach their replica) costs a reconnect to the same replica:
// the agent dials the hub it was on first, and its streams resume.
const peerConfirmTimeout = 2 * time.Second

// watch keeps the links to the live replicas and handles their loss,
// until Close.
func (p *Peers) watch() {
	t := time.NewTicker(p.cfg.LeaseTTL / 3)
	defer t.Stop()
	for {
		p.linkAll()
		select {
		case <-p.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// linkAll dials, in the background, every live replica this one has no
// live link to.
func (p *Peers) linkAll() {
	ctx, cancel := context.WithTimeout(p.ctx, p.cfg.LeaseTTL/3)
	defer cancel()
	reps, err := p.cfg.Store.ListReplicas(ctx)
	if err != nil {
		return // the heartbeat says the store is unavailable
	}
	now := time.Now()
	for _, r := range reps {
		if r.ID == p.cfg.ID || !r.LeaseUntil.After(now) || r.PeerAddr == "" || p.linked(r.ID) {
			continue
		}
		p.wg.Go(func() {
			// Bounded by the handshake timeout.
			if _, err := p.dial(p.ctx, r.ID, r.PeerAddr, r.Started); err != nil {
				p.log.Debug("replica: peer link not up", "peer", r.ID, "err", err)
			}
		})
	}
}

// linked reports whether the link to replica id is live.
func (p *Peers) linked(id string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	l := p.links[id]
	if l == nil || l.sess == nil {
		return false
	}
	select {
	case <-l.sess.Done():
		return false
	default:
		return true
	}
}

// linkLost handles the end of the link to replica id: unless this replica
// is closing, the peer is dialed again at the address the store has for it
// now (a replica that restarted may listen elsewhere), and if it does not
// answer its agents are poked over (once per loss). A replica that left
// the store stopped cleanly: its agents were told, and its presence is
// released.
func (p *Peers) linkLost(id string) {
	if p.ctx.Err() != nil {
		return
	}
	p.mu.Lock()
	l := p.links[id]
	p.mu.Unlock()
	if l == nil {
		return
	}
	p.wg.Go(func() {
		ctx, cancel := context.WithTimeout(p.ctx, peerConfirmTimeout)
		defer cancel()
		r, ok := p.replica(ctx, id)
		if !ok {
			return
		}
		_, err := p.dial(ctx, id, r.PeerAddr, r.Started)
		if err == nil || p.ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		first := !l.poked
		l.poked = true
		p.mu.Unlock()
		if first {
			p.pokeAgentsOf(id, err)
		}
	})
}

// replica is the store's record of replica id, if it is there with a peer
// address (ok false: it left, or the store cannot be read).
func (p *Peers) replica(ctx context.Context, id string) (store.Replica, bool) {
	reps, err := p.cfg.Store.ListReplicas(ctx)
	if err != nil {
		return store.Replica{}, false
	}
	for _, r := range reps {
		if r.ID == id && r.PeerAddr != "" {
			return r, true
		}
	}
	return store.Replica{}, false
}

// pokeAgentsOf pokes the QUIC agents of replica id, found dead (why).
func (p *Peers) pokeAgentsOf(id string, why error) {
	if p.cfg.Poke == nil {
		return
	}
	ctx, cancel := context.WithTimeout(p.ctx, requestTimeout)
	defer cancel()
	held, err := p.cfg.Store.PresenceHeldBy(ctx, id)
	if err != nil {
		p.log.Warn("replica: a dead replica's agents not poked; they reconnect at their dead-peer timeout",
			"peer", id, "err", err)
		return
	}
	targets := make([]tunnel.PokeTarget, 0, len(held))
	for _, pr := range held {
		var info SessionInfo
		if json.Unmarshal(pr.Session, &info) != nil || info.Poke == "" {
			continue
		}
		if t, err := tunnel.ParsePokeTarget(info.Poke); err == nil {
			targets = append(targets, t)
		}
	}
	n := p.cfg.Poke(targets)
	p.m.poked.Add(float64(n))
	p.log.Warn("replica unreachable: asking its QUIC agents to reconnect now", "peer", id, "nodes", len(held),
		"poked", n, "err", why)
}
