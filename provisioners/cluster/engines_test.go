package cluster

import (
	"bytes"
	"errors"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/tether-dev/tether/internal/validate"
)

const (
	goodInstall   = "#!/bin/sh\nset -eu\necho install\n"
	goodUninstall = "#!/bin/sh\nset -eu\necho uninstall\n"
)

// writeEngine creates dir/name with files; a nil files map means a good engine.
func writeEngine(t *testing.T, dir, name string, files map[string]string) {
	t.Helper()
	if files == nil {
		files = map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall}
	}
	d := filepath.Join(dir, name)
	if err := os.MkdirAll(d, 0o755); err != nil {
		t.Fatal(err)
	}
	for f, content := range files {
		if err := os.WriteFile(filepath.Join(d, f), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func TestBuiltinEngines(t *testing.T) {
	c, err := LoadEngines("")
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Err(); err != nil {
		t.Fatalf("built-ins broken: %v", err)
	}
	if got := c.Names(); !reflect.DeepEqual(got, []string{"k3s", "rke2"}) {
		t.Fatalf("Names() = %v, want [k3s rke2]", got)
	}
	for _, tc := range []struct {
		name    string
		timeout time.Duration
		env     map[string]string
		install []string // fragments install.sh must contain
		uninst  []string
	}{
		{"k3s", 30 * time.Minute, map[string]string{"INSTALL_K3S_CHANNEL": "stable"},
			[]string{"https://get.k3s.io", "INSTALL_K3S_VERSION", "set -eu"},
			[]string{"/usr/local/bin/k3s-uninstall.sh", "set -eu"}},
		{"rke2", 45 * time.Minute, map[string]string{"INSTALL_RKE2_CHANNEL": "stable", "INSTALL_RKE2_TYPE": "server"},
			[]string{"https://get.rke2.io", "INSTALL_RKE2_VERSION", "systemctl enable", "systemctl start", "set -eu"},
			[]string{"/usr/local/bin/rke2-uninstall.sh", "/usr/bin/rke2-uninstall.sh", "set -eu"}},
	} {
		e, err := c.Get(tc.name)
		if err != nil {
			t.Fatal(err)
		}
		if e.Source != BuiltinSource || e.Description == "" || e.Timeout != tc.timeout || !reflect.DeepEqual(e.Env, tc.env) {
			t.Errorf("%s: %+v", tc.name, e)
		}
		if !strings.HasPrefix(e.Digest, "sha256:") || len(e.Digest) != len("sha256:")+64 {
			t.Errorf("%s: digest %q", tc.name, e.Digest)
		}
		for _, f := range tc.install {
			if !bytes.Contains(e.Install, []byte(f)) {
				t.Errorf("%s install.sh lacks %q", tc.name, f)
			}
		}
		for _, f := range tc.uninst {
			if !bytes.Contains(e.Uninstall, []byte(f)) {
				t.Errorf("%s uninstall.sh lacks %q", tc.name, f)
			}
		}
	}
}

// builtinScripts writes the embedded scripts to a temporary directory.
func builtinScripts(t *testing.T) map[string]string {
	t.Helper()
	dir := t.TempDir()
	out := map[string]string{}
	err := fs.WalkDir(builtinFS, "engines", func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(p, ".sh") {
			return err
		}
		data, err := builtinFS.ReadFile(p)
		if err != nil {
			return err
		}
		dst := filepath.Join(dir, strings.ReplaceAll(strings.TrimPrefix(p, "engines/"), "/", "_"))
		out[strings.TrimPrefix(p, "engines/")] = dst
		return os.WriteFile(dst, data, 0o755)
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(out) != 4 {
		t.Fatalf("found %d built-in scripts, want 4: %v", len(out), out)
	}
	return out
}

func TestBuiltinScriptsSyntax(t *testing.T) {
	shells := [][]string{{"sh", "-n"}}
	if _, err := exec.LookPath("bash"); err == nil {
		// bash in POSIX mode catches some constructs dash accepts and vice versa.
		shells = append(shells, []string{"bash", "--posix", "-n"})
	}
	for name, file := range builtinScripts(t) {
		for _, sh := range shells {
			out, err := exec.Command(sh[0], append(sh[1:], file)...).CombinedOutput()
			if err != nil {
				t.Errorf("%s %s: %v\n%s", strings.Join(sh, " "), name, err, out)
			}
		}
	}
}

// stubDir makes a PATH directory with tiny shell stand-ins. Every stub appends its name
// and arguments to calls.log, so tests see what the script ran.
func stubDir(t *testing.T, stubs map[string]string) (string, func() string) {
	t.Helper()
	dir := t.TempDir()
	log := filepath.Join(dir, "calls.log")
	for name, body := range stubs {
		script := "#!/bin/sh\necho \"" + name + " $*\" >> '" + log + "'\n" + body + "\n"
		if err := os.WriteFile(filepath.Join(dir, name), []byte(script), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	return dir, func() string { b, _ := os.ReadFile(log); return string(b) }
}

func runScript(t *testing.T, file, stubPath string, env ...string) (string, error) {
	t.Helper()
	cmd := exec.Command("sh", file)
	cmd.Env = append([]string{"PATH=" + stubPath + ":/usr/bin:/bin"}, env...)
	out, err := cmd.CombinedOutput()
	return string(out), err
}

// The install scripts' idempotence decisions, with stand-ins for k3s/rke2, systemctl
// and curl: nothing here reaches the network or changes the machine.
func TestBuiltinInstallScripts(t *testing.T) {
	scripts := builtinScripts(t)
	failingCurl := "exit 22"
	for _, tc := range []struct {
		name      string
		script    string
		stubs     map[string]string
		env       []string
		wantErr   bool
		wantCurl  bool
		wantInOut string
	}{
		{
			name:   "k3s active: exit early",
			script: "k3s/install.sh",
			stubs: map[string]string{
				"k3s": "echo 'k3s version v1.31.4+k3s1 (a562d090)'", "systemctl": "exit 0", "curl": failingCurl,
			},
			wantInOut: "nothing to do",
		},
		{
			name:   "k3s active at pinned version: exit early",
			script: "k3s/install.sh",
			stubs: map[string]string{
				"k3s": "echo 'k3s version v1.31.4+k3s1 (a562d090)'", "systemctl": "exit 0", "curl": failingCurl,
			},
			env:       []string{"INSTALL_K3S_VERSION=v1.31.4+k3s1"},
			wantInOut: "v1.31.4+k3s1 already installed",
		},
		{
			name:   "k3s at another version: re-run installer",
			script: "k3s/install.sh",
			stubs: map[string]string{
				"k3s": "echo 'k3s version v1.30.0+k3s1 (abc)'", "systemctl": "exit 0", "curl": failingCurl,
			},
			env:     []string{"INSTALL_K3S_VERSION=v1.31.4+k3s1"},
			wantErr: true, wantCurl: true, wantInOut: "differs from INSTALL_K3S_VERSION",
		},
		{
			name:   "k3s installed but inactive: re-run installer",
			script: "k3s/install.sh",
			stubs: map[string]string{
				"k3s": "echo 'k3s version v1.31.4+k3s1 (a562d090)'", "systemctl": "exit 3", "curl": failingCurl,
			},
			wantErr: true, wantCurl: true, wantInOut: "downloading the installer",
		},
		{
			name:    "k3s failed download is a failure",
			script:  "k3s/install.sh",
			stubs:   map[string]string{"systemctl": "exit 3", "curl": failingCurl},
			env:     []string{"TETHER_K3S_INSTALLER_URL=https://mirror.invalid/k3s"},
			wantErr: true, wantCurl: true, wantInOut: "mirror.invalid",
		},
		{
			name:   "rke2 active: exit early",
			script: "rke2/install.sh",
			stubs: map[string]string{
				"rke2": "echo 'rke2 version v1.31.4+rke2r1 (abc)'", "systemctl": "exit 0", "curl": failingCurl,
			},
			wantInOut: "nothing to do",
		},
		{
			name:   "rke2 at another version: re-run installer",
			script: "rke2/install.sh",
			stubs: map[string]string{
				"rke2": "echo 'rke2 version v1.30.0+rke2r1 (abc)'", "systemctl": "exit 0", "curl": failingCurl,
			},
			env:     []string{"INSTALL_RKE2_VERSION=v1.31.4+rke2r1"},
			wantErr: true, wantCurl: true, wantInOut: "differs from INSTALL_RKE2_VERSION",
		},
		{
			name:    "rke2 bad type",
			script:  "rke2/install.sh",
			stubs:   map[string]string{"systemctl": "exit 0", "curl": failingCurl},
			env:     []string{"INSTALL_RKE2_TYPE=worker"},
			wantErr: true, wantInOut: "neither server nor agent",
		},
		{
			name:    "rke2 not installed: installer fetched",
			script:  "rke2/install.sh",
			stubs:   map[string]string{"systemctl": "exit 3", "curl": failingCurl},
			wantErr: true, wantCurl: true, wantInOut: "downloading the installer",
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for _, bin := range []string{"k3s", "rke2"} {
				if _, ok := tc.stubs[bin]; !ok {
					if p, err := exec.LookPath(bin); err == nil {
						t.Skipf("%s is installed on this machine (%s); the not-installed case cannot be simulated", bin, p)
					}
				}
			}
			stubs, calls := stubDir(t, tc.stubs)
			out, err := runScript(t, scripts[tc.script], stubs, tc.env...)
			wantCurl := tc.wantCurl
			if os.Geteuid() != 0 && tc.wantCurl {
				// Not root: the script must stop before downloading.
				wantCurl = false
				tc.wantInOut = "needs root"
			}
			if (err != nil) != tc.wantErr {
				t.Fatalf("err = %v, want error %v\n%s", err, tc.wantErr, out)
			}
			if got := strings.Contains(calls(), "curl "); got != wantCurl {
				t.Fatalf("curl called = %v, want %v; calls:\n%s\noutput:\n%s", got, wantCurl, calls(), out)
			}
			if !strings.Contains(out, tc.wantInOut) {
				t.Fatalf("output lacks %q:\n%s", tc.wantInOut, out)
			}
		})
	}
}

func TestBuiltinUninstallScriptsNothingInstalled(t *testing.T) {
	for _, p := range []string{
		"/usr/local/bin/k3s-uninstall.sh", "/usr/local/bin/k3s-agent-uninstall.sh",
		"/usr/local/bin/rke2-uninstall.sh", "/opt/rke2/bin/rke2-uninstall.sh", "/usr/bin/rke2-uninstall.sh",
	} {
		if _, err := os.Stat(p); err == nil {
			t.Skipf("%s exists: never run a real uninstall from a test", p)
		}
	}
	for _, bin := range []string{"k3s", "rke2"} {
		if p, err := exec.LookPath(bin); err == nil {
			t.Skipf("%s is installed on this machine (%s)", bin, p)
		}
	}
	scripts := builtinScripts(t)
	for _, name := range []string{"k3s/uninstall.sh", "rke2/uninstall.sh"} {
		stubs, _ := stubDir(t, nil)
		out, err := runScript(t, scripts[name], stubs)
		if err != nil || !strings.Contains(out, "not installed; nothing to do") {
			t.Errorf("%s: %v\n%s", name, err, out)
		}
	}
	// A binary without the uninstaller is refused rather than reported as removed.
	stubs, _ := stubDir(t, map[string]string{"k3s": "exit 0"})
	out, err := runScript(t, scripts["k3s/uninstall.sh"], stubs)
	if err == nil || !strings.Contains(out, "remove it by hand") {
		t.Errorf("k3s binary without uninstaller: %v\n%s", err, out)
	}
}

func TestLoadEngines(t *testing.T) {
	big := "#!/bin/sh\n" + strings.Repeat("#", MaxScriptSize)
	for _, tc := range []struct {
		name    string
		engine  string // directory name
		files   map[string]string
		wantErr string // "" = loads
	}{
		{"good", "myengine", nil, ""},
		{"good with yaml", "k0s", map[string]string{
			InstallFile: goodInstall, UninstallFile: goodUninstall,
			ConfigFile: "description: k0s\ntimeout: 1h\nenv:\n  K0S_VERSION: v1.31.1+k0s.0\n  _x1: \"\"\n",
		}, ""},
		{"empty yaml", "e1", map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall, ConfigFile: ""}, ""},
		{"exactly max size", "e2", map[string]string{InstallFile: big[:MaxScriptSize], UninstallFile: goodUninstall}, ""},
		{"missing install.sh", "e3", map[string]string{UninstallFile: goodUninstall}, "install.sh: missing"},
		{"missing uninstall.sh", "e4", map[string]string{InstallFile: goodInstall}, "uninstall.sh: missing"},
		{"empty script", "e5", map[string]string{InstallFile: "", UninstallFile: goodUninstall}, "install.sh: empty"},
		{"no shebang", "e6",
			map[string]string{InstallFile: goodInstall, UninstallFile: "set -eu\n"},
			`uninstall.sh: does not start with "#!"`},
		{"oversized script", "e7",
			map[string]string{InstallFile: big, UninstallFile: goodUninstall},
			"more than the 1048576 allowed"},
		{"bad yaml", "e8",
			map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall, ConfigFile: "timeout: [1m\n"},
			"engine.yaml"},
		{"unknown field", "e9",
			map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall, ConfigFile: "timeout: 1m\ntimout: 2m\n"},
			`engine.yaml: line 2: unknown field "timout"`},
		{"bad env name", "e10",
			map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall, ConfigFile: "env:\n  K3S-VERSION: v1\n"},
			`invalid environment variable name "K3S-VERSION"`},
		{"env name starts with digit", "e11",
			map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall, ConfigFile: "env:\n  1X: v1\n"},
			`invalid environment variable name "1X"`},
		{"timeout without unit", "e12",
			map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall, ConfigFile: "timeout: 30\n"},
			`timeout "30" is not a Go duration`},
		{"timeout too short", "e13",
			map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall, ConfigFile: "timeout: 500ms\n"},
			"outside 1s..24h0m0s"},
		{"timeout too long", "e14",
			map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall, ConfigFile: "timeout: 25h\n"},
			"outside 1s..24h0m0s"},
		{"negative timeout", "e15",
			map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall, ConfigFile: "timeout: -1m\n"},
			"outside"},
		{"yaml not a mapping", "e16",
			map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall, ConfigFile: "- a\n"},
			"cannot unmarshal !!seq into a mapping"},
		{"two yaml documents", "e17",
			map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall,
				ConfigFile: "timeout: 1m\n---\ntimeout: 2m\n"},
			"more than one YAML document"},
		{"multi-line description", "e18",
			map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall, ConfigFile: "description: \"a\\nb\"\n"},
			"control character"},
		{"engine.yml typo", "e19",
			map[string]string{InstallFile: goodInstall, UninstallFile: goodUninstall, "engine.yml": "timeout: 1m\n"},
			"rename it to engine.yaml"},
		{"uppercase dir name", "MyEngine", nil, "not a DNS label"},
		{"underscore dir name", "my_engine", nil, "not a DNS label"},
		{"leading dash dir name", "-x", nil, "not a DNS label"},
		{"trailing dash dir name", "x-", nil, "not a DNS label"},
		{"64 char dir name", strings.Repeat("a", 64), nil, "not a DNS label"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			writeEngine(t, dir, tc.engine, tc.files)
			c, err := LoadEngines(dir)
			if err != nil {
				t.Fatalf("LoadEngines: %v", err)
			}
			e, err := c.Get(tc.engine)
			if tc.wantErr == "" {
				if err != nil || c.Err() != nil {
					t.Fatalf("Get: %v; Err: %v", err, c.Err())
				}
				if e.Name != tc.engine || e.Source != filepath.Join(dir, tc.engine) {
					t.Fatalf("engine %+v", e)
				}
				return
			}
			if !errors.Is(err, ErrInvalidEngine) {
				t.Fatalf("Get = %v, want ErrInvalidEngine", err)
			}
			if !strings.Contains(err.Error(), tc.wantErr) || !strings.Contains(err.Error(), filepath.Join(dir, tc.engine)) {
				t.Fatalf("error %q does not name the path and %q", err, tc.wantErr)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
			if c.Err() == nil || !strings.Contains(c.Err().Error(), tc.wantErr) {
				t.Fatalf("Err() = %v, want it to report %q", c.Err(), tc.wantErr)
			}
			// One broken definition leaves the others usable.
			if _, err := c.Get("k3s"); err != nil {
				t.Fatalf("k3s unusable next to a broken engine: %v", err)
			}
			if strings.Contains(strings.Join(c.Names(), " "), tc.engine) {
				t.Fatalf("broken engine listed in Names() = %v", c.Names())
			}
		})
	}
}

