package nodeconn

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// backlogRefresh is how old the count of enrolled nodes may grow before a
// refusal asks the store again.
const backlogRefresh = 5 * time.Second

// backlogCountTimeout bounds one count in the store.
const backlogCountTimeout = 5 * time.Second

// FleetBacklog is the tunnel listener's Backlog: how many enrolled nodes are
// not connected, so at most that many agents can be waiting for a
// handshake slot. The listener asks on every refusal, from quic-go's
// packet handling too, so the answer comes from memory: the enrolled count
// is read from the store in the background, at most every backlogRefresh
// and only while refusals ask for it (an idle hub never counts).
type FleetBacklog struct {
	ctx   context.Context // the hub's run: ends the background count
	count func(context.Context) (int, error)
	reg   *Table
	log   *slog.Logger

	nodes     atomic.Int64 // enrolled nodes at the last count; -1: unknown
	countedAt atomic.Int64 // unix nanoseconds of the last count

	mu       sync.Mutex     // guards the following
	wg       sync.WaitGroup // the count in flight
	counting bool           // a count is in flight
	closed   bool           // wait was called: no more counts
}

func NewFleetBacklog(
	ctx context.Context,
	count func(context.Context) (int, error),
	reg *Table,
	log *slog.Logger,
) *FleetBacklog {
	b := &FleetBacklog{ctx: ctx, count: count, reg: reg, log: log}
	b.nodes.Store(-1)
	b.countNodes() // before the first session: a restarted hub's storm starts at once
	return b
}

// Waiting is the Backlog: enrolled nodes less the connected ones, or -1
// while the store has not answered.
func (b *FleetBacklog) Waiting() int {
	if time.Since(time.Unix(0, b.countedAt.Load())) > backlogRefresh {
		b.mu.Lock()
		if !b.counting && !b.closed {
			b.counting = true
			b.wg.Go(func() {
				b.countNodes()
				b.mu.Lock()
				b.counting = false
				b.mu.Unlock()
			})
		}
		b.mu.Unlock()
	}
	n := b.nodes.Load()
	if n < 0 {
		return -1
	}
	return max(0, int(n)-b.reg.Len())
}

// countNodes reads the count of enrolled nodes from the store.
func (b *FleetBacklog) countNodes() {
	ctx, cancel := context.WithTimeout(b.ctx, backlogCountTimeout)
	defer cancel()
	n, err := b.count(ctx)
	// A failed count is retried no sooner than a good one would be.
	b.countedAt.Store(time.Now().UnixNano())
	if err != nil {
		b.log.Warn("count enrolled nodes for the handshake queue", "err", err)
		return
	}
	b.nodes.Store(int64(n))
}

// Wait stops further counts and waits for one in flight.
func (b *FleetBacklog) Wait() {
	b.mu.Lock()
	b.closed = true
	b.mu.Unlock()
	b.wg.Wait()
}
