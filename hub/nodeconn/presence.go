package nodeconn

import (
	"context"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/tick"
)

// presenceWriters bounds the last_seen writes one sweep runs at once:
// enough for the store's group commit to share transactions between them.
const presenceWriters = 16

// presenceMark is what the sweep remembers of one session.
type presenceMark struct {
	heard  uint64    // Session.Heard at the last sweep
	stored time.Time // last_seen last written
	sweep  uint64    // the last sweep that saw the session
}

// presence keeps the presence of the sessions whose liveness is the
// transport's (Conn.TransportLive). No heartbeat tells the hub
// when it last heard them, so every sweep compares each session's
// Session.Heard mark with the previous sweep's: when it moved, Heard is
// set (the console's stale state), and last_seen is written at most every
// seenStoreInterval, as heartbeats do for the other sessions. One goroutine
// for the hub and a few atomic loads per session per sweep.
type presence struct {
	marks map[*Conn]*presenceMark
	sweep uint64
}

// SweepPresence runs a presence sweep every quarter keepalive interval
// until ctx ends. An agent pings at most 1.25 intervals after it last heard
// the hub, or heartbeats every interval when its own keepalive setting is
// longer (control.Liveness.AgentHeartbeats), so Heard is at most 1.5
// intervals old while the agent lives: the console calls a node stale
// after two.
func (s *Server) SweepPresence(ctx context.Context) {
	p := &presence{marks: map[*Conn]*presenceMark{}}
	tick.Every(ctx, s.Liveness().Every/4, func(now time.Time) { s.writeSeen(ctx, p.sweepOnce(s.cfg.Table.All(), now)) })
}

// sweepOnce updates the marks and Heard of conns at now and returns the
// sessions whose last_seen is due.
func (p *presence) sweepOnce(conns []*Conn, now time.Time) []*Conn {
	p.sweep++
	var due []*Conn
	for _, c := range conns {
		if !c.TransportLive {
			continue
		}
		h := c.Session.Heard()
		m, ok := p.marks[c]
		switch {
		case !ok: // admitted since the last sweep, which counts as heard and stored
			m = &presenceMark{heard: h, stored: c.Connected}
			p.marks[c] = m
		case h != m.heard:
			m.heard = h
			c.Heard.Store(now.UnixNano())
		}
		m.sweep = p.sweep
		if now.Sub(m.stored) >= seenStoreInterval {
			m.stored = now
			due = append(due, c)
		}
	}
	for c, m := range p.marks {
		if m.sweep != p.sweep {
			delete(p.marks, c) // gone
		}
	}
	return due
}

// writeSeen records that conns were online when last heard.
func (s *Server) writeSeen(ctx context.Context, conns []*Conn) {
	work := make(chan *Conn)
	var wg sync.WaitGroup
	for range min(presenceWriters, len(conns)) {
		wg.Go(func() {
			for c := range work {
				c.SeenMu.Lock()
				if cur, ok := s.cfg.Table.Get(c.Name); ok && cur == c {
					s.markSeen(ctx, s.log.With("node", c.Name), c.NodeID, store.Seen{Online: true, At: time.Unix(0, c.Heard.Load())})
				}
				c.SeenMu.Unlock()
			}
		})
	}
	for _, c := range conns {
		work <- c
	}
	close(work)
	wg.Wait()
}
