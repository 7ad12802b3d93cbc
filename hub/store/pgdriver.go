package store

import (
	"context"
	"database/sql/driver"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/stdlib"
)

// pgConnector hands database/sql pgx connections that speak the store's
// SQL: `?` placeholders rebound to `$n`, Go bools stored as 0/1 (the
// schema's INTEGER flags, as in SQLite), and connection failures reported
// as UnreachableError naming the server.
type pgConnector struct {
	inner driver.Connector
	where string
}

func newPGConnector(cfg *pgx.ConnConfig, where string) *pgConnector {
	return &pgConnector{inner: stdlib.GetConnector(*cfg), where: where}
}

func (c *pgConnector) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.inner.Connect(ctx)
	if err != nil {
		if ctx.Err() != nil {
			return nil, err
		}
		return nil, &UnreachableError{Where: c.where, Err: err}
	}
	return &pgConn{Conn: conn.(*stdlib.Conn), where: c.where}, nil
}

func (c *pgConnector) Driver() driver.Driver { return c.inner.Driver() }

// pgConn wraps one pgx connection; what it does not override (ping,
// session reset, validity: what lets the pool drop dead connections) is
// pgx's.
type pgConn struct {
	*stdlib.Conn
	where string
}

var (
	_ driver.ExecerContext      = (*pgConn)(nil)
	_ driver.QueryerContext     = (*pgConn)(nil)
	_ driver.ConnPrepareContext = (*pgConn)(nil)
	_ driver.ConnBeginTx        = (*pgConn)(nil)
	_ driver.NamedValueChecker  = (*pgConn)(nil)
	_ driver.SessionResetter    = (*pgConn)(nil)
	_ driver.Pinger             = (*pgConn)(nil)
)

func (c *pgConn) Prepare(q string) (driver.Stmt, error) {
	return c.PrepareContext(context.Background(), q)
}

func (c *pgConn) PrepareContext(ctx context.Context, q string) (driver.Stmt, error) {
	st, err := c.Conn.PrepareContext(ctx, rebind(q))
	return st, c.wrap(err)
}

func (c *pgConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.Conn.ExecContext(ctx, rebind(q), args)
	return r, c.wrap(err)
}

func (c *pgConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := c.Conn.QueryContext(ctx, rebind(q), args)
	return r, c.wrap(err)
}

func (c *pgConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.BeginTx(ctx, opts)
	return tx, c.wrap(err)
}

// CheckNamedValue stores a Go bool as 1 or 0 (the schema's flags are
// INTEGER in both dialects, so rows scan the same) and a nil []byte as an
// empty one (SQLite binds nil blobs as empty, and the BYTEA columns are NOT
// NULL). Everything else goes to pgx as it is.
func (c *pgConn) CheckNamedValue(nv *driver.NamedValue) error {
	switch v := nv.Value.(type) {
	case bool:
		if v {
			nv.Value = int64(1)
		} else {
			nv.Value = int64(0)
		}
	case []byte:
		if v == nil {
			nv.Value = []byte{}
		}
	}
	return nil
}

// wrap reports a failure of the connection itself (the server went away,
// restarted, or refused us) as UnreachableError; SQL errors stay as they
// are. driver.ErrBadConn stays bare so database/sql retries on a fresh
// connection.
func (c *pgConn) wrap(err error) error {
	if err == nil || errors.Is(err, driver.ErrBadConn) || errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	code := pgCode(err)
	if c.Conn.Conn().IsClosed() || strings.HasPrefix(code, "08") || code == "57P01" || code == "57P02" || code == "57P03" {
		return &UnreachableError{Where: c.where, Err: err}
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return &UnreachableError{Where: c.where, Err: err}
	}
	return err
}
