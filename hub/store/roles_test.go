package store

import (
	"context"
	"testing"
)

// Roles stored before roles could refuse port forwarding keep what they
// granted: forwarding allowed; a role put with NoForwarding keeps it.
func TestRoleForwardingMigration(t *testing.T) {
	ctx := context.Background()
	path := dataDirAt(t, 8, `INSERT INTO roles (name, nodes, logins) VALUES ('ops', 'site=lab', '["root"]')`)
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.PutRole(ctx, Role{Name: "audit", Nodes: "*", Logins: []string{"audit"}, NoForwarding: true}); err != nil {
		t.Fatal(err)
	}
	rs, err := s.ListRoles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, r := range rs {
		got[r.Name] = r.NoForwarding
	}
	if nf, ok := got["ops"]; !ok || nf {
		t.Errorf("upgraded role ops: present %v, NoForwarding %v; want forwarding allowed", ok, nf)
	}
	if !got["audit"] {
		t.Errorf("role audit lost NoForwarding: %+v", rs)
	}
}
