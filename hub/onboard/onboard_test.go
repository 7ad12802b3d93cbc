package onboard

import (
	"errors"
	"os/exec"
	"slices"
	"strings"
	"testing"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

func TestMatch(t *testing.T) {
	profiles := []store.OSProfile{
		{Name: "debian-12", Distro: "debian", Version: "12", Family: "debian"},
		{Name: "debian-11", Distro: "debian", Version: "11", Family: "debian"},
		{Name: "debian-9", Distro: "debian", Version: "9", Family: "debian"},
		{Name: "a-ubuntu-like", Distro: "ubuntu", Version: "22.04", Family: "debian"},
		{Name: "rocky-9", Distro: "rocky", Version: "9", Family: "rhel"},
		{Name: "plain", Distro: "alpine", Version: "3.20"},
	}
	cases := []struct {
		name, distro, version, idLike string
		want, by                      string
	}{
		{"distro and version", "debian", "11", "", "debian-11", MatchedByVersion},
		{"version wins over family", "ubuntu", "22.04", "debian", "a-ubuntu-like", MatchedByVersion},
		{"family by ID_LIKE, own distro first", "ubuntu", "24.04", "debian", "a-ubuntu-like", MatchedByFamily},
		{"family by ID_LIKE, by name", "raspbian", "12", "debian", "a-ubuntu-like", MatchedByFamily},
		{"family is the distro, newest first", "debian", "13", "", "debian-12", MatchedByFamily},
		{"several ID_LIKE words", "almalinux", "9.4", "rhel centos fedora", "rocky-9", MatchedByFamily},
		{"no family on the profile", "alpine", "3.21", "", "", ""},
		{"nothing", "arch", "", "", "", ""},
		{"empty distro never matches by version", "", "", "", "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, by, err := Match(profiles, tc.distro, tc.version, tc.idLike)
			if tc.want == "" {
				if !errors.Is(err, ErrNoProfile) {
					t.Fatalf("got %s by %s, %v; want ErrNoProfile", p.Name, by, err)
				}
				for _, p := range profiles {
					if !strings.Contains(err.Error(), p.Name+" (") {
						t.Fatalf("error does not list profile %s: %v", p.Name, err)
					}
				}
				return
			}
			if err != nil || p.Name != tc.want || by != tc.by {
				t.Fatalf("got %s by %s, %v; want %s by %s", p.Name, by, err, tc.want, tc.by)
			}
		})
	}
	if _, _, err := Match(nil, "debian", "12", ""); err == nil || !strings.Contains(err.Error(), "none exist") {
		t.Fatalf("no profiles at all: %v", err)
	}
}

// TestValidate: what a template must be to be stored, each failure named.
func TestValidate(t *testing.T) {
	ok := "#cloud-config\nwrite_files:\n  - path: {{.StateDir}}/node.crt\n    permissions: \"0600\"\n" +
		"    encoding: b64\n    content: {{b64 .Cert}}\nruncmd:\n  - [systemctl, enable, --now, tether-edge]\n"
	cases := []struct {
		name, tmpl, want string
	}{
		{"the default", DefaultTemplate(), ""},
		{"a small one", ok, ""},
		{"no header", strings.TrimPrefix(ok, "#cloud-config\n"), "first line must be"},
		{"template syntax", ok + "{{ .Cert ", "template:"},
		{"unknown field", ok + "# {{.Secret}}\n", "can't evaluate field Secret"},
		{"unknown function", ok + "# {{shell .Cert}}\n", "function \"shell\" not defined"},
		{"not YAML", "#cloud-config\nwrite_files: [\n", "user-data"},
		{"another module", ok + "packages: [curl]\n", "field packages not found"},
		{"runcmd as a shell string", "#cloud-config\nruncmd:\n  - systemctl enable --now tether-edge\n", "cannot unmarshal"},
		{"relative path", "#cloud-config\nwrite_files:\n  - path: etc/x\n    content: x\n", "must be absolute"},
		{"bad permissions", "#cloud-config\nwrite_files:\n  - path: /etc/x\n    permissions: rw\n    content: x\n",
			"permissions"},
		{"bad encoding", "#cloud-config\nwrite_files:\n  - path: /etc/x\n    encoding: gzip\n    content: x\n", "encoding"},
		{"output without end", "#cloud-config\n{{range 100000000}}# {{$.Cert}}\n{{end}}", "larger than"},
		{"owner is not allowed", "#cloud-config\nwrite_files:\n  - path: /etc/x\n    owner: root\n    content: x\n",
			"field owner not found"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(tc.tmpl)
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("got %v, want an error containing %q", err, tc.want)
			}
		})
	}
}

