// Package leader elects, among the hub replicas sharing one store, the one
// that runs the fleet's singletons (the cluster, upgrade and KubeOne
// controllers, the sweep of a dead replica's jobs), through a lease in the
// store. The lease's epoch is a fencing token: the context a leader's work
// runs with carries it (store.WithFence), and the store refuses the
// singletons' writes made under an epoch that is over, so a leader that
// stalled past its lease and wakes up cannot overwrite its successor.
//
// Timing: a leader renews every TTL/3. It steps down (cancels its work)
// when a renewal is refused, or when it could not renew for TTL-TTL/3,
// before the lease can expire under it. A replica that is not the leader
// tries every TTL/3, so when a leader dies without releasing the lease the
// leadership moves within TTL+TTL/3; a leader that stops cleanly releases
// it, and it moves within TTL/3.
package leader

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/store"
)

// DefaultTTL is a lease's life without renewal.
const DefaultTTL = 10 * time.Second

// Store is the part of the hub's store an elector uses.
type Store interface {
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (store.Lease, error)
	RenewLease(ctx context.Context, l store.Lease, ttl time.Duration) (store.Lease, error)
	ReleaseLease(ctx context.Context, l store.Lease) error
}

// Config configures an elector.
type Config struct {
	Store Store
	// Lease is the lease's name (store.LeaderLease for the singletons).
	Lease string
	// Holder is who campaigns: this replica's ID.
	Holder string
	// TTL is the lease's life without renewal; default DefaultTTL.
	TTL time.Duration
	// OnChange, if set, is called when this holder gains (true) or loses
	// (false) the lease, with the lease of that term.
	OnChange func(leading bool, l store.Lease)
	Logger   *slog.Logger
}

// CheckAndSetDefaults validates c and fills defaults.
func (c *Config) CheckAndSetDefaults() error {
	if c.Store == nil || c.Lease == "" || c.Holder == "" {
		return errors.New("leader: Store, Lease and Holder are required")
	}
	if c.TTL == 0 {
		c.TTL = DefaultTTL
	}
	if c.TTL < 30*time.Millisecond {
		return fmt.Errorf("leader: lease TTL %s is too short (want 30ms or more)", c.TTL)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Elector campaigns for one lease.
type Elector struct {
	cfg Config

	mu      sync.Mutex // guards current
	current store.Lease
	leading bool
}

// New returns an elector; Run campaigns.
func New(cfg Config) (*Elector, error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	return &Elector{cfg: cfg}, nil
}

// Leading reports whether this holder leads now, and its term's lease.
func (e *Elector) Leading() (store.Lease, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.current, e.leading
}

// Run campaigns until ctx ends. Each time it holds the lease it calls lead
// with a context that carries the term's fence and ends when the term
// does; it waits for lead to return before it campaigns again, and
// releases the lease when ctx ends.
func (e *Elector) Run(ctx context.Context, lead func(ctx context.Context)) {
	every := e.cfg.TTL / 3
	t := time.NewTimer(0)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		l, err := e.cfg.Store.AcquireLease(ctx, e.cfg.Lease, e.cfg.Holder, e.cfg.TTL)
		switch {
		case err == nil:
			e.term(ctx, l, lead)
		case errors.Is(err, store.ErrLeaseHeld) || ctx.Err() != nil:
		default:
			e.cfg.Logger.Warn("leader lease not acquired; trying again", "lease", e.cfg.Lease, "in", every, "err", err)
		}
		t.Reset(every)
	}
}

// term runs one term: lead under the fence while renewals keep the lease.
func (e *Elector) term(ctx context.Context, l store.Lease, lead func(ctx context.Context)) {
	log := e.cfg.Logger.With("lease", l.Name, "epoch", l.Epoch)
	log.Info("lease acquired: leading")
	e.set(l, true)
	fenced := store.WithFence(ctx, store.Fence{Lease: l.Name, Holder: l.Holder, Epoch: l.Epoch})
	termCtx, cancel := context.WithCancel(fenced)
	done := make(chan struct{})
	go func() {
		defer close(done)
		lead(termCtx)
	}()
	defer func() {
		cancel()
		<-done
		e.set(l, false)
		if ctx.Err() != nil {
			// A clean stop hands over at once instead of after the TTL.
			rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer rcancel()
			if err := e.cfg.Store.ReleaseLease(rctx, l); err != nil {
				log.Warn("lease not released; it expires by itself", "err", err)
			}
		}
	}()
	every := e.cfg.TTL / 3
	// Step down before the lease can expire under us: the store refuses
	// the old epoch's writes anyway, this stops the work itself.
	stepDownAt := time.Now().Add(e.cfg.TTL - every)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-done:
			return // lead gave up on its own; campaign again
		case <-t.C:
		}
		rctx, rcancel := context.WithTimeout(ctx, every)
		next, err := e.cfg.Store.RenewLease(rctx, l, e.cfg.TTL)
		rcancel()
		switch {
		case err == nil:
			l, stepDownAt = next, time.Now().Add(e.cfg.TTL-every)
		case errors.Is(err, store.ErrLeaseLost):
			log.Warn("lease lost: stepping down", "err", err)
			return
		case time.Now().After(stepDownAt):
			log.Warn("lease not renewed in time: stepping down", "err", err)
			return
		default:
			log.Warn("lease renewal failed; retrying", "err", err)
		}
	}
}

func (e *Elector) set(l store.Lease, leading bool) {
	e.mu.Lock()
	e.current, e.leading = l, leading
	e.mu.Unlock()
	if e.cfg.OnChange != nil {
		e.cfg.OnChange(leading, l)
	}
}

// TryHold takes cfg's lease once, for work that must run once in the fleet
// but may start on any replica (a KubeOne run of one cluster): it returns
// store.ErrLeaseHeld (wrapped) at once when another replica holds it.
// Otherwise the lease is renewed every TTL/3 until release is called (or
// ctx ends), and then released. A renewal refused means the lease lapsed
// (this replica stalled for a TTL): it is logged, and the work goes on.
func TryHold(ctx context.Context, cfg Config) (release func(), err error) {
	if err := cfg.CheckAndSetDefaults(); err != nil {
		return nil, err
	}
	l, err := cfg.Store.AcquireLease(ctx, cfg.Lease, cfg.Holder, cfg.TTL)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(cfg.TTL / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
				defer rcancel()
				if err := cfg.Store.ReleaseLease(rctx, l); err != nil {
					cfg.Logger.Warn("lease not released; it expires by itself", "lease", l.Name, "err", err)
				}
				return
			case <-t.C:
			}
			next, err := cfg.Store.RenewLease(ctx, l, cfg.TTL)
			switch {
			case err == nil:
				l = next
			case errors.Is(err, store.ErrLeaseLost):
				cfg.Logger.Error("lease lost while its work runs", "lease", l.Name, "err", err)
				return
			case ctx.Err() == nil:
				cfg.Logger.Warn("lease renewal failed; retrying", "lease", l.Name, "err", err)
			}
		}
	}()
	var once sync.Once
	return func() { once.Do(func() { cancel(); <-done }) }, nil
}
