// Package notify carries changes made on one hub replica (an operator
// removed, a role edited, a key, node or admin revoked, work asked of the
// singletons) to the live state of every other replica sharing the store.
//
// The store's change feed is the truth: every replica reads the changes
// after the last one it applied, at least every Poll. A Nudger (PostgreSQL
// LISTEN/NOTIFY) only makes that read happen now instead of at the next
// poll: a notification lost while a listener reconnects costs at most one
// poll interval, never a change. On SQLite (one machine) there is no
// nudger and the poll is short; the feed's read is one indexed query.
package notify

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/tether-dev/tether/hub/store"
)

// Default poll intervals: without a nudger the poll alone must keep a
// change within a second of every replica; with one it is the safety net.
const (
	DefaultPoll       = 250 * time.Millisecond
	DefaultNudgedPoll = time.Second
	// DefaultResync is how often the whole access state is re-read
	// whatever the feed says (Config.Resync).
	DefaultResync = 30 * time.Second
)

const batch = 500

// Store is the part of the hub's store the feed uses.
type Store interface {
	RecordChange(ctx context.Context, c store.Change) (int64, error)
	ChangesSince(ctx context.Context, seq int64, limit int) ([]store.Change, error)
	LastChange(ctx context.Context) (int64, error)
}

// Nudger wakes the other replicas' feeds at once.
type Nudger interface {
	// Nudge tells every listener that the feed has news.
	Nudge(ctx context.Context) error
	// Listen calls fn for each nudge until ctx ends or the connection
	// breaks (it returns the error then; the feed listens again).
	Listen(ctx context.Context, fn func()) error
}

// Config configures a feed.
type Config struct {
	Store Store
	// Origin is this replica's ID: the changes it published itself were
	// applied when they were made and are skipped.
	Origin string
	// Apply applies changes made on other replicas, oldest first.
	Apply func(ctx context.Context, changes []store.Change)
	// Resync, if set, re-reads the whole state every ResyncEvery: the
	// truth behind the feed (a change recorded by a replica that died
	// between its write and its feed entry is still picked up).
	Resync      func(ctx context.Context)
	ResyncEvery time.Duration
	Nudger      Nudger        // nil: poll only
	Poll        time.Duration // default DefaultPoll, DefaultNudgedPoll with a nudger
	Logger      *slog.Logger
}

// Feed publishes this replica's changes and applies the others'.
type Feed struct {
	cfg   Config
	nudge chan struct{}
}

// New returns a feed; Run follows it.
func New(cfg Config) (*Feed, error) {
	if cfg.Store == nil || cfg.Apply == nil {
		return nil, errors.New("notify: Store and Apply are required")
	}
	if cfg.Poll <= 0 {
		cfg.Poll = DefaultPoll
		if cfg.Nudger != nil {
			cfg.Poll = DefaultNudgedPoll
		}
	}
	if cfg.ResyncEvery <= 0 {
		cfg.ResyncEvery = DefaultResync
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return &Feed{cfg: cfg, nudge: make(chan struct{}, 1)}, nil
}

// Publish records a change this replica made (and applied) for the others,
// and nudges them.
func (f *Feed) Publish(ctx context.Context, kind, subject string) error {
	if _, err := f.cfg.Store.RecordChange(ctx, store.Change{
		Kind: kind, Subject: subject, Origin: f.cfg.Origin,
	}); err != nil {
		return err
	}
	if f.cfg.Nudger != nil {
		if err := f.cfg.Nudger.Nudge(ctx); err != nil {
			// The others' poll picks the change up anyway.
			f.cfg.Logger.Debug("replicas not nudged; they see the change at their next poll", "err", err)
		}
	}
	return nil
}

// Run follows the feed until ctx ends. It starts after the newest change:
// what came before is in the state this replica loaded at start.
func (f *Feed) Run(ctx context.Context) {
	var seq int64
	for {
		var err error
		if seq, err = f.cfg.Store.LastChange(ctx); err == nil {
			break
		}
		f.cfg.Logger.Warn("change feed not readable; retrying", "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(f.cfg.Poll):
		}
	}
	if f.cfg.Nudger != nil {
		go f.listen(ctx)
	}
	poll := time.NewTicker(f.cfg.Poll)
	defer poll.Stop()
	resync := time.NewTicker(f.cfg.ResyncEvery)
	defer resync.Stop()
	failing := false
	for {
		select {
		case <-ctx.Done():
			return
		case <-poll.C:
		case <-f.nudge:
		case <-resync.C:
			if f.cfg.Resync != nil {
				f.cfg.Resync(ctx)
			}
			continue
		}
		next, err := f.read(ctx, seq)
		if err != nil {
			if !failing && ctx.Err() == nil {
				f.cfg.Logger.Warn("change feed not readable; changes made on other replicas wait", "err", err)
			}
			failing = true
			continue
		}
		if failing {
			f.cfg.Logger.Info("change feed readable again")
			failing = false
		}
		seq = next
	}
}

// read applies the changes after seq and returns the last one read.
func (f *Feed) read(ctx context.Context, seq int64) (int64, error) {
	for {
		cs, err := f.cfg.Store.ChangesSince(ctx, seq, batch)
		if err != nil {
			return seq, err
		}
		if len(cs) == 0 {
			return seq, nil
		}
		seq = cs[len(cs)-1].Seq
		theirs := cs[:0]
		for _, c := range cs {
			if c.Origin != f.cfg.Origin || f.cfg.Origin == "" {
				theirs = append(theirs, c)
			}
		}
		if len(theirs) > 0 {
			f.cfg.Apply(ctx, theirs)
		}
		if len(cs) < batch {
			return seq, nil
		}
	}
}

// listen turns nudges into reads, listening again after a broken
// connection (the poll covers what was sent meanwhile).
func (f *Feed) listen(ctx context.Context) {
	wait := f.cfg.Poll
	for ctx.Err() == nil {
		err := f.cfg.Nudger.Listen(ctx, func() {
			select {
			case f.nudge <- struct{}{}:
			default:
			}
		})
		if ctx.Err() != nil {
			return
		}
		f.cfg.Logger.Warn("change notifications lost; listening again (the feed is still polled)", "in", wait, "err", err)
		select {
		case <-ctx.Done():
			return
		case <-time.After(wait):
		}
		// Changes may have been missed while not listening.
		select {
		case f.nudge <- struct{}{}:
		default:
		}
	}
}
