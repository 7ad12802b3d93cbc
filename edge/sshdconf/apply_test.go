package sshdconf

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
)

// applyEnv is an sshdEnv without a running sshd.
func applyEnv(t *testing.T) *sshdEnv {
	t.Helper()
	dir := t.TempDir()
	e := &sshdEnv{
		t:   t,
		dir: dir,
		paths: Paths{
			Dir:     filepath.Join(dir, "etc", "tether"),
			DropIn:  filepath.Join(dir, "etc", "sshd_config.d", "50-tether.conf"),
			HostKey: filepath.Join(dir, "etc", "ssh_host_ed25519_key"),
		},
		hostCA: testenv.NewKey(t),
		userCA: testenv.NewKey(t),
	}
	e.hostKey = testenv.NewKeyFile(t, e.paths.HostKey)
	return e
}

func readString(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestDefaultPaths(t *testing.T) {
	p := DefaultPaths()
	if err := p.Check(); err != nil {
		t.Fatal(err)
	}
	for got, want := range map[string]string{
		p.HostCertPath():      "/etc/ssh/tether/ssh_host_ed25519_key-cert.pub",
		p.UserCAsPath():       "/etc/ssh/tether/trusted_user_ca_keys.pub",
		p.RevokedKeysPath():   "/etc/ssh/tether/revoked_keys",
		p.HostPublicKeyPath(): "/etc/ssh/ssh_host_ed25519_key.pub",
		p.DropIn:              "/etc/ssh/sshd_config.d/50-tether.conf",
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
}

func TestApplyWritesFiles(t *testing.T) {
	e := applyEnv(t)
	old := syscall.Umask(0o077) // Apply's modes must not depend on the umask
	defer syscall.Umask(old)

	f := e.files()
	ca2 := testenv.NewKey(t)
	f.UserCAs = append(f.UserCAs, ca2.Pub(), e.userCA.Pub()) // duplicate dropped
	if !e.apply(f) {
		t.Fatal("first Apply reported no change")
	}

	if got, want := readString(t, e.paths.HostCertPath()), string(ssh.MarshalAuthorizedKey(f.HostCert)); got != want {
		t.Errorf("host certificate:\n%s\nwant\n%s", got, want)
	}
	wantCAs := string(ssh.MarshalAuthorizedKey(e.userCA.Pub())) + string(ssh.MarshalAuthorizedKey(ca2.Pub()))
	if got := readString(t, e.paths.UserCAsPath()); got != wantCAs {
		t.Errorf("user CAs:\n%s\nwant\n%s", got, wantCAs)
	}
	if got := readString(t, e.paths.RevokedKeysPath()); got != "" {
		t.Errorf("revoked keys with none revoked: %q, want an empty file", got)
	}
	dropIn := readString(t, e.paths.DropIn)
	wantDropIn := dropInHeader +
		"HostCertificate " + e.paths.HostCertPath() + "\n" +
		"TrustedUserCAKeys " + e.paths.UserCAsPath() + "\n" +
		"RevokedKeys " + e.paths.RevokedKeysPath() + "\n"
	if dropIn != wantDropIn {
		t.Errorf("drop-in:\n%s\nwant\n%s", dropIn, wantDropIn)
	}
	if !strings.HasPrefix(dropIn, "# Managed by tether-edge") {
		t.Errorf("drop-in does not say it is managed:\n%s", dropIn)
	}

	for path, want := range map[string]fs.FileMode{
		e.paths.Dir:                  fs.ModeDir | 0o755,
		filepath.Dir(e.paths.DropIn): fs.ModeDir | 0o755,
		e.paths.HostCertPath():       0o644,
		e.paths.UserCAsPath():        0o644,
		e.paths.RevokedKeysPath():    0o644,
		e.paths.DropIn:               0o644,
		e.paths.HostKey:              0o600, // never touched
	} {
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if fi.Mode() != want {
			t.Errorf("%s: mode %v, want %v", path, fi.Mode(), want)
		}
	}
	assertNoTempFiles(t, e.paths.Dir, filepath.Dir(e.paths.DropIn))
}

func assertNoTempFiles(t *testing.T, dirs ...string) {
	t.Helper()
	for _, dir := range dirs {
		ents, err := os.ReadDir(dir)
		if err != nil {
			t.Fatal(err)
		}
		for _, ent := range ents {
			if strings.Contains(ent.Name(), ".tmp-") {
				t.Errorf("temp file left behind: %s", filepath.Join(dir, ent.Name()))
			}
		}
	}
}

func TestApplyIdempotent(t *testing.T) {
	e := applyEnv(t)
	k1, k2, k3 := testenv.NewKey(t), testenv.NewKey(t), testenv.NewKey(t)
	f := e.files(k1.Pub(), k2.Pub())
	if !e.apply(f) {
		t.Fatal("first Apply reported no change")
	}
	if e.apply(f) {
		t.Error("second Apply with the same input reported a change")
	}

	// The order of revoked keys does not matter.
	f.RevokedKeys = []ssh.PublicKey{k2.Pub(), k1.Pub(), k2.Pub()}
	if e.apply(f) {
		t.Error("reordered revoked keys reported a change")
	}

	// A file whose mode drifted is repaired without reporting a change.
	if err := os.Chmod(e.paths.UserCAsPath(), 0o600); err != nil {
		t.Fatal(err)
	}
	if e.apply(f) {
		t.Error("mode repair reported a change")
	}
	if fi, err := os.Stat(e.paths.UserCAsPath()); err != nil || fi.Mode() != 0o644 {
		t.Errorf("mode not repaired: %v %v", fi.Mode(), err)
	}

	// Any real difference is reported.
	f.RevokedKeys = append(f.RevokedKeys, k3.Pub())
	if !e.apply(f) {
		t.Error("new revoked key reported no change")
	}
	f.UserCAs = []ssh.PublicKey{testenv.NewKey(t).Pub()}
	if !e.apply(f) {
		t.Error("new user CA reported no change")
	}
	f.HostCert = e.files().HostCert // new serial
	if !e.apply(f) {
		t.Error("new host certificate reported no change")
	}
}

func TestApplyKeepsHostCert(t *testing.T) {
	e := applyEnv(t)
	f := e.files()
	e.apply(f)
	cert := readString(t, e.paths.HostCertPath())

	f.HostCert = nil
	if e.apply(f) {
		t.Error("Apply without HostCert changed something")
	}
	if got := readString(t, e.paths.HostCertPath()); got != cert {
		t.Errorf("host certificate changed to %q", got)
	}
	if !strings.Contains(readString(t, e.paths.DropIn), "HostCertificate ") {
		t.Error("drop-in lost its HostCertificate line")
	}
}

func TestApplyWithoutHostCert(t *testing.T) {
	e := applyEnv(t)
	// No host certificate yet, and no host public key needed.
	if err := os.Remove(e.paths.HostPublicKeyPath()); err != nil {
		t.Fatal(err)
	}
	e.apply(Files{UserCAs: []ssh.PublicKey{e.userCA.Pub()}})
	if dropIn := readString(t, e.paths.DropIn); strings.Contains(dropIn, "HostCertificate") {
		t.Errorf("drop-in names a host certificate that does not exist:\n%s", dropIn)
	}
	if _, err := os.Stat(e.paths.HostCertPath()); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("host certificate file: %v, want none", err)
	}
}

func TestApplyRevokedCertificates(t *testing.T) {
	e := applyEnv(t)
	op, other := testenv.NewKey(t), testenv.NewKey(t)
	opCert := testenv.SignCert(t, e.userCA, op.Pub(), ssh.UserCert, testenv.CertOpts{Principals: []string{"alice"}})
	e.apply(e.files(opCert, other.Pub(), op.Pub()))

	lines := []string{
		string(ssh.MarshalAuthorizedKey(op.Pub())),
		string(ssh.MarshalAuthorizedKey(other.Pub())),
	}
	if lines[0] > lines[1] {
		lines[0], lines[1] = lines[1], lines[0]
	}
	if got, want := readString(t, e.paths.RevokedKeysPath()), strings.Join(lines, ""); got != want {
		t.Errorf("revoked keys:\n%s\nwant the certificate's key once, sorted:\n%s", got, want)
	}
}

func TestApplyInvalid(t *testing.T) {
	e := applyEnv(t)
	good := e.files()
	var nilCert *ssh.Certificate
	userCert := testenv.SignCert(
		t, e.userCA, e.hostKey.Pub(), ssh.UserCert, testenv.CertOpts{Principals: []string{"n1"}},
	)
	otherHost := testenv.SignCert(
		t, e.hostCA, testenv.NewKey(t).Pub(), ssh.HostCert, testenv.CertOpts{Principals: []string{"n1"}},
	)
	unsigned := *good.HostCert
	unsigned.Signature = nil

	withPaths := func(mod func(*Paths)) Paths {
		p := e.paths
		mod(&p)
		return p
	}
	withFiles := func(mod func(*Files)) Files {
		f := good
		mod(&f)
		return f
	}
	for _, tc := range []struct {
		name  string
		paths Paths
		files Files
		want  string // in the error
	}{
		{"relative Dir", withPaths(func(p *Paths) { p.Dir = "etc/tether" }), good, "Paths.Dir"},
		{"empty DropIn", withPaths(func(p *Paths) { p.DropIn = "" }), good, "Paths.DropIn: empty path"},
		{"relative HostKey", withPaths(func(p *Paths) { p.HostKey = "ssh_host_ed25519_key" }), good, "Paths.HostKey"},
		{"HostKey is root", withPaths(func(p *Paths) { p.HostKey = "/" }), good, "does not name a file"},
		{"quote in path", withPaths(func(p *Paths) { p.Dir = `/etc/"tether"` }), good, "cannot carry"},
		{"newline in path", withPaths(func(p *Paths) { p.DropIn = "/etc/x\nHostKey /tmp/k" }), good, "cannot carry"},
		{"no user CA", e.paths, withFiles(func(f *Files) { f.UserCAs = nil }), "no UserCAs"},
		{"nil user CA", e.paths, withFiles(func(f *Files) { f.UserCAs = []ssh.PublicKey{e.userCA.Pub(), nil} }),
			"UserCAs[1] is nil"},
		{"typed nil user CA", e.paths, withFiles(func(f *Files) { f.UserCAs = []ssh.PublicKey{nilCert} }),
			"UserCAs[0] is nil"},
		{"certificate as user CA", e.paths, withFiles(func(f *Files) { f.UserCAs = []ssh.PublicKey{userCert} }),
			"UserCAs[0] is a certificate"},
		{"nil revoked key", e.paths, withFiles(func(f *Files) { f.RevokedKeys = []ssh.PublicKey{nil} }),
			"RevokedKeys[0] is nil"},
		{"user cert as host cert", e.paths, withFiles(func(f *Files) { f.HostCert = userCert }), "not a host certificate"},
		{"host cert for another key", e.paths, withFiles(func(f *Files) { f.HostCert = otherHost }), "not the host key"},
		{"unsigned host cert", e.paths, withFiles(func(f *Files) { f.HostCert = &unsigned }), "not signed"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			changed, err := Apply(tc.paths, tc.files)
			errorsIs(t, err, ErrInvalid)
			if !strings.Contains(err.Error(), tc.want) {
				t.Errorf("error %q does not say %q", err, tc.want)
			}
			if changed {
				t.Error("changed on invalid input")
			}
			if _, err := os.Stat(e.paths.Dir); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("invalid input wrote files: %v", err)
			}
		})
	}

	t.Run("missing host public key", func(t *testing.T) {
		p := withPaths(func(p *Paths) { p.HostKey = filepath.Join(e.dir, "no_such_key") })
		_, err := Apply(p, good)
		errorsIs(t, err, fs.ErrNotExist)
	})
}

