package validate

import (
	"errors"
	"fmt"
	"os/exec"
	"strings"
	"testing"
)

func TestLogin(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"root", true},
		{"ubuntu", true},
		{"_apt", true},
		{"first.last", true}, // the hub's provisioning login always allowed '.'
		{"a-b_c9", true},
		{strings.Repeat("a", 32), true},
		{strings.Repeat("a", 33), false},
		{"", false},
		{"machine$", false}, // Samba machine account: not an SSH login, and not a portable file name
		{"$", false},
		{".", false},
		{"..", false},
		{".hidden", false},
		{"-rf", false},
		{"9lives", false},
		{"Root", false},
		{"a/b", false},
		{"../etc", false},
		{"a b", false},
		{"a#b", false},
		{"a%u", false},
		{"a\"b", false},
		{"a\x00", false},
		{"ünï", false},
	} {
		err := Login(tc.in)
		if (err == nil) != tc.ok {
			t.Errorf("Login(%q) = %v, want ok=%v", tc.in, err, tc.ok)
		}
		if err != nil && (!errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "lowercase letters")) {
			t.Errorf("Login(%q) error %q does not wrap ErrInvalid or say what is allowed", tc.in, err)
		}
	}
}

func TestNodeName(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"node-1", true},
		{"a", true},
		{"7eleven", true},
		{strings.Repeat("a", 63), true},
		{strings.Repeat("a", 64), false},
		{"", false},
		{"123", false}, // could be read as an address or an ID
		{"-a", false},
		{"a-", false},
		{"A", false},
		{"a.b", false},
		{"a_b", false},
	} {
		if err := NodeName(tc.in); (err == nil) != tc.ok {
			t.Errorf("NodeName(%q) = %v, want ok=%v", tc.in, err, tc.ok)
		}
		if err := RoleName(tc.in); (err == nil) != (tc.ok || tc.in == "123") {
			t.Errorf("RoleName(%q) = %v, want ok=%v", tc.in, err, tc.ok)
		}
	}
}

// TestAddress: the hosts the bastion calls "an address" are exactly the
// names a node may not take, so no node joins under a name it cannot be
// reached by.
func TestAddress(t *testing.T) {
	for _, tc := range []struct {
		in   string
		is   string // "" for a name
		node bool   // a valid node name (only names can be)
	}{
		{"localhost", "a loopback or local host name", false},
		{"LOCALHOST", "a loopback or local host name", false},
		{"localhost4", "a loopback or local host name", false},
		{"localhost6", "a loopback or local host name", false},
		{"ip6-localhost", "a loopback or local host name", false},
		{"ip6-loopback", "a loopback or local host name", false},
		{"ip6-allnodes", "a loopback or local host name", false},
		{"ip6-allrouters", "a loopback or local host name", false},
		{"broadcasthost", "a loopback or local host name", false},
		{"localhost.localdomain", "a loopback or local host name", false},
		{"localhost6.localdomain6", "a loopback or local host name", false},
		{"app.localhost", "a loopback or local host name", false}, // RFC 6761
		{"localhost.", "a loopback or local host name", false},
		{"0x7f000001", "an IPv4 address or a number", false},
		{"0x", "an IPv4 address or a number", false}, // inet_aton reads 0.0.0.0
		{"0xdeadbeef", "an IPv4 address or a number", false},
		{"2130706433", "an IPv4 address or a number", false},
		{"017700000001", "an IPv4 address or a number", false},
		{"127.1", "an IPv4 address or a number", false},
		{"0x7f.1", "an IPv4 address or a number", false},
		{"127.0.0.1", "an IP address", false},
		{"::1", "an IP address", false},
		{"[::1]", "an IP address", false},
		{"fe80::1%eth0", "an IP address", false},
		{"127-0-0-1", "an IPv4 address written with dashes", false},
		{"10-0-0-255", "an IPv4 address written with dashes", false},
		{"1e3", "a number", false},
		{"1e-3", "a number", false},
		{"0o17", "a number", false},
		{"0b101", "a number", false},
		{"node-1", "", true},
		{"n7", "", true},
		{"localhost-1", "", true}, // a name that only starts like one
		{"my-localhost", "", true},
		{"ip-10-0-0-1", "", true}, // EC2's host names are names
		{"10-0-0-256", "", true},
		{"1-2-3", "", true},
		{"0xbox", "", true},
		{"e3", "", true},
		{"1e", "", true},
		{"0b", "", true},
		{"0b12", "", true},
		{"7eleven", "", true},
		{"deadbeef", "", true},
		{"n7.berlin", "", false}, // a path, not an address; not a node name either
	} {
		is, ok := Address(tc.in)
		if ok != (tc.is != "") || is != tc.is {
			t.Errorf("Address(%q) = %q, %v; want %q", tc.in, is, ok, tc.is)
		}
		err := NodeName(tc.in)
		if (err == nil) != tc.node {
			t.Errorf("NodeName(%q) = %v, want ok=%v", tc.in, err, tc.node)
		}
		if tc.is != "" && strings.Trim(tc.in, "0123456789") != "" && tc.in == strings.ToLower(tc.in) && err != nil &&
			!strings.Contains(err.Error(), "reads as "+tc.is) {
			t.Errorf("NodeName(%q) = %v, want it to say it reads as %s", tc.in, err, tc.is)
		}
	}
}