func TestLoadEnginesGoodSettings(t *testing.T) {
	dir := t.TempDir()
	writeEngine(t, dir, "k0s", map[string]string{
		InstallFile: goodInstall, UninstallFile: goodUninstall,
		ConfigFile: "description: '  k0s, zero friction  '\ntimeout: 1h30m\n" +
			"env:\n  K0S_VERSION: v1.31.1+k0s.0\n  REPLICAS: 3\n  EMPTY:\n",
	})
	writeEngine(t, dir, "plain", nil)
	c, err := LoadEngines(dir)
	if err != nil {
		t.Fatal(err)
	}
	e, err := c.Get("k0s")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]string{"K0S_VERSION": "v1.31.1+k0s.0", "REPLICAS": "3", "EMPTY": ""}
	if e.Description != "k0s, zero friction" || e.Timeout != 90*time.Minute || !reflect.DeepEqual(e.Env, want) {
		t.Fatalf("engine %+v", e)
	}
	if string(e.Install) != goodInstall || string(e.Uninstall) != goodUninstall {
		t.Fatal("scripts not read verbatim")
	}
	p, err := c.Get("plain")
	if err != nil {
		t.Fatal(err)
	}
	if p.Timeout != DefaultTimeout || len(p.Env) != 0 || p.Description != "" {
		t.Fatalf("defaults: %+v", p)
	}
	if got := c.Names(); !reflect.DeepEqual(got, []string{"k0s", "k3s", "plain", "rke2"}) {
		t.Fatalf("Names() = %v", got)
	}
}

