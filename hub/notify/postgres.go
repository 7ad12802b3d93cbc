package notify

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/tether-dev/tether/hub/store"
)

// PGNudger listens for the PostgreSQL notifications the store sends, at
// commit, with every change it records (store.ChangesChannel). They carry
// nothing: the feed in the store is what is read.
type PGNudger struct {
	// Connect opens the dedicated connection LISTEN holds.
	Connect func(ctx context.Context) (*pgx.Conn, error)
}

// NewPGNudger returns a nudger for the database at dsn (the hub's --store
// URL; a password comes from PGPASSWORD or the password file, as for the
// store's own connections).
func NewPGNudger(dsn string) *PGNudger {
	return &PGNudger{Connect: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, dsn) }}
}

// Nudge implements Nudger: the store already notified, in the change's
// own transaction.
func (p *PGNudger) Nudge(context.Context) error { return nil }

// Listen implements Nudger.
func (p *PGNudger) Listen(ctx context.Context, fn func()) error {
	conn, err := p.Connect(ctx)
	if err != nil {
		return fmt.Errorf("notify: connect to listen: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+store.ChangesChannel); err != nil {
		return fmt.Errorf("notify: listen: %w", err)
	}
	// Whatever was recorded before LISTEN took effect is read now.
	fn()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("notify: wait for notification: %w", err)
		}
		fn()
	}
}
