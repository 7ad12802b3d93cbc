package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"
)

// Service is a service tunnel (see hub/service): a node's allow-listed TCP
// port published under a name, and the nodes that consume it.
type Service struct {
	Name string
	// Origin is the hub ID of the hub where the service was created; Target
	// and every binding's Consumer are named as that hub names them.
	Origin string
	Target string
	Port   uint16
	// Generation grows with every change at the origin.
	Generation int64
	Bindings   []ServiceBinding
	CreatedBy  string
	CreatedAt  time.Time
	UpdatedAt  time.Time
}

// ServiceBinding is one consumer of a service: node Consumer listens on
// 127.0.0.1:Port and carries what it accepts to the service.
type ServiceBinding struct {
	Consumer  string
	Port      uint16
	CreatedBy string
	CreatedAt time.Time
}

// ServiceStore keeps service tunnels.
type ServiceStore interface {
	// UpdateService reads service name (nil if there is none) and stores
	// what f returns in the same transaction: a service replaces the row
	// and all its bindings, nil deletes it (if it existed). An error from f
	// changes nothing and is returned as it is.
	UpdateService(ctx context.Context, name string, f func(cur *Service) (*Service, error)) (*Service, error)
	// GetService returns service name (ErrNotFound if there is none).
	GetService(ctx context.Context, name string) (Service, error)
	// ListServices returns every service with its bindings, by name.
	ListServices(ctx context.Context) ([]Service, error)
}

// UpdateService implements ServiceStore.
func (s *DB) UpdateService(ctx context.Context, name string, f func(cur *Service) (*Service, error)) (*Service, error) {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return nil, fmt.Errorf("store: update service %s: %w", name, err)
	}
	defer tx.Rollback()
	var cur *Service
	sv, err := getService(ctx, tx, name, s.d.forUpdate)
	switch {
	case err == nil:
		cur = &sv
	case !errors.Is(err, ErrNotFound):
		return nil, err
	}
	next, err := f(cur)
	if err != nil {
		return nil, err
	}
	if cur != nil {
		// Bindings go with the row (ON DELETE CASCADE), deleted explicitly
		// too so nothing depends on foreign keys being enforced.
		if _, err := tx.ExecContext(ctx, `DELETE FROM service_bindings WHERE service = ?`, name); err != nil {
			return nil, fmt.Errorf("store: update service %s: %w", name, err)
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM services WHERE name = ?`, name); err != nil {
			return nil, fmt.Errorf("store: update service %s: %w", name, err)
		}
	}
	if next != nil {
		if next.Name != name {
			return nil, fmt.Errorf("store: update service %s: the update renames it to %q", name, next.Name)
		}
		if _, err := tx.ExecContext(ctx,
			`INSERT INTO services (name, origin, target, port, generation, created_by, created_at, updated_at)
			VALUES (?,?,?,?,?,?,?,?)`, next.Name, next.Origin, next.Target, int(next.Port), next.Generation, next.CreatedBy,
			unix(next.CreatedAt), unix(next.UpdatedAt)); err != nil {
			return nil, fmt.Errorf("store: store service %s: %w", name, err)
		}
		for _, b := range next.Bindings {
			if _, err := tx.ExecContext(ctx,
				`INSERT INTO service_bindings (service, consumer, port, created_by, created_at) VALUES (?,?,?,?,?)`,
				name, b.Consumer, int(b.Port), b.CreatedBy, unix(b.CreatedAt)); err != nil {
				return nil, fmt.Errorf("store: service %s: binding of %s: %w", name, b.Consumer, err)
			}
		}
	}
	if err := tx.Commit(); err != nil {
		return nil, fmt.Errorf("store: update service %s: %w", name, err)
	}
	return next, nil
}

type queryer interface {
	QueryRowContext(ctx context.Context, q string, args ...any) *sql.Row
	QueryContext(ctx context.Context, q string, args ...any) (*sql.Rows, error)
}

func getService(ctx context.Context, q queryer, name, lock string) (Service, error) {
	var sv Service
	var port int
	var created, updated int64
	err := q.QueryRowContext(ctx,
		`SELECT name, origin, target, port, generation, created_by, created_at, updated_at FROM services `+
			`WHERE name = ?`+lock, name).
		Scan(&sv.Name, &sv.Origin, &sv.Target, &port, &sv.Generation, &sv.CreatedBy, &created, &updated)
	if errors.Is(err, sql.ErrNoRows) {
		return Service{}, fmt.Errorf("store: service %q: %w", name, ErrNotFound)
	}
	if err != nil {
		return Service{}, fmt.Errorf("store: get service %s: %w", name, err)
	}
	sv.Port, sv.CreatedAt, sv.UpdatedAt = uint16(port), fromUnix(created), fromUnix(updated)
	bs, err := listBindings(ctx, q, `WHERE service = ?`, name)
	if err != nil {
		return Service{}, err
	}
	sv.Bindings = bs[name]
	return sv, nil
}

func listBindings(ctx context.Context, q queryer, where string, args ...any) (map[string][]ServiceBinding, error) {
	rows, err := q.QueryContext(ctx,
		`SELECT service, consumer, port, created_by, created_at FROM service_bindings `+where+` ORDER BY service, consumer`,
		args...)
	if err != nil {
		return nil, fmt.Errorf("store: list service bindings: %w", err)
	}
	defer rows.Close()
	out := map[string][]ServiceBinding{}
	for rows.Next() {
		var svc string
		var b ServiceBinding
		var port int
		var created int64
		if err := rows.Scan(&svc, &b.Consumer, &port, &b.CreatedBy, &created); err != nil {
			return nil, fmt.Errorf("store: list service bindings: %w", err)
		}
		b.Port, b.CreatedAt = uint16(port), fromUnix(created)
		out[svc] = append(out[svc], b)
	}
	return out, rows.Err()
}

// GetService implements ServiceStore.
func (s *DB) GetService(ctx context.Context, name string) (Service, error) {
	return getService(ctx, s.db, name, "")
}

// ListServices implements ServiceStore.
func (s *DB) ListServices(ctx context.Context) ([]Service, error) {
	rows, err := s.hot().QueryContext(ctx,
		`SELECT name, origin, target, port, generation, created_by, created_at, updated_at FROM services ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("store: list services: %w", err)
	}
	defer rows.Close()
	out := []Service{}
	for rows.Next() {
		var sv Service
		var port int
		var created, updated int64
		if err := rows.Scan(&sv.Name, &sv.Origin, &sv.Target, &port, &sv.Generation, &sv.CreatedBy, &created,
			&updated); err != nil {
			return nil, fmt.Errorf("store: list services: %w", err)
		}
		sv.Port, sv.CreatedAt, sv.UpdatedAt = uint16(port), fromUnix(created), fromUnix(updated)
		out = append(out, sv)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list services: %w", err)
	}
	rows.Close()
	bs, err := listBindings(ctx, s.hot(), "")
	if err != nil {
		return nil, err
	}
	for i := range out {
		out[i].Bindings = bs[out[i].Name]
	}
	return out, nil
}
