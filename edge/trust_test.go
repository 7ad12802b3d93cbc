package edge

import (
	"log/slog"
	"slices"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel/control"
)

// The key lines of every hub version read right: a hub that predates
// no-port-forwarding sends none, which allows forwarding (the documented
// default for roles).
func TestParseAuthorizedKey(t *testing.T) {
	key := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(testenv.NewKey(t).Pub())))
	for _, tc := range []struct {
		name, line   string
		logins       []string
		noForwarding bool
	}{
		{"older hub, any login", key + " alice", nil, false},
		{"older hub, logins", `tether-logins="root,ubuntu" ` + key + " alice", []string{"root", "ubuntu"}, false},
		{"forwarding refused", `no-port-forwarding,tether-logins="root" ` + key + " alice", []string{"root"}, true},
		{"forwarding refused, any login", "no-port-forwarding " + key + " alice", nil, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ak, err := parseAuthorizedKey(tc.line)
			if err != nil {
				t.Fatal(err)
			}
			if ak.Name != "alice" || !slices.Equal(ak.Logins, tc.logins) || ak.NoForwarding != tc.noForwarding {
				t.Fatalf("parsed %+v, want logins %v, no forwarding %v", ak, tc.logins, tc.noForwarding)
			}
		})
	}
	if _, err := parseAuthorizedKey("not a key"); err == nil {
		t.Fatal("garbage parsed")
	}
}

// TestScopedCAs: an ancestor hub's CA none of whose keys parse grants
// nothing; a readable one keeps its principals, and a nil map still means
// "no login" (never the server's default of principal = login).
func TestScopedCAs(t *testing.T) {
	key := strings.TrimSpace(string(gossh.MarshalAuthorizedKey(testenv.NewKey(t).Pub())))
	log := slog.New(slog.DiscardHandler)
	got := scopedCAs([]control.ScopedUserCA{
		{Keys: []string{"garbage"}, Principals: map[string][]string{"root": {"p"}}},
		{Keys: []string{key}, Principals: map[string][]string{"root": {"tether:pos:root"}},
			NoForwarding: []string{"tether:pos:root"}},
		{Keys: []string{key}},
	}, log)
	if len(got) != 2 || !slices.Equal(got[0].PerLogin["root"], []string{"tether:pos:root"}) || got[1].PerLogin == nil {
		t.Fatalf("scoped CAs %+v", got)
	}
	if s := sshdScopedCAs(got); len(s) != 2 || !slices.Equal(s[0].NoForwarding, []string{"tether:pos:root"}) {
		t.Fatalf("for sshd: %+v", s)
	}
}
