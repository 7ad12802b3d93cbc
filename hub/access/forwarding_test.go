package access

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/tether-dev/tether/hub/store"
)

// A role created with --forwarding=false reaches the node as OpenSSH's
// no-port-forwarding key option (when no other role of the operator that
// selects the node allows forwarding) and as no_forwarding principals; a
// role stored with the default allows it.
func TestForwardingPerRole(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.st.PutRole(ctx, store.Role{
		Name: "berlin-ops", Nodes: "site=berlin", Logins: []string{"ops"}, NoForwarding: true,
	}); err != nil {
		t.Fatal(err)
	}
	rs, err := f.st.ListRoles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if i := slices.IndexFunc(rs, func(r store.Role) bool { return r.Name == "berlin-ops" }); i < 0 || !rs[i].NoForwarding {
		t.Fatalf("stored roles %+v: berlin-ops lost NoForwarding", rs)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	snap := f.door.Snapshot()
	berlin := map[string]string{"site": "berlin"}
	keys := snap.KeysFor(berlin)
	for _, k := range keys {
		alice := strings.HasSuffix(k, " alice")
		if got := strings.HasPrefix(k, "no-port-forwarding,"); got != alice {
			t.Errorf("key line %q: no-port-forwarding %v, want %v", k, got, alice)
		}
	}
	if alice := keys[0]; !strings.HasPrefix(alice, `no-port-forwarding,tether-logins="ops" ssh-ed25519 `) {
		t.Errorf("alice's line %q", alice)
	}
	if got := snap.NoForwardingFor(berlin); !slices.Equal(got, []string{"tether:berlin-ops:ops"}) {
		t.Errorf("NoForwardingFor(berlin) = %v", got)
	}
	if got := snap.NoForwardingFor(map[string]string{"site": "munich"}); len(got) != 0 {
		t.Errorf("NoForwardingFor(munich) = %v, want none", got)
	}
}