func TestLoadEnginesOverrideAndSkips(t *testing.T) {
	dir := t.TempDir()
	custom := "#!/bin/sh\necho my k3s\n"
	writeEngine(t, dir, "k3s", map[string]string{InstallFile: custom, UninstallFile: goodUninstall})
	writeEngine(t, dir, ".git", map[string]string{"config": "x"}) // skipped: dot entry
	if err := os.WriteFile(filepath.Join(dir, "README.md"), []byte("engines"), 0o644); err != nil {
		t.Fatal(err)
	}
	// A symbolic link to an engine directory elsewhere is followed.
	elsewhere := t.TempDir()
	writeEngine(t, elsewhere, "real", nil)
	if err := os.Symlink(filepath.Join(elsewhere, "real"), filepath.Join(dir, "linked")); err != nil {
		t.Fatal(err)
	}
	c, err := LoadEngines(dir)
	if err != nil {
		t.Fatal(err)
	}
	if c.Err() != nil {
		t.Fatal(c.Err())
	}
	if got := c.Names(); !reflect.DeepEqual(got, []string{"k3s", "linked", "rke2"}) {
		t.Fatalf("Names() = %v", got)
	}
	e, err := c.Get("k3s")
	if err != nil {
		t.Fatal(err)
	}
	if string(e.Install) != custom || e.Source != filepath.Join(dir, "k3s") {
		t.Fatalf("k3s not overridden: source %s", e.Source)
	}
	builtin, _ := LoadEngines("")
	b, _ := builtin.Get("k3s")
	if b.Digest == e.Digest {
		t.Fatal("override has the built-in's digest")
	}

	// A broken override hides the built-in instead of silently falling back to it.
	if err := os.Remove(filepath.Join(dir, "k3s", UninstallFile)); err != nil {
		t.Fatal(err)
	}
	c, err = c.Reload()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("k3s"); !errors.Is(err, ErrInvalidEngine) {
		t.Fatalf("broken override: Get(k3s) = %v, want ErrInvalidEngine", err)
	}
}

