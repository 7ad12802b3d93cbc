package notify

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// Channel is the PostgreSQL notification channel of the change feed.
const Channel = "tether_changes"

// PGNudger nudges over PostgreSQL LISTEN/NOTIFY. Nudges carry no payload:
// the feed in the store is what is read.
type PGNudger struct {
	// Connect opens a dedicated connection (LISTEN holds it).
	Connect func(ctx context.Context) (*pgx.Conn, error)
	// Exec runs a statement on any pooled connection (NOTIFY).
	Exec func(ctx context.Context, sql string) error
}

// NewPGNudger returns a nudger for the database at dsn; exec sends NOTIFY
// through the store's own pool.
func NewPGNudger(dsn string, exec func(ctx context.Context, sql string) error) *PGNudger {
	return &PGNudger{
		Connect: func(ctx context.Context) (*pgx.Conn, error) { return pgx.Connect(ctx, dsn) },
		Exec:    exec,
	}
}

// Nudge implements Nudger.
func (p *PGNudger) Nudge(ctx context.Context) error {
	return p.Exec(ctx, "NOTIFY "+Channel)
}

// Listen implements Nudger.
func (p *PGNudger) Listen(ctx context.Context, fn func()) error {
	conn, err := p.Connect(ctx)
	if err != nil {
		return fmt.Errorf("notify: connect to listen: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if _, err := conn.Exec(ctx, "LISTEN "+Channel); err != nil {
		return fmt.Errorf("notify: listen: %w", err)
	}
	// Whatever was sent before LISTEN took effect is read now.
	fn()
	for {
		if _, err := conn.WaitForNotification(ctx); err != nil {
			return fmt.Errorf("notify: wait for notification: %w", err)
		}
		fn()
	}
}
