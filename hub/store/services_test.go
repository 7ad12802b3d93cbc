package store

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestServices: a service and its bindings are stored, replaced and deleted
// in one transaction; an error from the update changes nothing; a role's
// service permissions round-trip (both backends).
func TestServices(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		s := openTest(t)
		ctx := context.Background()
		now := time.Now().UTC().Truncate(time.Millisecond)
		origin := "ab12"
		sv := Service{Name: "db", Origin: origin, Target: "n3.berlin", Port: 5432, Generation: 1, CreatedBy: "admin",
			CreatedAt: now, UpdatedAt: now,
			Bindings: []ServiceBinding{
				{Consumer: "m2.munich", Port: 15432, CreatedAt: now}, {Consumer: "a1", Port: 1, CreatedAt: now},
			}}
		if _, err := s.UpdateService(ctx, "db", func(cur *Service) (*Service, error) {
			if cur != nil {
				t.Fatalf("a new service exists: %+v", cur)
			}
			return &sv, nil
		}); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetService(ctx, "db")
		if err != nil || got.Target != "n3.berlin" || got.Port != 5432 || got.Origin != origin || !got.CreatedAt.Equal(now) ||
			len(got.Bindings) != 2 ||
			got.Bindings[0].Consumer != "a1" || got.Bindings[1].Port != 15432 {
			t.Fatalf("stored service: %+v %v", got, err)
		}
		boom := errors.New("boom")
		if _, err := s.UpdateService(ctx, "db", func(cur *Service) (*Service, error) { return nil, boom }); !errors.Is(err,
			boom) {
			t.Fatalf("update error: %v", err)
		}
		if _, err := s.UpdateService(ctx, "db", func(cur *Service) (*Service, error) {
			next := *cur
			next.Bindings = cur.Bindings[:1]
			next.Generation++
			return &next, nil
		}); err != nil {
			t.Fatal(err)
		}
		all, err := s.ListServices(ctx)
		if err != nil || len(all) != 1 || all[0].Generation != 2 || len(all[0].Bindings) != 1 {
			t.Fatalf("services after an update: %+v %v", all, err)
		}
		if _, err := s.UpdateService(ctx, "db", func(cur *Service) (*Service, error) { return nil, nil }); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetService(ctx, "db"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted service: %v", err)
		}
		if all, _ := s.ListServices(ctx); len(all) != 0 {
			t.Fatalf("services after delete: %+v", all)
		}

		if err := s.PutRole(ctx, Role{
			Name:     "links",
			Nodes:    "*",
			Logins:   []string{"x"},
			Services: []string{"expose", "connect"},
		}); err != nil {
			t.Fatal(err)
		}
		rs, _ := s.ListRoles(ctx)
		for _, r := range rs {
			if r.Name == "links" && (len(r.Services) != 2 || r.Services[1] != "connect") {
				t.Fatalf("role services: %+v", r)
			}
		}
	})
}
