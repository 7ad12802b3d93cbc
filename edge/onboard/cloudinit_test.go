package onboard

import (
	"context"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// The hub's parser (onboardproto.ParseUserData) is what onboarding applies
// through: these are the shapes it must refuse before anything is written.
func TestUserDataShapes(t *testing.T) {
	tests := []struct {
		name, in, err string
	}{
		{
			"files and commands",
			"#cloud-config\nwrite_files:\n- path: /etc/a\n  content: x\n  permissions: '0600'\n- path: /etc/b\n" +
				"  encoding: b64\n  content: aGk=\nruncmd:\n- [systemctl, enable, --now, tether-edge]\n",
			"",
		},
		{"empty config", "#cloud-config\n", "empty"},
		{"not cloud-config", "#!/bin/sh\necho hi\n", "first line"},
		{"unknown key", "#cloud-config\npackages: [curl]\n", `packages`},
		{"unknown file field", "#cloud-config\nwrite_files:\n- path: /a\n  append: true\n", "append"},
		{"relative path", "#cloud-config\nwrite_files:\n- path: etc/a\n", "absolute"},
		{"dotdot path", "#cloud-config\nwrite_files:\n- path: /etc/../root/a\n", "absolute and clean"},
		{"bad permissions", "#cloud-config\nwrite_files:\n- path: /a\n  permissions: rw\n", "octal"},
		{"bad base64", "#cloud-config\nwrite_files:\n- path: /a\n  encoding: b64\n  content: '!!'\n", "base64"},
		{"gzip", "#cloud-config\nwrite_files:\n- path: /a\n  encoding: gz+b64\n  content: x\n", "encoding"},
		{"shell string runcmd", "#cloud-config\nruncmd:\n- systemctl enable tether-edge\n", "user-data"},
		{"empty argv", "#cloud-config\nruncmd:\n- []\n", "want a command"},
		{"not yaml", "#cloud-config\n: [\n", "user-data"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := onboardproto.ParseUserData(tt.in)
			if tt.err == "" && err != nil {
				t.Fatalf("err %v", err)
			}
			if tt.err != "" && (err == nil || !strings.Contains(err.Error(), tt.err)) {
				t.Fatalf("err %v, want %q", err, tt.err)
			}
		})
	}
}

func TestApplierWriteFiles(t *testing.T) {
	root, state := t.TempDir(), filepath.Join(t.TempDir(), "state")
	cc, err := onboardproto.ParseUserData(("#cloud-config\nwrite_files:\n" +
		"- path: /etc/systemd/system/tether-edge.service\n  content: unit\n" +
		"- path: /var/lib/tether-edge/node.json\n  content: '{}'\n  permissions: '0600'\n" +
		"runcmd:\n- [systemctl, daemon-reload]\n- [touch, /x]\n"))
	if err != nil {
		t.Fatal(err)
	}
	a := &Applier{Root: root, StateDir: state}
	if _, err := a.WriteFiles(cc); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(root, "etc/systemd/system/tether-edge.service")); string(b) != "unit" {
		t.Fatalf("unit %q", b)
	}
	fi, err := os.Stat(filepath.Join(state, "node.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("state file not mapped to --state-dir: %v %v", fi, err)
	}
	// Supervised under a fake root: nothing of runcmd runs on this machine.
	ran, skipped, err := a.RunCommands(t.Context(), cc)
	if err != nil || len(ran) != 0 || len(skipped) != 2 {
		t.Fatalf("ran %v skipped %v err %v", ran, skipped, err)
	}
	// The key never comes from the hub.
	cc, _ = onboardproto.ParseUserData(
		"#cloud-config\nwrite_files:\n- path: /var/lib/tether-edge/node.key\n  content: k\n")
	if _, err := a.WriteFiles(cc); err == nil || !strings.Contains(err.Error(), "never replaced") {
		t.Fatalf("key overwrite: %v", err)
	}
}

func TestWriteSeed(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "seed", "nocloud")
	u, m, err := WriteSeed(dir, "#cloud-config\n", "instance-id: x\n")
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range []string{u, m} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", p, fi, err)
		}
	}
}

func TestParseLabels(t *testing.T) {
	if l, err := ParseLabels(" a=1, b=2 "); err != nil || FormatLabels(l) != "a=1,b=2" {
		t.Fatalf("%v %v", l, err)
	}
	for _, in := range []string{"a", "a=1,a=2", "=1"} {
		if _, err := ParseLabels(in); err == nil {
			t.Errorf("ParseLabels(%q) accepted", in)
		}
	}
}