func TestSiteName(t *testing.T) {
	for _, tc := range []struct {
		in, suffix string
		says       string // "" when accepted
	}{
		{"berlin", "tether", ""},
		{"tether", "tether", "node suffix"},
		{"prod", "prod", "node suffix"},
		{"tether", "prod", ""},
		{"localhost", "tether", "reads as a loopback"},
		{"123", "tether", "not all digits"},
		{"a.b", "tether", "DNS label"},
	} {
		err := SiteName(tc.in, tc.suffix)
		bad := err != nil && (!strings.Contains(err.Error(), tc.says) || !errors.Is(err, ErrInvalid))
		if (err == nil) != (tc.says == "") || bad {
			t.Errorf("SiteName(%q, %q) = %v, want an error saying %q", tc.in, tc.suffix, err, tc.says)
		}
	}
}

func TestLabels(t *testing.T) {
	for _, tc := range []struct {
		k, v string
		ok   bool
	}{
		{"site", "berlin", true},
		{"tether.dev/role", "Edge_1.2-x", true},
		{"flag", "", true},
		{"a", "B", true},
		{strings.Repeat("k", 63), strings.Repeat("v", 63), true},
		{strings.Repeat("k", 64), "v", false},
		{"k", strings.Repeat("v", 64), false},
		{"", "v", false},
		{"Site", "v", false},
		{"-site", "v", false},
		{"site-", "v", false},
		{"si te", "v", false},
		{"k", "-v", false},
		{"k", "v.", false},
		{"k", "a b", false},
		{"k", "a/b", false},
		{"k", "a,b", false}, // would split a selector's set
		{"k", "a=b", false},
	} {
		err := Labels(map[string]string{tc.k: tc.v})
		if (err == nil) != tc.ok {
			t.Errorf("Labels(%q=%q) = %v, want ok=%v", tc.k, tc.v, err, tc.ok)
		}
		if err != nil && !errors.Is(err, ErrInvalid) {
			t.Errorf("Labels(%q=%q) error %v does not wrap ErrInvalid", tc.k, tc.v, err)
		}
	}
	many := map[string]string{}
	for i := range MaxLabels + 1 {
		many[fmt.Sprintf("k%d", i)] = "v"
	}
	if err := Labels(many); !errors.Is(err, ErrInvalid) {
		t.Errorf("Labels with %d labels = %v, want ErrInvalid", len(many), err)
	}
	delete(many, "k0")
	if err := Labels(many); err != nil {
		t.Errorf("Labels with %d labels = %v", len(many), err)
	}
}

func TestEnvName(t *testing.T) {
	for _, tc := range []struct {
		in string
		ok bool
	}{
		{"PATH", true},
		{"_x", true},
		{"LC_ALL", true},
		{"a1", true},
		{"", false},
		{"1A", false},
		{"A-B", false},
		{"A=B", false},
		{"A B", false},
		{"A.B", false},
		{strings.Repeat("A", MaxEnvNameLen+1), false},
	} {
		if err := EnvName(tc.in); (err == nil) != tc.ok {
			t.Errorf("EnvName(%q) = %v, want ok=%v", tc.in, err, tc.ok)
		}
	}
}

func TestErrorMessage(t *testing.T) {
	err := Login("machine$")
	want := `invalid login "machine$": a user name of 1-32 characters`
	if err == nil || !strings.HasPrefix(err.Error(), want) {
		t.Fatalf("Login error = %v, want prefix %q", err, want)
	}
	var e *Error
	if !errors.As(err, &e) || e.What != "login" || e.Value != "machine$" {
		t.Fatalf("Login error = %#v, want *Error for the login", err)
	}
}

// The package imports nothing of Tether's, so that edge, hub, pki and
// provisioners may all use it without an import cycle or a bigger agent.
func TestImportsNothingOfOurs(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", ".").Output()
	if err != nil {
		t.Skipf("go list: %v", err)
	}
	for _, d := range strings.Fields(string(out)) {
		if strings.HasPrefix(d, "github.com/tether-dev/tether/") && d != "github.com/tether-dev/tether/internal/validate" {
			t.Errorf("internal/validate depends on %s", d)
		}
	}
}
