package store

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

func keyFingerprints(o Operator) []string {
	var out []string
	for _, k := range o.Keys {
		out = append(out, k.Fingerprint)
	}
	return out
}

// An operator holds several keys; each key names one operator; removing a
// key revokes it, and the last key cannot be removed.
func TestOperatorKeys(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		t.Parallel()
		ctx := context.Background()
		s := openTest(t)
		t0 := time.Unix(1000, 0)
		if err := s.AddOperator(ctx, Operator{Name: "alice", Roles: []string{"all"}, CreatedAt: t0,
			Keys: []OperatorKey{
				{PublicKey: "k1", Fingerprint: "f1"}, {PublicKey: "k2", Fingerprint: "f2", AddedAt: t0.Add(time.Second)},
			}}); err != nil {
			t.Fatal(err)
		}
		if err := s.AddOperator(ctx, Operator{Name: "bob", PublicKey: "k3", Fingerprint: "f3", CreatedAt: t0}); err != nil {
			t.Fatal(err)
		}
		steps := []struct {
			name string
			do   func() error
			want error
		}{
			{"key of another operator", func() error {
				return s.AddOperatorKey(ctx, "alice", OperatorKey{
					PublicKey: "k3", Fingerprint: "f3",
				})
			}, ErrNameTaken},
			{"key to missing operator", func() error {
				return s.AddOperatorKey(ctx, "carol", OperatorKey{
					PublicKey: "k9", Fingerprint: "f9",
				})
			}, ErrNotFound},
			{"third key", func() error {
				return s.AddOperatorKey(ctx, "alice", OperatorKey{
					PublicKey: "k4", Fingerprint: "f4", AddedAt: t0.Add(2 * time.Second),
				})
			}, nil},
			{"remove unknown key", func() error { return s.RemoveOperatorKey(ctx, "alice", "f3") }, ErrNotFound},
			{"remove key", func() error { return s.RemoveOperatorKey(ctx, "alice", "f1") }, nil},
			{"remove bob's only key", func() error { return s.RemoveOperatorKey(ctx, "bob", "f3") }, ErrLastKey},
			{"set roles", func() error { return s.SetOperatorRoles(ctx, "alice", []string{"ops", "db"}) }, nil},
			{"set roles of missing", func() error { return s.SetOperatorRoles(ctx, "carol", []string{"ops"}) }, ErrNotFound},
		}
		for _, st := range steps {
			if err := st.do(); !errors.Is(err, st.want) || (st.want == nil && err != nil) {
				t.Fatalf("%s: %v, want %v", st.name, err, st.want)
			}
		}
		ops, err := s.ListOperators(ctx)
		if err != nil || len(ops) != 2 {
			t.Fatalf("list: %v %v", ops, err)
		}
		a := ops[0]
		if got := keyFingerprints(a); !slices.Equal(got, []string{"f2", "f4"}) || a.Fingerprint != "f2" ||
			a.PublicKey != "k2" {
			t.Errorf("alice's keys = %v (first %s), want [f2 f4] (first f2)", got, a.Fingerprint)
		}
		if !slices.Equal(a.Roles, []string{"ops", "db"}) {
			t.Errorf("alice's roles = %v", a.Roles)
		}
		if revoked, _ := s.ListRevokedKeys(ctx); !slices.Equal(revoked, []string{"k1"}) {
			t.Errorf("revoked = %v, want [k1]", revoked)
		}
		if err := s.RemoveOperator(ctx, "alice"); err != nil {
			t.Fatal(err)
		}
		if revoked, _ := s.ListRevokedKeys(ctx); !slices.Equal(revoked, []string{"k1", "k2", "k4"}) {
			t.Errorf("revoked after removing alice = %v, want [k1 k2 k4]", revoked)
		}
		// A removed operator's key can be registered again, and is trusted again.
		if err := s.AddOperatorKey(ctx, "bob", OperatorKey{PublicKey: "k2", Fingerprint: "f2"}); err != nil {
			t.Fatal(err)
		}
		if revoked, _ := s.ListRevokedKeys(ctx); !slices.Equal(revoked, []string{"k1", "k4"}) {
			t.Errorf("revoked after re-adding k2 = %v, want [k1 k4]", revoked)
		}
	})
}

// A data dir from before several keys per operator upgrades: every operator
// keeps its key and roles.
func TestMigrateOperatorKeys(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	path := dataDirAt(t, 6,
		`INSERT INTO operators (name, public_key, fingerprint, created_at, roles) VALUES ('alice', 'ka', 'fa', `+
			`10, '["ops"]'), ('bob', 'kb', 'fb', 20, '["all"]')`)
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ops, err := s.ListOperators(ctx)
	if err != nil || len(ops) != 2 {
		t.Fatalf("list: %v %v", ops, err)
	}
	for i, want := range []struct{ name, key, fp, role string }{{"alice", "ka", "fa", "ops"}, {"bob", "kb", "fb", "all"}} {
		o := ops[i]
		if o.Name != want.name || len(o.Keys) != 1 || o.Keys[0].PublicKey != want.key || o.Fingerprint != want.fp ||
			!slices.Equal(o.Roles, []string{want.role}) || !o.Keys[0].AddedAt.Equal(o.CreatedAt) {
			t.Errorf("operator %d after migration: %+v", i, o)
		}
	}
	// The keys follow the renamed table: removing the operator takes them.
	if err := s.RemoveOperator(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if err := s.AddOperator(ctx, Operator{Name: "carol", PublicKey: "ka", Fingerprint: "fa"}); err != nil {
		t.Fatalf("alice's key after removing alice: %v", err)
	}
}