func TestWaitConnected(t *testing.T) {
	self := os.Getpid()
	tests := []struct {
		name, status string
		ok           bool
		err          string
	}{
		{"connected, live agent", `{"state":"connected","pid":` + strconv.Itoa(self) + `}`, true, ""},
		{
			"refused",
			`{"state":"refused","last_error":"node revoked","pid":` + strconv.Itoa(self) + `}`,
			false,
			"node revoked",
		},
		{"stale connected of a dead agent", `{"state":"connected","pid":2147483646}`, false, "within the timeout"},
		{"no status yet", ``, false, "within the timeout"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			if tt.status != "" {
				if err := os.WriteFile(filepath.Join(dir, "status.json"), []byte(tt.status), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			_, err := WaitConnected(ctx, dir, 0)
			if tt.ok != (err == nil) || (err != nil && !strings.Contains(err.Error(), tt.err)) {
				t.Fatalf("err %v, want ok=%v %q", err, tt.ok, tt.err)
			}
		})
	}
}

func TestEnvArgs(t *testing.T) {
	p := filepath.Join(t.TempDir(), "env")
	os.WriteFile(p, []byte("TETHER_JOIN=x\nTETHER_EDGE_ARGS=\"--ssh embedded --allow-port 80\"\n"), 0o600)
	if got := strings.Join(envArgs(p), " "); got != "--ssh embedded --allow-port 80" {
		t.Fatalf("%q", got)
	}
	if envArgs(filepath.Join(t.TempDir(), "missing")) != nil {
		t.Fatal("args from a missing file")
	}
}

func TestEnsureBinary(t *testing.T) {
	root := t.TempDir()
	exe := filepath.Join(t.TempDir(), "tether-edge")
	os.WriteFile(exe, []byte("binary"), 0o700)
	cc, err := onboardproto.ParseUserData(
		"#cloud-config\nwrite_files:\n- path: /etc/systemd/system/tether-edge.service\n  content: |\n" +
			"    [Service]\n    ExecStart=/usr/local/bin/tether-edge run --state-dir /var/lib/tether-edge $TETHER_EDGE_ARGS\n")
	if err != nil {
		t.Fatal(err)
	}
	a := &Applier{Root: root, Exe: exe}
	got, err := a.EnsureBinary(cc)
	want := filepath.Join(root, "usr/local/bin/tether-edge")
	if err != nil || got != want {
		t.Fatalf("EnsureBinary = %q, %v", got, err)
	}
	if fi, err := os.Stat(want); err != nil || fi.Mode().Perm() != 0o755 {
		t.Fatalf("installed binary %v %v", fi, err)
	}
	// There now: left alone.
	if got, err := a.EnsureBinary(cc); err != nil || got != "" {
		t.Fatalf("second EnsureBinary = %q, %v", got, err)
	}
	if b := execStartBinary("ExecStart=-/usr/bin/tether-edge run\n"); b != "/usr/bin/tether-edge" {
		t.Fatalf("prefix: %q", b)
	}

	// The shipped unit names a bare tether-edge: a package's /usr/bin copy
	// is used; without one, this binary goes to /usr/local/bin.
	bare, err := onboardproto.ParseUserData(
		"#cloud-config\nwrite_files:\n- path: /etc/systemd/system/tether-edge.service\n  content: |\n" +
			"    [Service]\n    ExecStart=tether-edge run --state-dir /var/lib/tether-edge\n")
	if err != nil {
		t.Fatal(err)
	}
	pkgRoot := t.TempDir()
	os.MkdirAll(filepath.Join(pkgRoot, "usr/bin"), 0o755)
	os.WriteFile(filepath.Join(pkgRoot, "usr/bin/tether-edge"), []byte("package"), 0o755)
	if got, err := (&Applier{Root: pkgRoot, Exe: exe}).EnsureBinary(bare); err != nil || got != "" {
		t.Fatalf("bare name with a package's binary: %q, %v", got, err)
	}
	emptyRoot := t.TempDir()
	if got, err := (&Applier{Root: emptyRoot, Exe: exe}).EnsureBinary(bare); err != nil ||
		got != filepath.Join(emptyRoot, "usr/local/bin/tether-edge") {
		t.Fatalf("bare name with no binary: %q, %v", got, err)
	}
}
