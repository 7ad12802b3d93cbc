package packaging

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// scriptEnv is a fake machine for one maintainer script run: the script's
// absolute paths (/etc/, /var/lib/, /run/systemd/system) are moved under
// root, and PATH holds only a logging systemctl (unless absent), getent,
// useradd, and the real tools the scripts use.
type scriptEnv struct {
	root, bin, log string
}

func newScriptEnv(t *testing.T, systemctl, booted bool) *scriptEnv {
	t.Helper()
	e := &scriptEnv{root: t.TempDir(), bin: t.TempDir()}
	e.log = filepath.Join(e.root, "calls")
	fake := func(name, body string) {
		if err := os.WriteFile(filepath.Join(e.bin, name), []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if systemctl {
		fake("systemctl", `echo "systemctl $*" >>`+e.log)
	}
	fake("getent", "exit 2") // no such user
	fake("useradd", `echo "useradd $*" >>`+e.log)
	for _, tool := range []string{"grep", "rm", "rmdir"} {
		p, err := exec.LookPath(tool)
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Symlink(p, filepath.Join(e.bin, tool)); err != nil {
			t.Fatal(err)
		}
	}
	for _, d := range []string{"etc/systemd/system/multi-user.target.wants", "var/lib"} {
		os.MkdirAll(filepath.Join(e.root, d), 0o755)
	}
	if booted {
		os.MkdirAll(filepath.Join(e.root, "run/systemd/system"), 0o755)
	}
	return e
}

// run assembles pkg's script as package.sh does and runs it with args.
func (e *scriptEnv) run(t *testing.T, pkg, script string, args ...string) (calls []string, stderr string) {
	t.Helper()
	common, err := os.ReadFile("scripts/common.sh")
	if err != nil {
		t.Fatal(err)
	}
	own, err := os.ReadFile(filepath.Join("scripts", pkg, script))
	if err != nil {
		t.Fatal(err)
	}
	body := "set -e\n" + string(common) + string(own)
	for _, p := range []string{"/etc/", "/var/lib/", "/run/systemd/system"} {
		for _, before := range []string{" ", `"`} {
			body = strings.ReplaceAll(body, before+p, before+e.root+p)
		}
	}
	f := filepath.Join(t.TempDir(), script)
	if err := os.WriteFile(f, []byte(body), 0o755); err != nil {
		t.Fatal(err)
	}
	os.Remove(e.log)
	cmd := exec.Command("/bin/sh", append([]string{f}, args...)...)
	cmd.Env = []string{"PATH=" + e.bin}
	var errb strings.Builder
	cmd.Stderr = &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %s %v: %v\n%s", pkg, script, args, err, errb.String())
	}
	b, _ := os.ReadFile(e.log)
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l != "" {
			calls = append(calls, strings.ReplaceAll(l, e.root, ""))
		}
	}
	return calls, strings.ReplaceAll(errb.String(), e.root, "")
}