// TestDefaultTemplate: the built-in template writes the agent's state in
// the layout the agent reads (node.json last), its labels and unit, and
// starts it; and carries nothing it was not given (no key).
func TestDefaultTemplate(t *testing.T) {
	d := SampleData()
	out, err := Render("", d)
	if err != nil {
		t.Fatal(err)
	}
	u, err := onboardproto.ParseUserData(out)
	if err != nil {
		t.Fatal(err)
	}
	var paths []string
	for _, f := range u.WriteFiles {
		paths = append(paths, f.Path)
		b, _ := f.Bytes()
		m, _ := f.Mode()
		if strings.HasPrefix(f.Path, StateDir) && m != 0o600 {
			t.Errorf("%s: mode %o, want 0600", f.Path, m)
		}
		if strings.Contains(string(b), "PRIVATE KEY") {
			t.Errorf("%s carries a private key", f.Path)
		}
	}
	want := []string{StateDir + "/node.crt", StateDir + "/ca.crt", StateDir + "/node_ca.crt", LabelsPath, UnitPath,
		StateDir + "/node.json"}
	if strings.Join(paths, " ") != strings.Join(want, " ") {
		t.Fatalf("files %v, want %v", paths, want)
	}
	if len(u.RunCmd) != 2 || strings.Join(u.RunCmd[0], " ") != "systemctl daemon-reload" ||
		strings.Join(u.RunCmd[1], " ") != "systemctl enable --now tether-edge" {
		t.Fatalf("runcmd %v", u.RunCmd)
	}
	if got := LabelsFile(map[string]string{"b": "2", "a": "1"}); !strings.HasSuffix(got, "a=1\nb=2\n") {
		t.Fatalf("labels file %q", got)
	}
}

// TestNodeEnv: a runcmd entry that starts with {{nodeenv}} runs its
// command with TETHER_NODE and TETHER_NODE_ID, as the argv list that
// cloud-init and tether-edge onboard --apply both run without a shell.
func TestNodeEnv(t *testing.T) {
	tmpl := DefaultTemplate() + `  - [{{nodeenv}}, /bin/sh, -c, 'echo "node=$TETHER_NODE id=$TETHER_NODE_ID"']` + "\n"
	if err := Validate(tmpl); err != nil {
		t.Fatal(err)
	}
	d := SampleData()
	d.Name, d.NodeID = "pi-kitchen", "0a1b2c3d4e5f6a7b"
	out, err := Render(tmpl, d)
	if err != nil {
		t.Fatal(err)
	}
	u, err := onboardproto.ParseUserData(out)
	if err != nil {
		t.Fatal(err)
	}
	argv := u.RunCmd[len(u.RunCmd)-1]
	want := []string{"env", "TETHER_NODE=pi-kitchen", "TETHER_NODE_ID=0a1b2c3d4e5f6a7b", "/bin/sh", "-c"}
	if len(argv) < 5 || !slices.Equal(argv[:5], want) {
		t.Fatalf("runcmd %q, want it to start %q", argv, want)
	}
	got, err := exec.Command(argv[0], argv[1:]...).Output()
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != "node=pi-kitchen id=0a1b2c3d4e5f6a7b\n" {
		t.Fatalf("the command saw %q", got)
	}
}
