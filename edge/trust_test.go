package edge

import (
	"slices"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
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
