package e2e

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// nfpmBinary finds nfpm: TETHER_NFPM (make test builds it into .tools with
// `go install github.com/goreleaser/nfpm/v2/cmd/nfpm`), the repository's
// .tools, or PATH.
func nfpmBinary(t *testing.T) string {
	if p := os.Getenv("TETHER_NFPM"); p != "" {
		return p
	}
	if p, err := filepath.Abs("../.tools/bin/nfpm"); err == nil {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	if p, err := exec.LookPath("nfpm"); err == nil {
		return p
	}
	t.Skip("nfpm not found: run through `make test`, which builds it, or set TETHER_NFPM")
	return ""
}

// buildPackages runs packaging/package.sh, as `make package` does, on the
// binaries under test and returns the directory holding the packages.
func buildPackages(t *testing.T, version string, formats ...string) string {
	t.Helper()
	out := t.TempDir()
	cmd := exec.Command("../packaging/package.sh", append([]string{binDir, out, version}, formats...)...)
	cmd.Env = append(os.Environ(), "NFPM="+nfpmBinary(t), "GOARCH="+runtime.GOARCH)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("package.sh %s: %v\n%s", version, err, b)
	}
	return out
}

// debArch is dpkg's name of this machine's architecture.
func debArch(t *testing.T) string {
	b, err := exec.Command("dpkg", "--print-architecture").Output()
	if err != nil {
		t.Fatalf("dpkg --print-architecture: %v", err)
	}
	return strings.TrimSpace(string(b))
}

// dpkgStatus is the package's dpkg status ("installed", "config-files",
// "not-installed") and version.
func dpkgStatus(t *testing.T, pkg string) (status, version string) {
	t.Helper()
	b, err := exec.Command("dpkg-query", "-W", "-f", "${db:Status-Status} ${Version}", pkg).Output()
	if err != nil {
		return "not-installed", ""
	}
	status, version, _ = strings.Cut(strings.TrimSpace(string(b)), " ")
	return status, version
}

func dpkg(t *testing.T, args ...string) string {
	t.Helper()
	cmd := exec.Command("dpkg", args...)
	cmd.Stdin = nil // a conffile prompt would fail instead of waiting
	b, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("dpkg %s: %v\n%s", strings.Join(args, " "), err, b)
	}
	return string(b)
}

