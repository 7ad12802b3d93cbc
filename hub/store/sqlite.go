package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"modernc.org/sqlite" // registers the "sqlite" driver (pure Go, no cgo)
	sqlite3 "modernc.org/sqlite/lib"
)

var _ Store = (*DB)(nil)

// OpenSQLite opens (creating if needed) the database at path and migrates
// it. SQLite is the default store: one database file, WAL journal with
// synchronous=FULL so a committed write survives kill -9 and power loss.
func OpenSQLite(ctx context.Context, path string) (*DB, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	if err := private(path); err != nil {
		return nil, err
	}
	q := url.Values{}
	for _, p := range []string{"busy_timeout(10000)", "journal_mode(WAL)", "synchronous(FULL)", "foreign_keys(1)"} {
		q.Add("_pragma", p)
	}
	q.Set("_txlock", "immediate")
	// SQLite decodes %XX in URI file names; escape what a path may hold
	// that a URI would read as syntax.
	uriPath := strings.NewReplacer("%", "%25", "#", "%23", "?", "%3f").Replace(path)
	db, err := sql.Open("sqlite", "file:"+uriPath+"?"+q.Encode())
	if err != nil {
		return nil, fmt.Errorf("store: open %s: %w", path, err)
	}
	// One writer at a time is what SQLite does anyway; a single connection
	// keeps transactions simple and avoids SQLITE_BUSY between our own conns.
	db.SetMaxOpenConns(1)
	s := &DB{db: db, d: sqliteDialect}
	if err := s.migrateSQLite(ctx); err != nil {
		db.Close()
		return nil, fmt.Errorf("store: %s: %w", path, err)
	}
	return s, nil
}

// sqliteSideFiles are the files SQLite keeps beside the database: the
// write-ahead log and its shared-memory index hold recent writes, the
// rollback journal old pages.
var sqliteSideFiles = []string{"-wal", "-shm", "-journal"}

// private makes the database file 0600 before SQLite opens it, creating it
// if needed. SQLite creates its side files with the database file's mode,
// so they are 0600 too; side files an earlier hub left with a wider mode
// (a crash keeps the WAL) are narrowed as well.
func private(path string) error {
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	err = f.Chmod(0o600)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	for _, side := range sqliteSideFiles {
		if err := os.Chmod(path+side, 0o600); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("store: %w", err)
		}
	}
	return nil
}

// firstOpenWait bounds how long a hub waits for the first connection to a
// database another process is opening (the busy_timeout's 10 s).
const firstOpenWait = 10 * time.Second

// firstRead reads the schema version on the store's first connection.
// Opening it switches the file to WAL, which needs the database to itself:
// SQLite answers SQLITE_BUSY at once, without its busy handler, while
// another process does the same (hub replicas sharing one new file start
// together; 6 of 40 such starts failed here). So a busy open is tried
// again, for up to firstOpenWait.
func (s *DB) firstRead(ctx context.Context) (int, error) {
	deadline := time.Now().Add(firstOpenWait)
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 200*time.Millisecond) {
		var v int
		err := s.db.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v)
		if err == nil || !isBusy(err) || time.Now().Add(pause).After(deadline) {
			return v, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(pause):
		}
	}
}

// isBusy reports whether err is SQLite's SQLITE_BUSY (any extended code).
func isBusy(err error) bool {
	var se *sqlite.Error
	return errors.As(err, &se) && se.Code()&0xff == sqlite3.SQLITE_BUSY
}

func (s *DB) migrateSQLite(ctx context.Context) error {
	v, err := s.firstRead(ctx)
	if err != nil {
		return fmt.Errorf("read schema version: %w", err)
	}
	if v > schemaVersion {
		return fmt.Errorf("database schema v%d is newer than this hub understands (v%d); upgrade the hub", v, schemaVersion)
	}
	for v < schemaVersion {
		tx, err := s.db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		// Read again under the write lock (_txlock=immediate): hub replicas
		// sharing one file may start together, and only one migrates.
		if err := tx.QueryRowContext(ctx, "PRAGMA user_version").Scan(&v); err != nil {
			tx.Rollback()
			return fmt.Errorf("read schema version: %w", err)
		}
		if v >= schemaVersion {
			tx.Rollback()
			break
		}
		if _, err := tx.ExecContext(ctx, migrations[v]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate to v%d: %w", v+1, err)
		}
		if _, err := tx.ExecContext(ctx, fmt.Sprintf("PRAGMA user_version = %d", v+1)); err != nil {
			tx.Rollback()
			return err
		}
		if err := tx.Commit(); err != nil {
			return err
		}
		v++
	}
	return nil
}

func unix(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMilli()
}

func fromUnix(ms int64) time.Time {
	if ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}

func encodeLabels(l map[string]string) string {
	if l == nil {
		l = map[string]string{}
	}
	b, _ := json.Marshal(l)
	return string(b)
}

func decodeLabels(s string) (map[string]string, error) {
	l := map[string]string{}
	if err := json.Unmarshal([]byte(s), &l); err != nil {
		return nil, fmt.Errorf("decode labels: %w", err)
	}
	return l, nil
}

func isUniqueViolation(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "UNIQUE constraint failed") || pgCode(err) == pgUniqueViolation)
}

func isForeignKeyViolation(err error) bool {
	return err != nil &&
		(strings.Contains(err.Error(), "FOREIGN KEY constraint failed") || pgCode(err) == pgForeignKeyViolation)
}

type scanner interface{ Scan(...any) error }

// IsStorageFull reports whether err is a write refused because the disk
// (or the database's size limit) is full: the one store failure an
// operator can act on without reading the hub's log.
func IsStorageFull(err error) bool {
	var se *sqlite.Error
	if errors.As(err, &se) {
		return se.Code()&0xff == sqlite3.SQLITE_FULL
	}
	if pgCode(err) == pgDiskFull {
		return true
	}
	return errors.Is(err, syscall.ENOSPC)
}
