package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"time"
)

// Sentinel errors of leases and fenced writes.
var (
	// ErrLeaseHeld means another holder has the lease and it has not
	// expired.
	ErrLeaseHeld = errors.New("store: lease is held by another replica")
	// ErrLeaseLost means the lease expired or was taken over since it was
	// acquired: the caller is no longer its holder.
	ErrLeaseLost = errors.New("store: lease lost")
	// ErrFenced refuses a write made under a Fence whose lease this holder
	// no longer has at that epoch: a deposed leader that wakes up cannot
	// overwrite its successor's work.
	ErrFenced = errors.New("store: write refused: this replica no longer holds the leadership it acted under")
)

// Names of leases: the leadership of the fleet's singletons, and each
// replica's liveness (ReplicaLeasePrefix + replica ID, held by that ID).
const (
	LeaderLease        = "leader"
	ReplicaLeasePrefix = "replica/"
)

// Lease is a named, expiring claim in the store: the leadership of the
// fleet's singletons ("leader"), or a replica's liveness ("replica/ID").
// Epoch grows by one with each acquisition, never on a renewal: it is the
// fencing token of the holder's term.
type Lease struct {
	Name    string    `json:"name"`
	Holder  string    `json:"holder"`
	Epoch   int64     `json:"epoch"`
	Expires time.Time `json:"expires"`
}

// Fence is what writes done for a lease holder carry (WithFence): the
// store checks, in the same transaction as the write, that Holder still
// has Lease at Epoch and that it has not expired.
type Fence struct {
	Lease  string
	Holder string
	Epoch  int64
}

type fenceKey struct{}

// WithFence returns ctx carrying f: fenced writes made with it are refused
// with ErrFenced once f's term is over.
func WithFence(ctx context.Context, f Fence) context.Context {
	return context.WithValue(ctx, fenceKey{}, f)
}

// FenceFrom returns the fence ctx carries, if any.
func FenceFrom(ctx context.Context) (Fence, bool) {
	f, ok := ctx.Value(fenceKey{}).(Fence)
	return f, ok
}

// LeaseStore holds leases. Time is the store's (leaseNow): on SQLite (one
// machine) the hub's clock, on PostgreSQL the database's.
type LeaseStore interface {
	// AcquireLease gives lease name to holder until now+ttl if it is free,
	// expired, or holder's already (a restarted replica), with the next
	// epoch: a term starts. Another live holder: ErrLeaseHeld.
	AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (Lease, error)
	// RenewLease extends l to now+ttl if l.Holder still has it at l.Epoch
	// and it has not expired; ErrLeaseLost otherwise.
	RenewLease(ctx context.Context, l Lease, ttl time.Duration) (Lease, error)
	// ReleaseLease ends l now if it is still held at l.Epoch, so a
	// successor need not wait for it to expire.
	ReleaseLease(ctx context.Context, l Lease) error
	// ListLeases returns the leases whose names start with prefix, live or
	// expired.
	ListLeases(ctx context.Context, prefix string) ([]Lease, error)
}

// AcquireLease implements LeaseStore.
func (s *DB) AcquireLease(ctx context.Context, name, holder string, ttl time.Duration) (Lease, error) {
	if name == "" || holder == "" || ttl <= 0 {
		return Lease{}, fmt.Errorf("store: acquire lease %q for %q: name, holder and a positive ttl are required", name,
			holder)
	}
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return Lease{}, fmt.Errorf("store: acquire lease %s: %w", name, err)
	}
	defer tx.Rollback()
	now, err := s.leaseNow(ctx, tx)
	if err != nil {
		return Lease{}, fmt.Errorf("store: acquire lease %s: %w", name, err)
	}
	cur, err := scanLease(tx.QueryRowContext(ctx,
		`SELECT name, holder, epoch, expires_at FROM leases WHERE name = ?`+s.d.forUpdate, name))
	switch {
	case errors.Is(err, sql.ErrNoRows):
		cur = Lease{Name: name}
	case err != nil:
		return Lease{}, fmt.Errorf("store: acquire lease %s: %w", name, err)
	case cur.Holder != holder && cur.Expires.After(now):
		return cur, fmt.Errorf("%w: %s holds %s until %s", ErrLeaseHeld, cur.Holder, name,
			cur.Expires.Format(time.RFC3339Nano))
	}
	// Every acquisition starts a term, even by the same holder (a
	// restarted replica): the previous process's fence is over.
	next := Lease{Name: name, Holder: holder, Epoch: cur.Epoch + 1, Expires: now.Add(ttl).UTC()}
	// Compare-and-swap on the epoch read: of two replicas that both saw
	// the lease free, the second one's write changes nothing.
	res, err := tx.ExecContext(ctx, `INSERT INTO leases (name, holder, epoch, expires_at) VALUES (?,?,?,?)
		ON CONFLICT (name) DO UPDATE SET holder = excluded.holder, epoch = excluded.epoch, expires_at = excluded.expires_at
		WHERE leases.epoch = ?`,
		name, holder, next.Epoch, unix(next.Expires), cur.Epoch)
	if err != nil {
		return Lease{}, fmt.Errorf("store: acquire lease %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return cur, fmt.Errorf("%w: another replica took %s at the same time", ErrLeaseHeld, name)
	}
	if err := tx.Commit(); err != nil {
		return Lease{}, fmt.Errorf("store: acquire lease %s: %w", name, err)
	}
	return next, nil
}

