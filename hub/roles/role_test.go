package roles

import (
	"errors"
	"reflect"
	"strings"
	"testing"
)

func TestRoleValidate(t *testing.T) {
	ok := Role{Name: "lab-ops", Nodes: "site=lab", Logins: []string{"root", "ubuntu"}}
	with := func(f func(*Role)) Role {
		r := ok
		r.Logins = append([]string(nil), ok.Logins...)
		f(&r)
		return r
	}
	tests := []struct {
		name string
		role Role
		want string // error substring; "" means valid
	}{
		{"ok", ok, ""},
		{"all nodes empty", with(func(r *Role) { r.Nodes = "" }), ""},
		{"all nodes star", with(func(r *Role) { r.Nodes = "*" }), ""},
		{"one char name", with(func(r *Role) { r.Name = "a" }), ""},
		{"digit name", with(func(r *Role) { r.Name = "0ps1" }), ""},
		{"63 char name", with(func(r *Role) { r.Name = strings.Repeat("a", 63) }), ""},
		{"login underscore", with(func(r *Role) { r.Logins = []string{"_svc"} }), ""},
		{"login dot", with(func(r *Role) { r.Logins = []string{"first.last"} }), ""},
		{"digits name", with(func(r *Role) { r.Name = "123" }), ""},
		{"login dash digits", with(func(r *Role) { r.Logins = []string{"deploy-01"} }), ""},
		{"login 32 chars", with(func(r *Role) { r.Logins = []string{strings.Repeat("u", 32)} }), ""},
		{"duplicate logins", with(func(r *Role) { r.Logins = []string{"root", "root"} }), ""},

		{"empty name", with(func(r *Role) { r.Name = "" }), `invalid role name ""`},
		{"upper name", with(func(r *Role) { r.Name = "Ops" }), `invalid role name "Ops"`},
		{"leading dash", with(func(r *Role) { r.Name = "-ops" }), "invalid role name"},
		{"trailing dash", with(func(r *Role) { r.Name = "ops-" }), "invalid role name"},
		{"dot in name", with(func(r *Role) { r.Name = "lab.ops" }), "invalid role name"},
		{"underscore name", with(func(r *Role) { r.Name = "lab_ops" }), "invalid role name"},
		{"64 char name", with(func(r *Role) { r.Name = strings.Repeat("a", 64) }), "invalid role name"},
		{"bad selector", with(func(r *Role) { r.Nodes = "site=lab,env!" }),
			`roles: role "lab-ops": selector "site=lab,env!": term 2 "env!": missing value after "!="`},
		{"no logins", with(func(r *Role) { r.Logins = nil }), `role "lab-ops": no logins`},
		{"empty logins", with(func(r *Role) { r.Logins = []string{} }), "no logins"},
		{"empty login", with(func(r *Role) { r.Logins = []string{"root", ""} }), `invalid login ""`},
		{"upper login", with(func(r *Role) { r.Logins = []string{"Root"} }), `invalid login "Root"`},
		{"digit first login", with(func(r *Role) { r.Logins = []string{"1user"} }), `invalid login "1user"`},
		{"dash first login", with(func(r *Role) { r.Logins = []string{"-oProxyCommand"} }), "invalid login"},
		// A trailing '$' (Samba machine accounts) is no SSH login, and a
		// managed sshd cannot name a principals file after it.
		{"login dollar", with(func(r *Role) { r.Logins = []string{"machine$"} }), `invalid login "machine$"`},
		{"dot first login", with(func(r *Role) { r.Logins = []string{".."} }), "invalid login"},
		{"dollar inside login", with(func(r *Role) { r.Logins = []string{"a$b"} }), "invalid login"},
		{"only dollar", with(func(r *Role) { r.Logins = []string{"$"} }), "invalid login"},
		{"space login", with(func(r *Role) { r.Logins = []string{"ro ot"} }), "invalid login"},
		{"at login", with(func(r *Role) { r.Logins = []string{"root@host"} }), "invalid login"},
		{"33 char login", with(func(r *Role) { r.Logins = []string{strings.Repeat("u", 33)} }), "invalid login"},
		{"too many logins", with(func(r *Role) {
			r.Logins = make([]string, MaxLogins+1)
			for i := range r.Logins {
				r.Logins[i] = "u"
			}
		}), "65 logins, at most 64"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.role.Validate()
			if tt.want == "" {
				if err != nil {
					t.Fatalf("Validate() = %v, want nil", err)
				}
				return
			}
			if err == nil {
				t.Fatalf("Validate() = nil, want error containing %q", tt.want)
			}
			if !strings.HasPrefix(err.Error(), "roles: ") {
				t.Errorf("error %q lacks the package prefix", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Validate() = %q, want it to contain %q", err, tt.want)
			}
		})
	}
}

