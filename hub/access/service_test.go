package access

import (
	"context"
	"errors"
	"testing"

	"github.com/tether-dev/tether/hub/roles"
	"github.com/tether-dev/tether/hub/store"
)

// Service tunnels are their own grant: reaching a node (even with any
// login) does not let one expose its ports or make it a consumer; the role
// must select the node and carry the permission asked for.
func TestAuthorizeService(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.st.PutRole(ctx, store.Role{Name: "berlin-links", Nodes: "site=berlin", Logins: []string{"audit"},
		Services: []string{roles.ServiceConnect}}); err != nil {
		t.Fatal(err)
	}
	if err := f.st.PutRole(ctx, store.Role{Name: "db-owner", Nodes: "role=db", Logins: []string{"audit"},
		Services: []string{roles.ServiceExpose, roles.ServiceConnect}}); err != nil {
		t.Fatal(err)
	}
	if err := f.st.SetOperatorRoles(ctx, "nobody", []string{"berlin-links"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	berlin := store.Node{Name: "berlin-1", Labels: map[string]string{"site": "berlin"}}
	db := store.Node{Name: "db-1", Labels: map[string]string{"role": "db"}}
	for _, tc := range []struct {
		name   string
		caller Caller
		perm   string
		node   store.Node
		ok     bool
	}{
		{"admin exposes", Caller{Admin: true, Name: "admin"}, roles.ServiceExpose, berlin, true},
		{"token exposes its db", Caller{Role: "db-owner", Name: "apitoken:x"}, roles.ServiceExpose, db, true},
		{"token exposes another node", Caller{Role: "db-owner", Name: "apitoken:x"}, roles.ServiceExpose, berlin, false},
		{"token with connect only exposes", Caller{Role: "berlin-links", Name: "apitoken:y"}, roles.ServiceExpose,
			berlin, false},
		{"token with connect connects", Caller{Role: "berlin-links", Name: "apitoken:y"}, roles.ServiceConnect, berlin, true},
		{"token reaching everything", Caller{Role: "everything", Name: "apitoken:z"}, roles.ServiceConnect, berlin, false},
		{"operator with connect", Caller{Operator: "nobody", Name: "operator:nobody"}, roles.ServiceConnect, berlin, true},
		{"operator with connect, other node", Caller{Operator: "nobody", Name: "operator:nobody"},
			roles.ServiceConnect, db, false},
		{"operator without services", Caller{Operator: "root", Name: "operator:root"}, roles.ServiceConnect, berlin, false},
		{"unknown permission", Caller{Admin: true, Name: "admin"}, "forward", berlin, false},
		{"onboarding credential", Caller{Onboarding: true, Admin: true, Name: "onboarding:x"}, roles.ServiceExpose,
			berlin, false},
		{"no identity", Caller{}, roles.ServiceConnect, berlin, false},
	} {
		err := f.door.AuthorizeService(tc.caller, tc.perm, tc.node)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrDenied)) {
			t.Errorf("%s: AuthorizeService = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
}
