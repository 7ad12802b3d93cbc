package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// AdminStore keeps what decides which admin client certificates the hub
// accepts.
type AdminStore interface {
	// AdminValidFrom is when the last `tether ca revoke-admin` took effect:
	// admin certificates issued before it are refused. Zero if never.
	AdminValidFrom(ctx context.Context) (time.Time, error)
	// SetAdminValidFrom records a new revocation time (durably).
	SetAdminValidFrom(ctx context.Context, t time.Time) error
}

// migrationAdmin adds the hub-wide settings (admin_valid_from) and the
// built-in role "admin" (roles.BuiltinAdmin). A role of that name made before it was built in is
// renamed to "admin-legacy" (with its holders and API tokens), so an upgrade
// never silently turns operators into hub admins; the rename is audited.
const migrationAdmin = `CREATE TABLE settings (
		key TEXT PRIMARY KEY,
		value TEXT NOT NULL
	);
	INSERT INTO audit (at, kind, result, detail)
		SELECT CAST(strftime('%s', 'now') AS INTEGER) * 1000, 'role_rename', 'ok',
			'role "admin" renamed to "admin-legacy" on upgrade: "admin" is now the built-in role of hub admins'
		WHERE EXISTS (SELECT 1 FROM roles WHERE name = 'admin');
	UPDATE roles SET name = 'admin-legacy' WHERE name = 'admin';
	UPDATE operators SET roles = (SELECT json_group_array(CASE WHEN value = 'admin' THEN 'admin-legacy' ELSE value END) ` +
	`FROM json_each(operators.roles))
		WHERE EXISTS (SELECT 1 FROM json_each(operators.roles) WHERE value = 'admin');
	UPDATE api_tokens SET role = 'admin-legacy' WHERE role = 'admin';
	UPDATE jobs SET role = 'admin-legacy' WHERE role = 'admin';
	INSERT INTO roles (name, nodes, logins) VALUES ('admin', '*', '["*"]');`

const settingAdminValidFrom = "admin_valid_from"

// AdminValidFrom implements AdminStore.
func (s *DB) AdminValidFrom(ctx context.Context) (time.Time, error) {
	var v string
	err := s.db.QueryRowContext(ctx, `SELECT value FROM settings WHERE key = ?`, settingAdminValidFrom).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, nil
	}
	if err != nil {
		return time.Time{}, fmt.Errorf("store: read admin valid-from: %w", err)
	}
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		return time.Time{}, fmt.Errorf("store: admin valid-from %q: %w", v, err)
	}
	return fromUnix(ms), nil
}

// SetAdminValidFrom implements AdminStore.
func (s *DB) SetAdminValidFrom(ctx context.Context, t time.Time) error {
	if _, err := s.db.ExecContext(ctx, `INSERT INTO settings (key, value) VALUES (?, ?)
		ON CONFLICT (key) DO UPDATE SET value = `+
		`excluded.value`, settingAdminValidFrom, strconv.FormatInt(unix(t), 10)); err != nil {
		return fmt.Errorf("store: set admin valid-from: %w", err)
	}
	return nil
}