func TestRoleValidateSelectorError(t *testing.T) {
	err := Role{Name: "x", Nodes: "a in (b", Logins: []string{"root"}}.Validate()
	var se *SelectorError
	if !errors.As(err, &se) {
		t.Fatalf("Validate() = %v (%T), want a *SelectorError", err, err)
	}
	if se.Role != "x" || se.Term != 1 || se.TermText != "a in (b" {
		t.Errorf("SelectorError = %+v", se)
	}
}

func TestAllowed(t *testing.T) {
	roles := []Role{
		{Name: "lab-ops", Nodes: "site=lab", Logins: []string{"ubuntu", "root"}},
		{Name: "arm-dev", Nodes: "arch in (arm64,armv7),env!=prod", Logins: []string{"dev", "ubuntu"}},
		{Name: "break-glass", Nodes: "*", Logins: []string{"emergency"}},
		{Name: "no-gpu", Nodes: "!gpu", Logins: []string{"ops"}},
		// Invalid roles grant nothing, even with a match-all selector.
		{Name: "Bad-Name", Nodes: "", Logins: []string{"evil"}},
		{Name: "bad-selector", Nodes: "site=lab,", Logins: []string{"evil"}},
		{Name: "bad-login", Nodes: "", Logins: []string{"root", "Evil"}},
		{Name: "no-logins", Nodes: ""},
	}
	tests := []struct {
		name   string
		roles  []Role
		labels map[string]string
		ok     bool
		logins []string
	}{
		{"no roles", nil, map[string]string{"site": "lab"}, false, nil},
		{"lab node", roles[:2], map[string]string{"site": "lab", "arch": "amd64"}, true, []string{"root", "ubuntu"}},
		{"lab arm dev node", roles[:2], map[string]string{"site": "lab", "arch": "arm64"}, true,
			[]string{"dev", "root", "ubuntu"}},
		{"lab arm prod node", roles[:2], map[string]string{"site": "lab", "arch": "arm64", "env": "prod"}, true,
			[]string{"root", "ubuntu"}},
		{"arm node off-site", roles[:2], map[string]string{"site": "edge", "arch": "armv7"}, true, []string{"dev", "ubuntu"}},
		{"unselected node", roles[:2], map[string]string{"site": "edge", "arch": "amd64"}, false, nil},
		{"unlabelled node", roles[:2], nil, false, nil},
		{"all roles, unlabelled", roles, nil, true, []string{"emergency", "ops"}},
		{"all roles, gpu lab", roles, map[string]string{"site": "lab", "gpu": "a100"}, true,
			[]string{"emergency", "root", "ubuntu"}},
		{"only invalid roles", roles[4:], nil, false, nil},
		{"only invalid roles, labels", roles[4:], map[string]string{"site": "lab"}, false, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ok, logins := Allowed(tt.roles, tt.labels)
			if ok != tt.ok || !reflect.DeepEqual(logins, tt.logins) {
				t.Errorf("Allowed() = %v, %q; want %v, %q", ok, logins, tt.ok, tt.logins)
			}
		})
	}
}

func TestAllowedDoesNotAlias(t *testing.T) {
	roles := []Role{{Name: "a", Logins: []string{"zed", "amy"}}}
	_, logins := Allowed(roles, nil)
	logins[0] = "mallory"
	if got := roles[0].Logins; !reflect.DeepEqual(got, []string{"zed", "amy"}) {
		t.Errorf("Allowed changed the role's logins: %q", got)
	}
}