// RenewLease implements LeaseStore.
func (s *DB) RenewLease(ctx context.Context, l Lease, ttl time.Duration) (Lease, error) {
	now, err := s.leaseNow(ctx, s.db)
	if err != nil {
		return l, fmt.Errorf("store: renew lease %s: %w", l.Name, err)
	}
	next := l
	next.Expires = now.Add(ttl).UTC()
	res, err := s.db.ExecContext(ctx,
		`UPDATE leases SET expires_at = ? WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > ?`,
		unix(next.Expires), l.Name, l.Holder, l.Epoch, unix(now))
	if err != nil {
		return l, fmt.Errorf("store: renew lease %s: %w", l.Name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return l, fmt.Errorf("%w: %s no longer holds %s at epoch %d", ErrLeaseLost, l.Holder, l.Name, l.Epoch)
	}
	return next, nil
}

// ReleaseLease implements LeaseStore.
func (s *DB) ReleaseLease(ctx context.Context, l Lease) error {
	now, err := s.leaseNow(ctx, s.db)
	if err != nil {
		return fmt.Errorf("store: release lease %s: %w", l.Name, err)
	}
	if _, err := s.db.ExecContext(ctx, `UPDATE leases SET expires_at = ? WHERE name = ? AND holder = ? AND epoch = ?`,
		unix(now)-1, l.Name, l.Holder, l.Epoch); err != nil {
		return fmt.Errorf("store: release lease %s: %w", l.Name, err)
	}
	return nil
}

// ListLeases implements LeaseStore.
func (s *DB) ListLeases(ctx context.Context, prefix string) ([]Lease, error) {
	esc := strings.NewReplacer(`\`, `\\`, `%`, `\%`, `_`, `\_`).Replace(prefix)
	rows, err := s.db.QueryContext(ctx,
		`SELECT name, holder, epoch, expires_at FROM leases WHERE name LIKE ? ESCAPE '\' ORDER BY name`, esc+"%")
	if err != nil {
		return nil, fmt.Errorf("store: list leases: %w", err)
	}
	defer rows.Close()
	out := []Lease{}
	for rows.Next() {
		l, err := scanLease(rows)
		if err != nil {
			return nil, fmt.Errorf("store: list leases: %w", err)
		}
		out = append(out, l)
	}
	return out, rows.Err()
}

// leaseNow is the time leases are measured by: on PostgreSQL the
// database's clock, which every replica reads alike whatever its own
// clock says; on SQLite (one machine) the clock they share.
func (s *DB) leaseNow(ctx context.Context, q interface {
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
}) (time.Time, error) {
	if s.d.name != "postgres" {
		return time.Now(), nil
	}
	var ms int64
	if err := q.QueryRowContext(ctx,
		`SELECT CAST(EXTRACT(EPOCH FROM clock_timestamp()) * 1000 AS BIGINT)`).Scan(&ms); err != nil {
		return time.Time{}, err
	}
	return time.UnixMilli(ms), nil
}

func scanLease(r scanner) (Lease, error) {
	var l Lease
	var exp int64
	if err := r.Scan(&l.Name, &l.Holder, &l.Epoch, &exp); err != nil {
		return Lease{}, err
	}
	l.Expires = fromUnix(exp)
	return l, nil
}

// checkFence refuses, with ErrFenced, a write whose ctx carries a fence
// that no longer holds; call it inside the write's transaction.
//
// On PostgreSQL the check share-locks the lease row: a takeover (which
// updates the row) waits for the write's commit, so no write of an old
// term can land after its successor's first. SQLite runs one write
// transaction at a time, which gives the same order.
func (s *DB) checkFence(ctx context.Context, tx *sql.Tx) error {
	f, ok := FenceFrom(ctx)
	if !ok {
		return nil
	}
	now, err := s.leaseNow(ctx, tx)
	if err != nil {
		return fmt.Errorf("store: check lease %s: %w", f.Lease, err)
	}
	var one int
	err = tx.QueryRowContext(ctx,
		`SELECT 1 FROM leases WHERE name = ? AND holder = ? AND epoch = ? AND expires_at > ?`+s.d.forShare,
		f.Lease, f.Holder, f.Epoch, unix(now)).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return fmt.Errorf("%w (%s, epoch %d)", ErrFenced, f.Lease, f.Epoch)
	}
	if err != nil {
		return fmt.Errorf("store: check lease %s: %w", f.Lease, err)
	}
	return nil
}

// fencedExec is db.ExecContext for the writes a singleton makes: when ctx
// carries a fence, the fence is checked in the same transaction.
func (s *DB) fencedExec(ctx context.Context, q string, args ...any) (sql.Result, error) {
	if _, ok := FenceFrom(ctx); !ok {
		return s.db.ExecContext(ctx, q, args...)
	}
	var res sql.Result
	err := s.fencedTx(ctx, func(tx *sql.Tx) error {
		var err error
		res, err = tx.ExecContext(ctx, q, args...)
		return err
	})
	return res, err
}

// fencedTx runs fn in a transaction that first checks ctx's fence.
func (s *DB) fencedTx(ctx context.Context, fn func(tx *sql.Tx) error) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback()
	if err := s.checkFence(ctx, tx); err != nil {
		return err
	}
	if err := fn(tx); err != nil {
		return err
	}
	return tx.Commit()
}