// TestPackageDeb installs the tether-edge and tether .debs with the real
// dpkg into this machine (the only place maintainer scripts run as they
// will in the field; a dpkg --root chroot would need a shell and the
// scripts' tools inside it), then checks the files, their modes and the
// units, the hub's system user, an upgrade that keeps an edited conffile,
// and that remove and purge leave nothing behind. systemd is not running
// here (no PID 1 systemd in the test container), which is itself the case
// of an image build: nothing may fail for it.
//
// It needs root and refuses to run on a machine that has these packages,
// or their directories, from anything but an earlier run of this test.
// CI runs `make test` as root, so it runs there.
func TestPackageDeb(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("installs the .deb into this machine with dpkg: needs root (CI runs `make test` as root)")
	}
	if _, err := exec.LookPath("dpkg"); err != nil {
		t.Skip("dpkg not installed: the .deb is not checked")
	}
	arch := debArch(t)
	v1 := buildPackages(t, "0.1.0", "deb")
	v2 := buildPackages(t, "0.2.0", "deb")
	edge1 := filepath.Join(v1, "tether-edge_0.1.0-1_"+arch+".deb")
	edge2 := filepath.Join(v2, "tether-edge_0.2.0-1_"+arch+".deb")
	hub1 := filepath.Join(v1, "tether_0.1.0-1_"+arch+".deb")

	const maintainer = "Tether maintainers"
	for _, pkg := range []string{"tether-edge", "tether"} {
		if st, _ := dpkgStatus(t, pkg); st != "not-installed" {
			b, _ := exec.Command("dpkg-query", "-W", "-f", "${Maintainer}", pkg).Output()
			if !strings.HasPrefix(string(b), maintainer) {
				t.Skipf("a package %s (%s) from elsewhere is installed here; not touching it", pkg, b)
			}
			dpkg(t, "--purge", pkg) // left over from an interrupted run of this test
		}
	}
	for _, dir := range []string{"/etc/tether-edge", "/var/lib/tether-edge", "/etc/tether", "/var/lib/tether"} {
		if _, err := os.Stat(dir); err == nil {
			t.Skipf("%s exists on this machine: not installing packages over a real installation", dir)
		}
	}
	_, userErr := exec.Command("getent", "passwd", "tether").Output()
	hadUser := userErr == nil
	t.Cleanup(func() {
		exec.Command("dpkg", "--purge", "tether-edge", "tether").Run()
		os.RemoveAll("/var/lib/tether") // kept by purge on purpose (the hub's CA)
		if !hadUser {
			exec.Command("userdel", "tether").Run()
		}
	})

	start := time.Now()
	out := dpkg(t, "--install", edge1, hub1)
	t.Logf("dpkg --install (2 packages): %v", time.Since(start).Round(time.Millisecond))
	if !strings.Contains(out, "put the join string from `tether token create` into /etc/tether-edge/join") {
		t.Errorf("installing tether-edge without a join string does not say where it goes:\n%s", out)
	}
	for pkg, want := range map[string]string{"tether-edge": "0.1.0-1", "tether": "0.1.0-1"} {
		if st, v := dpkgStatus(t, pkg); st != "installed" || v != want {
			t.Fatalf("%s: status %q version %q after install, want installed %s", pkg, st, v, want)
		}
	}
	for path, mode := range map[string]os.FileMode{
		"/usr/bin/tether-edge":                        0o755,
		"/usr/bin/tether-edge-onboard":                0o755,
		"/usr/bin/tether":                             0o755,
		"/usr/lib/systemd/system/tether-edge.service": 0o644,
		"/usr/lib/systemd/system/tether.service":      0o644,
		"/etc/tether-edge/tether-edge.env":            0o600,
		"/etc/tether/tether.env":                      0o600,
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatalf("installed file: %v", err)
		}
		if fi.Mode().Perm() != mode {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode().Perm(), mode)
		}
	}
	for _, pkg := range []string{"tether-edge", "tether"} {
		if out, err := exec.Command("/usr/bin/"+pkg, "version").CombinedOutput(); err != nil {
			t.Errorf("installed %s version: %v\n%s", pkg, err, out)
		}
	}

	// The units: ExecStart= at the packaged binaries (the agent's by a bare
	// name systemd resolves to /usr/bin/tether-edge), valid for systemd.
	for unit, execLine := range map[string]string{
		"tether-edge.service": "ExecStart=tether-edge run ", "tether.service": "ExecStart=/usr/bin/tether hub ",
	} {
		b, err := os.ReadFile("/usr/lib/systemd/system/" + unit)
		if err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(string(b), "\n"+execLine) {
			t.Errorf("installed %s has no %q line", unit, execLine)
		}
	}
	if analyze, err := exec.LookPath("systemd-analyze"); err == nil {
		out, err := exec.Command(analyze, "verify", "/usr/lib/systemd/system/tether-edge.service",
			"/usr/lib/systemd/system/tether.service").CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify of the installed units: %v\n%s", err, out)
		}
	}
	// Enabling works without a running systemd, so an image built with
	// the package starts the agent at its first boot.
	if _, err := exec.LookPath("systemctl"); err == nil {
		for _, unit := range []string{"tether-edge.service", "tether.service"} {
			if _, err := os.Lstat("/etc/systemd/system/multi-user.target.wants/" + unit); err != nil {
				t.Errorf("%s not enabled by the package: %v", unit, err)
			}
		}
	}
	// The hub's unit runs as the system user tether, made by the package.
	pw, err := exec.Command("getent", "passwd", "tether").Output()
	if err != nil {
		t.Fatalf("no system user tether after installing the hub package: %v", err)
	}
	if f := strings.Split(strings.TrimSpace(string(pw)), ":"); len(f) != 7 || f[5] != "/var/lib/tether" ||
		!strings.Contains(f[6], "nologin") && f[6] != "/bin/false" {
		t.Errorf("system user tether: %q", pw)
	}
	conffiles, _ := exec.Command("dpkg-query", "-W", "-f", "${Conffiles}", "tether-edge").Output()
	if !strings.Contains(string(conffiles), "/etc/tether-edge/tether-edge.env ") {
		t.Errorf("tether-edge conffiles: %q, want /etc/tether-edge/tether-edge.env", conffiles)
	}

	// Upgrade: an edited conffile is kept, without a prompt (stdin is
	// not a terminal: a prompt would fail dpkg).
	const edit = "TETHER_EDGE_ARGS=--ssh embedded\n"
	f, err := os.OpenFile("/etc/tether-edge/tether-edge.env", os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	f.WriteString(edit)
	f.Close()
	dpkg(t, "--install", edge2)
	if st, v := dpkgStatus(t, "tether-edge"); st != "installed" || v != "0.2.0-1" {
		t.Fatalf("tether-edge after upgrade: %s %s", st, v)
	}
	if b, _ := os.ReadFile("/etc/tether-edge/tether-edge.env"); !strings.HasSuffix(string(b), edit) {
		t.Errorf("the edited conffile was not kept on upgrade:\n%s", b)
	}
	if fi, err := os.Stat("/etc/tether-edge/tether-edge.env"); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("conffile after upgrade: %v %v", fi.Mode(), err)
	}
	if fi, err := os.Stat("/usr/bin/tether-edge"); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("binary after upgrade: %v", err)
	}

	// Remove keeps the configuration; purge leaves nothing.
	if err := os.WriteFile("/etc/tether-edge/join", []byte("tether://x\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	dpkg(t, "--remove", "tether-edge")
	if st, _ := dpkgStatus(t, "tether-edge"); st != "config-files" {
		t.Errorf("tether-edge after remove: %s, want config-files", st)
	}
	for _, gone := range []string{
		"/usr/bin/tether-edge", "/usr/bin/tether-edge-onboard", "/usr/lib/systemd/system/tether-edge.service",
	} {
		if _, err := os.Stat(gone); !os.IsNotExist(err) {
			t.Errorf("%s after remove: %v", gone, err)
		}
	}
	if _, err := os.Stat("/etc/tether-edge/tether-edge.env"); err != nil {
		t.Errorf("remove dropped the conffile: %v", err)
	}
	dpkg(t, "--purge", "tether-edge", "tether")
	for _, pkg := range []string{"tether-edge", "tether"} {
		if st, _ := dpkgStatus(t, pkg); st != "not-installed" {
			t.Errorf("%s after purge: %s", pkg, st)
		}
	}
	for _, gone := range []string{"/etc/tether-edge", "/etc/tether", "/usr/bin/tether",
		"/usr/lib/systemd/system/tether.service", "/var/lib/tether-edge",
		"/etc/systemd/system/multi-user.target.wants/tether-edge.service",
		"/etc/systemd/system/multi-user.target.wants/tether.service"} {
		if _, err := os.Lstat(gone); !os.IsNotExist(err) {
			t.Errorf("%s after purge: %v", gone, err)
		}
	}
}

// TestRunJoinFile: `tether-edge run` with no identity and no --join joins
// with the join string in --join-file (the packages' /etc/tether-edge/join),
// comments and blank lines skipped. With neither, see
// TestUnjoinedAgentExitsForGood.
func TestRunJoinFile(t *testing.T) {
	h := startHub(t)
	edgeBin := filepath.Join(binDir, "tether-edge")
	dir := t.TempDir()
	joinFile := filepath.Join(dir, "join")
	if err := os.WriteFile(joinFile, []byte("# from tether token create\n\n"+h.token()+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	start(t, "agent-joinfile", edgeBin, "run", "--state-dir", filepath.Join(dir, "state"), "--join-file", joinFile,
		"--name", "jf", "--ssh", "embedded", "--shell", "/bin/sh")
	h.waitOnline("jf", "")
}

// TestPackageRPM checks the .rpm packages with rpm's own queries (no
// install: that needs an RPM-based system): files, modes, the conffile as
// %config(noreplace), and the maintainer scripts. Skipped where rpm is not
// installed (Debian package rpm).
func TestPackageRPM(t *testing.T) {
	if _, err := exec.LookPath("rpm"); err != nil {
		t.Skip("rpm not installed (Debian package rpm): the .rpm is not checked")
	}
	dir := buildPackages(t, "0.1.0", "rpm")
	for _, tc := range []struct {
		pkg     string
		files   []string // "FLAGS MODE PATH" as rpm prints them
		scripts []string
	}{
		{"tether-edge",
			[]string{"cn -rw------- /etc/tether-edge/tether-edge.env", " -rwxr-xr-x /usr/bin/tether-edge",
				" -rwxr-xr-x /usr/bin/tether-edge-onboard", " -rw-r--r-- /usr/lib/systemd/system/tether-edge.service"},
			[]string{"postinstall scriptlet", "preuninstall scriptlet", "postuninstall scriptlet"}},
		{"tether",
			[]string{"cn -rw------- /etc/tether/tether.env", " -rwxr-xr-x /usr/bin/tether",
				" -rw-r--r-- /usr/lib/systemd/system/tether.service"},
			[]string{"preinstall scriptlet", "postinstall scriptlet", "preuninstall scriptlet", "postuninstall scriptlet"}},
	} {
		matches, _ := filepath.Glob(filepath.Join(dir, tc.pkg+"-0.1.0-1.*.rpm"))
		if len(matches) != 1 {
			t.Fatalf("%s: rpm files %v", tc.pkg, matches)
		}
		out, err := exec.Command("rpm", "-qp", "--qf", "[%{FILEFLAGS:fflags} %{FILEMODES:perms} %{FILENAMES}\n]",
			matches[0]).CombinedOutput()
		if err != nil {
			t.Fatalf("rpm -qp %s: %v\n%s", matches[0], err, out)
		}
		if got := strings.Split(strings.TrimSpace(string(out)), "\n"); strings.Join(got,
			"\n") != strings.Join(tc.files, "\n") {
			t.Errorf("%s files:\n%s\nwant:\n%s", tc.pkg, out, strings.Join(tc.files, "\n"))
		}
		scripts, err := exec.Command("rpm", "-qp", "--scripts", matches[0]).CombinedOutput()
		if err != nil {
			t.Fatal(err)
		}
		for _, want := range append(tc.scripts, "try-restart", "/run/systemd/system") {
			if !strings.Contains(string(scripts), want) {
				t.Errorf("%s scripts lack %q", tc.pkg, want)
			}
		}
	}
}
