package store

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"sync"
)

// seenCommits group-commits UpdateNodeSeen: a session's connect and
// disconnect each record the node's presence, and when thousands of agents
// come back at once (a hub restart, a network that heals) or go at once (a
// hub stopping), one synchronous commit per agent made the commits
// themselves the cost: WAL frames and an fsync each, 7 % of the hub's CPU
// in a 2,000-agent reconnect storm, and 2,000 commits in a row before a
// stopping hub could exit. Callers still wait for their own write to commit
// (a node listed online has its row saying so), but writes that arrive
// while a commit runs share the next one.
//
// Whoever holds commit writes everything pending, its own write included
// unless an earlier holder already did; no goroutine of its own.
type seenCommits struct {
	commit  sync.Mutex // one group commit at a time
	mu      sync.Mutex // guards pending
	pending []*seenWrite
}

type seenWrite struct {
	id   string
	seen Seen
	err  error
	done chan struct{} // closed once err is final
}

const updateSeenSQL = `UPDATE nodes SET online = ?, transport = CASE WHEN ? = '' THEN transport ELSE ? END,
		agent_version = CASE WHEN ? = '' THEN agent_version ELSE ? END, last_seen = ? WHERE id = ?`

// UpdateNodeSeen implements NodeStore.
func (s *DB) UpdateNodeSeen(ctx context.Context, id string, st Seen) error {
	w := &seenWrite{id: id, seen: st, done: make(chan struct{})}
	g := &s.seen
	g.mu.Lock()
	g.pending = append(g.pending, w)
	g.mu.Unlock()

	g.commit.Lock()
	select {
	case <-w.done: // an earlier holder committed it
		g.commit.Unlock()
		return w.err
	default:
	}
	g.mu.Lock()
	batch := g.pending
	g.pending = nil
	g.mu.Unlock()
	s.commitSeen(ctx, batch)
	g.commit.Unlock()
	<-w.done
	return w.err
}

// commitSeen writes batch in one transaction, in node ID order so that
// replicas committing overlapping batches on PostgreSQL lock rows in the
// same order. Should the transaction fail as a whole, each write is tried
// on its own, so one bad write does not fail the others.
func (s *DB) commitSeen(ctx context.Context, batch []*seenWrite) {
	defer func() {
		for _, w := range batch {
			close(w.done)
		}
	}()
	if len(batch) == 1 {
		batch[0].err = s.updateSeen(ctx, s.hot(), batch[0])
		return
	}
	// Stable: two writes for one node stay in the order they came.
	slices.SortStableFunc(batch, func(a, b *seenWrite) int { return cmp.Compare(a.id, b.id) })
	// The batch serves many callers: one caller's cancelled context must
	// not fail the others' writes.
	ctx = context.WithoutCancel(ctx)
	if err := s.commitSeenTx(ctx, batch); err == nil {
		return
	}
	for _, w := range batch {
		w.err = s.updateSeen(ctx, s.hot(), w)
	}
}

func (s *DB) commitSeenTx(ctx context.Context, batch []*seenWrite) error {
	// Prepared before the transaction: SQLite's store has one connection,
	// which the transaction holds.
	stmt, err := s.prepared(ctx, updateSeenSQL)
	if err != nil {
		return err
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	txStmt := tx.StmtContext(ctx, stmt)
	errs := make([]error, len(batch))
	for i, w := range batch {
		if errs[i] = s.updateSeen(ctx, stmtExec{txStmt}, w); errs[i] != nil && !errors.Is(errs[i], ErrNotFound) {
			tx.Rollback()
			return errs[i]
		}
	}
	if err := tx.Commit(); err != nil {
		return err
	}
	for i, w := range batch {
		w.err = errs[i]
	}
	return nil
}

// stmtExec runs a transaction's prepared statement under the execer
// interface (its query text is the statement's).
type stmtExec struct{ st *sql.Stmt }

func (e stmtExec) ExecContext(ctx context.Context, _ string, args ...any) (sql.Result, error) {
	return e.st.ExecContext(ctx, args...)
}

func (s *DB) updateSeen(ctx context.Context, e execer, w *seenWrite) error {
	st := w.seen
	res, err := e.ExecContext(ctx, updateSeenSQL, st.Online, st.Transport, st.Transport, st.AgentVersion, st.AgentVersion,
		unix(st.At), w.id)
	if err != nil {
		return fmt.Errorf("store: update node %s: %w", w.id, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: node %s: %w", w.id, ErrNotFound)
	}
	return nil
}
