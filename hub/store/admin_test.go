package store

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"
)

// TestAdminMigrationRenamesUserRole: a role named "admin" made before admin
// became a built-in role is renamed with its holders and API tokens, so an
// upgrade never turns them into hub admins; the rename is audited.
func TestAdminMigrationRenamesUserRole(t *testing.T) {
	ctx := context.Background()
	path := dataDirAt(t, 4,
		`INSERT INTO roles (name, nodes, logins) VALUES ('admin', 'site=lab', '["ubuntu"]')`,
		`INSERT INTO operators (name, public_key, fingerprint, created_at, roles) VALUES ('bob', 'k', 'f', `+
			`1, '["ops","admin"]')`,
		`INSERT INTO api_tokens (id, secret_hash, role, created_at) VALUES ('t1', x'00', 'admin', 1)`,
	)

	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	roles, err := s.ListRoles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := fmt.Sprint(roles); got != "[{admin * [*] false false []} {admin-legacy site=lab [ubuntu] false false []} "+
		"{all * [*] false false []}]" {
		t.Fatalf("roles after upgrade: %s", got)
	}
	ops, _ := s.ListOperators(ctx)
	if len(ops) != 1 || !slices.Equal(ops[0].Roles, []string{"ops", "admin-legacy"}) {
		t.Fatalf("operator roles after upgrade: %+v", ops)
	}
	tok, err := s.GetAPIToken(ctx, "t1")
	if err != nil || tok.Role != "admin-legacy" {
		t.Fatalf("API token after upgrade: %+v %v", tok, err)
	}
	events, _ := s.ListAudit(ctx, AuditFilter{})
	if len(events) != 1 || events[0].Kind != "role_rename" {
		t.Fatalf("audit after upgrade: %+v", events)
	}
}

func TestAdminValidFrom(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		path := b.newLoc(t)
		s, err := b.open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		if vf, err := s.AdminValidFrom(ctx); err != nil || !vf.IsZero() {
			t.Fatalf("fresh store: %v %v", vf, err)
		}
		want := time.Now().Truncate(time.Second).UTC()
		for _, at := range []time.Time{want.Add(-time.Hour), want} {
			if err := s.SetAdminValidFrom(ctx, at); err != nil {
				t.Fatal(err)
			}
		}
		s.Close()
		s, err = b.open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if vf, err := s.AdminValidFrom(ctx); err != nil || !vf.Equal(want) {
			t.Fatalf("after reopen: %v %v; want %v", vf, err, want)
		}
	})
}