func TestReadHostPublicKey(t *testing.T) {
	e := applyEnv(t)
	k, err := ReadHostPublicKey(e.paths)
	if err != nil {
		t.Fatal(err)
	}
	if !sameKey(k, e.hostKey.Pub()) {
		t.Errorf("read %s, want %s", ssh.FingerprintSHA256(k), ssh.FingerprintSHA256(e.hostKey.Pub()))
	}

	_, err = ReadHostPublicKey(Paths{HostKey: "ssh_host_ed25519_key"})
	errorsIs(t, err, ErrInvalid)

	_, err = ReadHostPublicKey(Paths{HostKey: filepath.Join(e.dir, "missing")})
	errorsIs(t, err, fs.ErrNotExist)

	// A certificate where the key should be is refused.
	cert := testenv.SignCert(t, e.hostCA, e.hostKey.Pub(), ssh.HostCert, testenv.CertOpts{Principals: []string{"n1"}})
	testenv.WriteFile(t, e.paths.HostPublicKeyPath(), ssh.MarshalAuthorizedKey(cert), 0o644)
	if _, err := ReadHostPublicKey(e.paths); err == nil || !strings.Contains(err.Error(), "certificate") {
		t.Errorf("certificate in the .pub file: %v", err)
	}

	testenv.WriteFile(t, e.paths.HostPublicKeyPath(), []byte("not a key\n"), 0o644)
	if _, err := ReadHostPublicKey(e.paths); err == nil {
		t.Error("garbage in the .pub file: no error")
	}
}