// TestMaintainerScripts: for dpkg's and rpm's arguments, what the
// scripts ask of systemd. An upgrade restarts the agent only if it was
// running (try-restart), installs enable the unit even where systemd is not
// running (image builds, chroots) but start nothing there, and nothing
// fails when systemctl is absent.
func TestMaintainerScripts(t *testing.T) {
	const edge, hub = "tether-edge", "tether"
	for _, tc := range []struct {
		name              string
		pkg, script       string
		args              []string
		systemctl, booted bool
		joinFile          bool
		want              []string
		stderr            string
	}{
		{"deb install, no join string yet", edge, "postinst", []string{"configure", ""}, true, true, false,
			[]string{"daemon-reload", "enable tether-edge.service"}, "put the join string"},
		{"deb install with a join file", edge, "postinst", []string{"configure", ""}, true, true, true,
			[]string{"daemon-reload", "enable tether-edge.service", "start tether-edge.service"}, ""},
		{"rpm install with a join file", edge, "postinst", []string{"1"}, true, true, true,
			[]string{"daemon-reload", "enable tether-edge.service", "start tether-edge.service"}, ""},
		{"install in a chroot: enabled, not started", edge, "postinst", []string{"configure", ""}, true, false, true,
			[]string{"enable tether-edge.service"}, ""},
		{"install without systemctl", edge, "postinst", []string{"configure", ""}, false, false, true, nil, ""},
		{"deb upgrade restarts only a running agent", edge, "postinst", []string{"configure", "0.1.0-1"}, true, true, false,
			[]string{"daemon-reload", "try-restart tether-edge.service"}, ""},
		{"rpm upgrade restarts only a running agent", edge, "postinst", []string{"2"}, true, true, false,
			[]string{"daemon-reload", "try-restart tether-edge.service"}, ""},
		{"upgrade in a chroot", edge, "postinst", []string{"configure", "0.1.0-1"}, true, false, false, nil, ""},
		{"deb prerm on upgrade keeps it running", edge, "prerm", []string{"upgrade", "0.2.0-1"}, true, true, false, nil, ""},
		{"rpm preun on upgrade keeps it running", edge, "prerm", []string{"1"}, true, true, false, nil, ""},
		{"deb remove stops it", edge, "prerm", []string{"remove"}, true, true, false,
			[]string{"stop tether-edge.service"}, ""},
		{"rpm erase stops it", edge, "prerm", []string{"0"}, true, true, false, []string{"stop tether-edge.service"}, ""},
		{"remove in a chroot", edge, "prerm", []string{"remove"}, true, false, false, nil, ""},
		{"deb postrm remove", edge, "postrm", []string{"remove"}, true, true, false, []string{"daemon-reload"}, ""},
		{"rpm postun on upgrade", edge, "postrm", []string{"1"}, true, true, false, nil, ""},
		{"hub install makes its user and starts", hub, "postinst", []string{"configure", ""}, true, true, false,
			[]string{"daemon-reload", "enable tether.service", "start tether.service"}, ""},
		{"hub preinst makes the system user", hub, "preinst", []string{"install"}, true, true, false,
			[]string{"useradd --system --user-group --home-dir /var/lib/tether --no-create-home --shell /bin/false " +
				"--comment Tether hub tether"}, ""},
		{"hub rpm %pre makes the system user", hub, "preinst", []string{"1"}, false, false, false,
			[]string{"useradd --system --user-group --home-dir /var/lib/tether --no-create-home --shell /bin/false " +
				"--comment Tether hub tether"}, ""},
		{"hub upgrade", hub, "postinst", []string{"2"}, true, true, false,
			[]string{"daemon-reload", "try-restart tether.service"}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newScriptEnv(t, tc.systemctl, tc.booted)
			if tc.joinFile {
				os.MkdirAll(filepath.Join(e.root, "etc/tether-edge"), 0o755)
				os.WriteFile(filepath.Join(e.root, "etc/tether-edge/join"), []byte("tether://x\n"), 0o600)
			}
			calls, stderr := e.run(t, tc.pkg, tc.script, tc.args...)
			var want []string
			for _, w := range tc.want {
				if !strings.HasPrefix(w, "useradd") {
					w = "systemctl " + w
				}
				want = append(want, w)
			}
			if !slices.Equal(calls, want) {
				t.Errorf("calls:\n  %q\nwant:\n  %q", calls, want)
			}
			if !strings.Contains(stderr, tc.stderr) || tc.stderr == "" && stderr != "" {
				t.Errorf("stderr %q, want %q", stderr, tc.stderr)
			}
		})
	}
}

// TestPurge: purging the agent removes its configuration, its identity and
// its enablement; purging the hub keeps the hub's data (its CA) and says so.
func TestPurge(t *testing.T) {
	e := newScriptEnv(t, true, false)
	for _, f := range []string{"etc/tether-edge/join", "var/lib/tether-edge/node.json", "var/lib/tether/ca/ca.key",
		"etc/tether/tether.env", "etc/systemd/system/multi-user.target.wants/tether-edge.service"} {
		os.MkdirAll(filepath.Join(e.root, filepath.Dir(f)), 0o755)
		os.WriteFile(filepath.Join(e.root, f), nil, 0o600)
	}
	e.run(t, "tether-edge", "postrm", "purge")
	for _, gone := range []string{
		"etc/tether-edge", "var/lib/tether-edge", "etc/systemd/system/multi-user.target.wants/tether-edge.service",
	} {
		if _, err := os.Lstat(filepath.Join(e.root, gone)); !os.IsNotExist(err) {
			t.Errorf("%s after purge of tether-edge: %v", gone, err)
		}
	}
	_, stderr := e.run(t, "tether", "postrm", "purge")
	if _, err := os.Stat(filepath.Join(e.root, "var/lib/tether/ca/ca.key")); err != nil {
		t.Errorf("purge of the hub removed its CA: %v", err)
	}
	if _, err := os.Stat(filepath.Join(e.root, "etc/tether")); !os.IsNotExist(err) {
		t.Errorf("/etc/tether after purge: %v", err)
	}
	if !strings.Contains(stderr, "kept /var/lib/tether") {
		t.Errorf("purge of the hub does not say it kept its data: %q", stderr)
	}
}
