package store

import (
	"context"
	"encoding/json"
	"fmt"
)

// Role is a node selector plus allowed logins (see hub/roles).
type Role struct {
	Name   string   `json:"name"`
	Nodes  string   `json:"nodes"`
	Logins []string `json:"logins"`
	// NoForwarding: the role refuses port forwarding (see hub/roles).
	NoForwarding bool `json:"no_forwarding,omitempty"`
	// Confirm: the role may confirm upgrades waiting on the nodes it
	// selects (see hub/roles).
	Confirm bool `json:"confirm,omitempty"`
	// Services are the service-tunnel permissions the role grants on the
	// nodes it selects: "expose", "connect" (see hub/roles).
	Services []string `json:"services,omitempty"`
}

// RoleStore persists roles (see hub/roles for what they grant).
type RoleStore interface {
	PutRole(ctx context.Context, r Role) error
	ListRoles(ctx context.Context) ([]Role, error)
	DeleteRole(ctx context.Context, name string) error
}

// PutRole implements RoleStore.
func (s *DB) PutRole(ctx context.Context, r Role) error {
	logins, _ := json.Marshal(r.Logins)
	services, _ := json.Marshal(r.Services)
	if r.Services == nil {
		services = []byte("[]")
	}
	if _, err := s.db.ExecContext(ctx,
		`INSERT INTO roles (name, nodes, logins, forwarding, confirm, services) VALUES (?,?,?,?,?,?)
		ON CONFLICT (name) DO UPDATE SET nodes = excluded.nodes, logins = excluded.logins, `+
			`forwarding = excluded.forwarding, confirm = excluded.confirm, services = excluded.services`,
		r.Name, r.Nodes, string(logins), !r.NoForwarding, r.Confirm, string(services)); err != nil {
		return fmt.Errorf("store: put role %q: %w", r.Name, err)
	}
	return nil
}

// ListRoles implements RoleStore.
func (s *DB) ListRoles(ctx context.Context) ([]Role, error) {
	rows, err := s.db.QueryContext(ctx,
		`SELECT name, nodes, logins, forwarding, confirm, services FROM roles ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list roles: %w", err)
	}
	defer rows.Close()
	out := []Role{}
	for rows.Next() {
		var r Role
		var logins, services string
		var forwarding bool
		if err := rows.Scan(&r.Name, &r.Nodes, &logins, &forwarding, &r.Confirm, &services); err != nil {
			return nil, err
		}
		r.NoForwarding = !forwarding
		if err := json.Unmarshal([]byte(logins), &r.Logins); err != nil {
			return nil, fmt.Errorf("store: role %q logins: %w", r.Name, err)
		}
		if services != "[]" {
			if err := json.Unmarshal([]byte(services), &r.Services); err != nil {
				return nil, fmt.Errorf("store: role %q services: %w", r.Name, err)
			}
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// DeleteRole implements RoleStore.
func (s *DB) DeleteRole(ctx context.Context, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM roles WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("store: delete role %q: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return fmt.Errorf("store: role %q: %w", name, ErrNotFound)
	}
	return nil
}
