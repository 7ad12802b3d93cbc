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
	inTx  bool // a transaction is open: its statements are never retried
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
	return st, c.wrap(err, !c.inTx)
}

func (c *pgConn) ExecContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Result, error) {
	r, err := c.Conn.ExecContext(ctx, rebind(q), args)
	return r, c.wrap(err, !c.inTx)
}

func (c *pgConn) QueryContext(ctx context.Context, q string, args []driver.NamedValue) (driver.Rows, error) {
	r, err := c.Conn.QueryContext(ctx, rebind(q), args)
	return r, c.wrap(err, !c.inTx)
}

func (c *pgConn) BeginTx(ctx context.Context, opts driver.TxOptions) (driver.Tx, error) {
	tx, err := c.Conn.BeginTx(ctx, opts)
	if err != nil {
		return nil, c.wrap(err, true)
	}
	c.inTx = true
	return &pgTx{Tx: tx, c: c}, nil
}

// pgTx notes the end of its transaction on its connection.
type pgTx struct {
	driver.Tx
	c *pgConn
}

func (t *pgTx) Commit() error {
	t.c.inTx = false
	return t.c.wrap(t.Tx.Commit(), false)
}

func (t *pgTx) Rollback() error {
	t.c.inTx = false
	return t.Tx.Rollback()
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
// connection. A statement outside a transaction (retryable) that met a
// session the server had ended (a restart ends every pooled one; the
// statement did not run) becomes driver.ErrBadConn too: the pool drops the
// connection and retries, so only a server that is still down fails the
// call.
func (c *pgConn) wrap(err error, retryable bool) error {
	if err == nil || errors.Is(err, driver.ErrBadConn) || errors.Is(err, context.Canceled) ||
		errors.Is(err, context.DeadlineExceeded) {
		return err
	}
	code := pgCode(err)
	terminated := code == "57P01" || code == "57P02" || code == "57P03"
	if retryable && (terminated || c.Conn.Conn().IsClosed() && pgconn.SafeToRetry(err)) {
		return driver.ErrBadConn
	}
	if c.Conn.Conn().IsClosed() || strings.HasPrefix(code, "08") || terminated {
		return &UnreachableError{Where: c.where, Err: err}
	}
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		return &UnreachableError{Where: c.where, Err: err}
	}
	return err
}