func TestLoadEnginesMissingDir(t *testing.T) {
	_, err := LoadEngines(filepath.Join(t.TempDir(), "nope"))
	if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "nope") {
		t.Fatalf("LoadEngines(missing) = %v, want a not-exist error naming the dir", err)
	}
}

func TestLoadEnginesScriptIsDirectory(t *testing.T) {
	dir := t.TempDir()
	writeEngine(t, dir, "odd", map[string]string{UninstallFile: goodUninstall})
	if err := os.Mkdir(filepath.Join(dir, "odd", InstallFile), 0o755); err != nil {
		t.Fatal(err)
	}
	c, err := LoadEngines(dir)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Get("odd"); !errors.Is(err, ErrInvalidEngine) || !strings.Contains(err.Error(), "not a regular file") {
		t.Fatalf("Get(odd) = %v", err)
	}
}

func TestCatalogGetUnknown(t *testing.T) {
	dir := t.TempDir()
	writeEngine(t, dir, "k0s", nil)
	c, err := LoadEngines(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.Get("kubeadm")
	if !errors.Is(err, ErrUnknownEngine) || errors.Is(err, ErrInvalidEngine) {
		t.Fatalf("Get(kubeadm) = %v, want ErrUnknownEngine", err)
	}
	for _, want := range []string{`"kubeadm"`, "k0s, k3s, rke2", filepath.Join(dir, "<name>")} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
}

func TestCatalogGetReturnsCopies(t *testing.T) {
	c, err := LoadEngines("")
	if err != nil {
		t.Fatal(err)
	}
	e, _ := c.Get("k3s")
	e.Install[0] = 'X'
	e.Env["INJECTED"] = "1"
	again, _ := c.Get("k3s")
	if again.Install[0] != '#' || again.Env["INJECTED"] != "" {
		t.Fatal("Get shares memory with the catalog")
	}
}

func TestDigest(t *testing.T) {
	load := func(install, uninstall, yml string) Engine {
		t.Helper()
		dir := t.TempDir()
		writeEngine(t, dir, "e", map[string]string{InstallFile: install, UninstallFile: uninstall, ConfigFile: yml})
		c, err := LoadEngines(dir)
		if err != nil {
			t.Fatal(err)
		}
		e, err := c.Get("e")
		if err != nil {
			t.Fatal(err)
		}
		return e
	}
	base := load(goodInstall, goodUninstall, "env:\n  V: '1'\n")
	if again := load(goodInstall, goodUninstall, "env:\n  V: '1'\n"); again.Digest != base.Digest {
		t.Fatal("digest not deterministic")
	}
	for name, e := range map[string]Engine{
		"install changed":   load(goodInstall+"#\n", goodUninstall, "env:\n  V: '1'\n"),
		"uninstall changed": load(goodInstall, goodUninstall+"#\n", "env:\n  V: '1'\n"),
		"env value changed": load(goodInstall, goodUninstall, "env:\n  V: '2'\n"),
		"env name changed":  load(goodInstall, goodUninstall, "env:\n  W: '1'\n"),
	} {
		if e.Digest == base.Digest {
			t.Errorf("%s: digest unchanged", name)
		}
	}
	// Moving bytes across a field boundary must not collide.
	if engineDigest([]byte("ab"), []byte("c"), nil) == engineDigest([]byte("a"), []byte("bc"), nil) ||
		engineDigest(nil, nil, map[string]string{"A": "BC"}) == engineDigest(nil, nil, map[string]string{"AB": "C"}) ||
		engineDigest([]byte("x"), nil, nil) == engineDigest(nil, []byte("x"), nil) {
		t.Error("digest encoding is ambiguous")
	}
	for name, e := range map[string]Engine{
		"description changed": load(goodInstall, goodUninstall, "description: x\nenv:\n  V: '1'\n"),
		"timeout changed":     load(goodInstall, goodUninstall, "timeout: 5m\nenv:\n  V: '1'\n"),
	} {
		if e.Digest != base.Digest {
			t.Errorf("%s: digest changed, but what runs did not", name)
		}
	}
}

func TestReloadSeesEdits(t *testing.T) {
	dir := t.TempDir()
	writeEngine(t, dir, "e", nil)
	c, err := LoadEngines(dir)
	if err != nil {
		t.Fatal(err)
	}
	before, _ := c.Get("e")
	if err := os.WriteFile(filepath.Join(dir, "e", InstallFile), []byte("#!/bin/sh\necho v2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	writeEngine(t, dir, "added", nil)
	c2, err := c.Reload()
	if err != nil {
		t.Fatal(err)
	}
	after, _ := c2.Get("e")
	if after.Digest == before.Digest || string(after.Install) != "#!/bin/sh\necho v2\n" {
		t.Fatal("Reload did not see the edited install.sh")
	}
	if _, err := c2.Get("added"); err != nil {
		t.Fatalf("Reload did not see the new engine: %v", err)
	}
	// The old catalog is unchanged.
	if old, _ := c.Get("e"); old.Digest != before.Digest {
		t.Fatal("Reload changed the old catalog")
	}
	if _, err := c.Get("added"); !errors.Is(err, ErrUnknownEngine) {
		t.Fatal("Reload changed the old catalog")
	}
	if c2.Dir() != dir {
		t.Fatalf("Dir() = %q", c2.Dir())
	}
}

func TestParseEngineYAMLTooBig(t *testing.T) {
	data := []byte("description: " + strings.Repeat("x", MaxEngineYAMLSize))
	if _, err := parseEngineYAML("e/engine.yaml", data); err == nil || !strings.Contains(err.Error(), "more than") {
		t.Fatalf("err = %v", err)
	}
}

// FuzzEngineYAML feeds arbitrary bytes to the engine.yaml decoder: it must never panic,
// only accept settings within the documented bounds, name the file in every error, and
// read back what it accepted when re-encoded.
func FuzzEngineYAML(f *testing.F) {
	for _, s := range []string{
		"",
		"description: k3s\ntimeout: 30m\nenv:\n  INSTALL_K3S_VERSION: v1.31.4+k3s1\n",
		"timeout: 30\n",
		"bogus: 1\n",
		"env:\n  BAD-NAME: x\n",
		"- a\n",
		"a: &a [*a, *a]\n",
		"timeout: 1m\n---\ntimeout: 2m\n",
	} {
		f.Add([]byte(s))
	}
	const file = "fuzz/engine.yaml"
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := parseEngineYAML(file, data)
		if err != nil {
			if !strings.HasPrefix(err.Error(), file+": ") {
				t.Fatalf("error does not start with the file name: %q", err)
			}
			return
		}
		if s.Timeout < MinTimeout || s.Timeout > MaxTimeout {
			t.Fatalf("accepted timeout %s", s.Timeout)
		}
		for k, v := range s.Env {
			if validate.EnvName(k) != nil || strings.IndexByte(v, 0) >= 0 {
				t.Fatalf("accepted env %q=%q", k, v)
			}
		}
		if s.Description != strings.TrimSpace(s.Description) {
			t.Fatalf("description not trimmed: %q", s.Description)
		}
		out, err := yaml.Marshal(engineConfig{Description: s.Description, Timeout: s.Timeout.String(), Env: s.Env})
		if err != nil {
			t.Fatalf("re-encode: %v", err)
		}
		back, err := parseEngineYAML(file, out)
		if err != nil {
			t.Fatalf("re-parse of %q: %v", out, err)
		}
		if back.Description != s.Description || back.Timeout != s.Timeout || !reflect.DeepEqual(back.Env, s.Env) {
			t.Fatalf("round trip changed %+v into %+v", s, back)
		}
	})
}
