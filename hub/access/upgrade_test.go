package access

import (
	"context"
	"errors"
	"testing"

	"github.com/tether-dev/tether/hub/store"
)

// Confirming an upgrade is its own grant: reaching a node (even with any
// login) is not enough; the role must select the node and carry confirm.
// Rolling upgrades out is the admin's.
func TestAuthorizeConfirmAndUpgrade(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.st.PutRole(ctx, store.Role{
		Name: "berlin-lead", Nodes: "site=berlin", Logins: []string{"audit"}, Confirm: true,
	}); err != nil {
		t.Fatal(err)
	}
	if err := f.st.SetOperatorRoles(ctx, "nobody", []string{"berlin-lead"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	berlin := store.Node{Name: "berlin-1", Labels: map[string]string{"site": "berlin"}}
	munich := store.Node{Name: "munich-1", Labels: map[string]string{"site": "munich"}}
	for _, tc := range []struct {
		name   string
		caller Caller
		node   store.Node
		ok     bool
	}{
		{"admin", Caller{Admin: true, Name: "admin"}, munich, true},
		{"token with confirm", Caller{Role: "berlin-lead", Name: "apitoken:x"}, berlin, true},
		{"token with confirm, other node", Caller{Role: "berlin-lead", Name: "apitoken:x"}, munich, false},
		{"token reaching everything, no confirm", Caller{Role: "everything", Name: "apitoken:y"}, berlin, false},
		{"operator with confirm", Caller{Operator: "nobody", Name: "operator:nobody"}, berlin, true},
		{"operator with confirm, other node", Caller{Operator: "nobody", Name: "operator:nobody"}, munich, false},
		{"operator without confirm", Caller{Operator: "root", Name: "operator:root"}, berlin, false},
		{"onboarding credential", Caller{Onboarding: true, Admin: true, Name: "onboarding:x"}, berlin, false},
		{"no identity", Caller{}, berlin, false},
	} {
		err := f.door.AuthorizeConfirm(tc.caller, tc.node)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrDenied)) {
			t.Errorf("%s: AuthorizeConfirm = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	if err := f.door.AuthorizeUpgrade(Caller{Admin: true}, berlin); err != nil {
		t.Errorf("admin: %v", err)
	}
	if err := f.door.AuthorizeUpgrade(Caller{Role: "everything", Name: "apitoken:y"}, berlin); !errors.Is(err, ErrDenied) {
		t.Errorf("token: %v", err)
	}
}
