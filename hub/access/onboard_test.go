package access

import (
	"context"
	"errors"
	"testing"

	"github.com/tether-dev/tether/hub/store"
)

// TestOnboarderMayOnlyOnboard: an onboarding credential may onboard and
// nothing else, even when a stored role happens to be named like its
// permission and selects every node; and no other caller may onboard.
func TestOnboarderMayOnlyOnboard(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.st.PutRole(ctx, store.Role{Name: RoleOnboarder, Nodes: "*", Logins: []string{"*"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	onboarder := Caller{Onboarding: true, Role: RoleOnboarder, Name: "onboarding:abcdefgh"}
	if err := f.door.AuthorizeOnboard(onboarder); err != nil {
		t.Fatalf("onboarder may not onboard: %v", err)
	}
	nodes, err := f.st.ListNodes(ctx)
	if err != nil || len(nodes) == 0 {
		t.Fatal(nodes, err)
	}
	for _, n := range nodes {
		if err := f.door.AuthorizeJob(onboarder, n); !errors.Is(err, ErrDenied) {
			t.Errorf("onboarder may run jobs on %s: %v", n.Name, err)
		}
		if err := f.door.AuthorizeList(onboarder, n); !errors.Is(err, ErrDenied) {
			t.Errorf("onboarder may list %s: %v", n.Name, err)
		}
	}
	for _, c := range []Caller{
		{Admin: true, Name: "admin"},
		{Role: RoleOnboarder, Name: "apitoken:x"}, // an API token of a role named like the permission
		{Operator: "root", Name: "operator:root"},
		{Onboarding: true, Role: "everything", Name: "onboarding:y"},
		{},
	} {
		if err := f.door.AuthorizeOnboard(c); !errors.Is(err, ErrDenied) {
			t.Errorf("AuthorizeOnboard(%+v) = %v, want denied", c, err)
		}
	}
	var nilDoor *Door // the API's door may be absent in tests; the decision needs no state
	if err := nilDoor.AuthorizeOnboard(onboarder); err != nil {
		t.Fatal(err)
	}
}
