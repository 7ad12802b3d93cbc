package bulkonboard

import (
	"errors"
	"strings"
	"testing"
)

func TestParseInventory(t *testing.T) {
	in := `# Berlin shops

root@10.0.0.7 site=berlin   # the first
shop-8.example:2222 site=berlin rack=2
admin@[2001:db8::9]:2200
2001:db8::10
`
	hosts, err := ParseInventory(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []struct {
		line      int
		str, addr string
		user      string
		labels    int
	}{
		{3, "root@10.0.0.7", "10.0.0.7:22", "root", 1},
		{4, "shop-8.example:2222", "shop-8.example:2222", "", 2},
		{5, "admin@[2001:db8::9]:2200", "[2001:db8::9]:2200", "admin", 0},
		{6, "[2001:db8::10]", "[2001:db8::10]:22", "", 0},
	}
	if len(hosts) != len(want) {
		t.Fatalf("hosts: %+v", hosts)
	}
	for i, w := range want {
		h := hosts[i]
		if h.Line != w.line || h.String() != w.str || h.Addr() != w.addr || h.User != w.user ||
			len(h.Labels) != w.labels {
			t.Errorf("host %d: %+v (%s, %s), want %+v", i, h, h, h.Addr(), w)
		}
	}
	if l := hosts[1].Labels; l[0] != (Label{"site", "berlin"}) || l[1] != (Label{"rack", "2"}) {
		t.Errorf("labels in line order: %+v", l)
	}
}

func TestParseInventoryRejects(t *testing.T) {
	for _, tc := range []struct {
		name, in string
		want     []string // each in the error
	}{
		{"empty", "# nothing\n\n", []string{"no hosts"}},
		{"bad port", "a:0\nb:99999\nc:x\nd:\n", []string{"line 1:", "line 2:", "line 3:", "line 4:", "want 1-65535"}},
		{"bad user", "-rf@host\n", []string{"line 1:", "user"}},
		{"bad host", "ho/st\n", []string{"line 1:", "not allowed in a host name"}},
		{"label without =", "host site\n", []string{"line 1:", "KEY=VALUE"}},
		{"bad label key", "host Bad Key=1\n", []string{"line 1:"}},
		{"label twice", "host a=1 a=2\n", []string{"given twice"}},
		{"duplicate host", "h\nroot@x\nh:22\n", []string{"line 3:", "already listed on line 1"}},
		{"bad ipv6", "[::1\n[10.0.0.1]:22\n1:2:3\n", []string{"line 1:", "line 2:", "line 3:"}},
		{"every bad line is named", "ok\nbad:0\nok2\nalso bad:-1\n", []string{"line 2:", "line 4:"}},
		{"overlong line", strings.Repeat("x", maxInventoryLine+1), []string{"too long"}},
		{"bad node name", "a name=Pi_1\nb name=localhost\n", []string{"line 1:", "line 2:", "reads as a loopback"}},
		{"name twice on a line", "a name=pi-1 name=pi-2\n", []string{"line 1:", "name= given twice"}},
		{"name asked twice", "a name=pi-1\nb\nc name=pi-1\n",
			[]string{"line 3:", `node name "pi-1" is already asked for on line 1`}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseInventory(strings.NewReader(tc.in))
			if !errors.Is(err, ErrInventory) {
				t.Fatalf("err = %v, want ErrInventory", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%v", w, err)
				}
			}
		})
	}
}

// TestNameHosts: name= on a line is the host's node name (a field, not a
// reported label); --name-pattern names the hosts without one, and every
// name is a node name no other host asks for, checked before any host is
// contacted.
func TestNameHosts(t *testing.T) {
	const inv = "pi@10.0.0.7 name=kitchen site=home\npi@10.0.0.8\n[2001:db8::9]:2222\nShop-8.Example\n"
	for _, tc := range []struct {
		pattern string
		want    []string // names in inventory order
		err     []string // each in the error
	}{
		{"", []string{"kitchen", "", "", ""}, nil},
		{"pi-{host}", []string{"kitchen", "pi-10-0-0-8", "pi-2001-db8--9", "pi-shop-8-example"}, nil},
		{"pi-{n}", []string{"kitchen", "pi-2", "pi-3", "pi-4"}, nil},
		{"{host}", nil, []string{"line 2:", "reads as an IPv4 address written with dashes", "put name=NODE on the line"}},
		{"pi", nil, []string{"{n}", "{host}"}},
		{"kitchen{n}x", []string{"kitchen", "kitchen2x", "kitchen3x", "kitchen4x"}, nil},
		{"Pi-{n}", nil, []string{"line 2:", "line 3:", "line 4:", "lowercase"}},
	} {
		t.Run(tc.pattern, func(t *testing.T) {
			hosts, err := ParseInventory(strings.NewReader(inv))
			if err != nil {
				t.Fatal(err)
			}
			if len(hosts[0].Labels) != 1 || hosts[0].Labels[0] != (Label{"site", "home"}) {
				t.Fatalf("name= taken as a label: %+v", hosts[0].Labels)
			}
			err = NameHosts(hosts, tc.pattern)
			if tc.err != nil {
				if err == nil {
					t.Fatalf("NameHosts(%q) accepted: %+v", tc.pattern, hosts)
				}
				for _, w := range tc.err {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error lacks %q:\n%v", w, err)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i, w := range tc.want {
				if hosts[i].Name != w {
					t.Errorf("host %d (%s) named %q, want %q", i, hosts[i], hosts[i].Name, w)
				}
			}
		})
	}
	// A pattern may not give a name a line asks for.
	hosts, _ := ParseInventory(strings.NewReader("a name=pi-2\nb\n"))
	err := NameHosts(hosts, "pi-{n}")
	if err == nil || !strings.Contains(err.Error(), `gives node name "pi-2", already that of line 1`) {
		t.Fatalf("pattern clashing with a name=: %v", err)
	}
}

// FuzzParseInventory: any input parses to valid hosts or to an error
// naming ErrInventory, never a panic; a parsed host prints back to a line
// that parses to the same host.
func FuzzParseInventory(f *testing.F) {
	f.Add("root@10.0.0.7 site=berlin\n")             // user, IPv4, label
	f.Add("shop-8.example:2222 a=1 b=2 # comment\n") // port, labels, comment
	f.Add("[2001:db8::1]:22\n2001:db8::2\n")         // IPv6 both ways
	f.Add("bad:0\n\n#\n")                            // bad port, blanks
	f.Fuzz(func(t *testing.T, in string) {
		hosts, err := ParseInventory(strings.NewReader(in))
		if err != nil {
			if !errors.Is(err, ErrInventory) {
				t.Fatalf("error without ErrInventory: %v", err)
			}
			return
		}
		for _, h := range hosts {
			again, err := ParseInventory(strings.NewReader(h.String()))
			if err != nil || len(again) != 1 || again[0].Addr() != h.Addr() || again[0].User != h.User {
				t.Fatalf("%q → %s → %+v, %v", in, h, again, err)
			}
		}
	})
}
