package sshdconf

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// hostPrincipal is the name the host certificate is issued for, and the
// HostKeyAlias the client checks it against.
const hostPrincipal = "n1"

// needOpenSSH fails the test when the OpenSSH binaries are missing.
func needOpenSSH(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(testenv.SSHDPath); err != nil {
		t.Fatalf("%s not found: install openssh-server", testenv.SSHDPath)
	}
	for _, tool := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install openssh-client", tool)
		}
	}
}

// sshdEnv is a real sshd on 127.0.0.1 configured through Apply: its main
// config includes dir/sshd_config.d/*.conf, where Paths.DropIn lives.
type sshdEnv struct {
	t       *testing.T
	dir     string
	paths   Paths
	cfg     string       // main sshd_config
	hostKey *testenv.Key // sshd's host key, at paths.HostKey
	hostCA  *testenv.Key
	userCA  *testenv.Key
	user    string
	sshd    *testenv.SSHD // once started
}

func newSSHDEnv(t *testing.T) *sshdEnv {
	t.Helper()
	needOpenSSH(t)
	dir := t.TempDir()
	e := &sshdEnv{
		t:   t,
		dir: dir,
		paths: Paths{
			Dir:     filepath.Join(dir, "tether"),
			DropIn:  filepath.Join(dir, "sshd_config.d", "50-tether.conf"),
			HostKey: filepath.Join(dir, "ssh_host_ed25519_key"),
		},
		cfg:    filepath.Join(dir, "sshd_config"),
		hostCA: testenv.NewKey(t),
		userCA: testenv.NewKey(t),
		user:   testenv.LoginName(),
	}
	e.hostKey = testenv.NewKeyFile(t, e.paths.HostKey)
	return e
}

// files is the regular input of Apply: a host cert from hostCA for
// "n1", userCA trusted, the given keys revoked.
func (e *sshdEnv) files(revoked ...ssh.PublicKey) Files {
	return Files{
		HostCert: testenv.SignCert(
			e.t, e.hostCA, e.hostKey.Pub(), ssh.HostCert, testenv.CertOpts{Principals: []string{hostPrincipal}},
		),
		UserCAs:     []ssh.PublicKey{e.userCA.Pub()},
		RevokedKeys: revoked,
	}
}

func (e *sshdEnv) apply(f Files) bool {
	e.t.Helper()
	changed, err := Apply(e.paths, f)
	if err != nil {
		e.t.Fatalf("Apply: %v", err)
	}
	return changed
}

// sshdConfig is the main sshd_config: the drop-in's directory included
// first, no authorized_keys (certificates only).
func (e *sshdEnv) sshdConfig() testenv.SSHDConfig {
	return testenv.SSHDConfig{
		Dir:     e.dir,
		Include: filepath.Join(filepath.Dir(e.paths.DropIn), "*.conf"),
		HostKey: e.hostKey,
	}
}

// writeConfig writes the main sshd_config for port.
func (e *sshdEnv) writeConfig(port int) {
	e.t.Helper()
	cfg := e.sshdConfig()
	path, err := testenv.WriteSSHDConfig(&cfg, port)
	if err != nil {
		e.t.Fatal(err)
	}
	e.cfg = path
}

// start runs sshd on a free port and waits until it listens.
func (e *sshdEnv) start() {
	e.t.Helper()
	e.sshd = testenv.StartSSHD(e.t, e.sshdConfig())
	e.cfg = e.sshd.Config
}

// reload sends SIGHUP through SignalReloader and waits for the re-executed
// sshd to listen again.
func (e *sshdEnv) reload() {
	e.t.Helper()
	n := e.sshd.LogCount("Server listening on")
	if err := SignalReloader(e.sshd.PID())(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	if err := e.sshd.WaitLog("Server listening on", n+1, 10*time.Second); err != nil {
		e.t.Fatalf("sshd after SIGHUP: %v", err)
	}
}

// client is what the ssh client logs in with and trusts.
type client struct {
	key        *testenv.Key // private key file
	cert       string       // CertificateFile, "" for none
	knownHosts string       // UserKnownHostsFile
}

// newClient writes an operator key and a user certificate for it, signed
// by ca for the current user (unless o names other principals), and a
// known_hosts that trusts hostCA for n1.
func (e *sshdEnv) newClient(name string, ca *testenv.Key, o testenv.CertOpts) *client {
	e.t.Helper()
	dir := filepath.Join(e.dir, "client-"+name)
	key := testenv.NewKeyFile(e.t, filepath.Join(dir, "id_ed25519"))
	if o.Principals == nil {
		o.Principals = []string{e.user}
	}
	cert := testenv.SignCert(e.t, ca, key.Pub(), ssh.UserCert, o)
	certPath := key.Path + "-cert.pub"
	testenv.WriteFile(e.t, certPath, ssh.MarshalAuthorizedKey(cert), 0o644)
	return &client{key: key, cert: certPath, knownHosts: e.knownHosts(name, e.hostCA)}
}

// knownHosts writes a known_hosts file trusting ca for hostPrincipal.
func (e *sshdEnv) knownHosts(name string, ca *testenv.Key) string {
	e.t.Helper()
	path := filepath.Join(e.dir, "known_hosts-"+name)
	line := fmt.Sprintf("@cert-authority %s %s", hostPrincipal, ssh.MarshalAuthorizedKey(ca.Pub()))
	testenv.WriteFile(e.t, path, []byte(line), 0o644)
	return path
}

// ssh runs `ssh ... user@127.0.0.1 true` with the real client and returns
// its combined output.
func (e *sshdEnv) ssh(c *client) (string, error) {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, "ssh", append(e.sshArgs(c), "true")...)
	out, err := cmd.CombinedOutput()
	if ctx.Err() != nil {
		e.t.Fatalf("ssh timed out: %s", out)
	}
	return string(out), err
}

// sshArgs are the ssh arguments up to the remote command. The agent socket
// is ignored through IdentitiesOnly.
func (e *sshdEnv) sshArgs(c *client) []string {
	args := []string{
		"-F", "/dev/null",
		"-o", "BatchMode=yes",
		"-o", "IdentitiesOnly=yes",
		"-o", "ConnectTimeout=5",
		"-o", "StrictHostKeyChecking=yes",
		"-o", "UserKnownHostsFile=" + c.knownHosts,
		"-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "HostKeyAlias=" + hostPrincipal,
		"-o", "PreferredAuthentications=publickey",
		"-i", c.key.Path,
	}
	if c.cert != "" {
		args = append(args, "-o", "CertificateFile="+c.cert)
	}
	return append(args, "-p", fmt.Sprint(e.sshd.Port), e.user+"@127.0.0.1")
}

// mustLogin asserts that c logs in.
func (e *sshdEnv) mustLogin(c *client) {
	e.t.Helper()
	if out, err := e.ssh(c); err != nil {
		e.t.Fatalf("ssh failed: %v\n%s", err, out)
	}
}

// mustFail asserts that ssh fails with want in its output.
func (e *sshdEnv) mustFail(c *client, want string) {
	e.t.Helper()
	out, err := e.ssh(c)
	if err == nil {
		e.t.Fatalf("ssh succeeded, want failure %q\n%s", want, out)
	}
	if !strings.Contains(out, want) {
		e.t.Fatalf("ssh failed without %q: %v\n%s", want, err, out)
	}
}

// errorsIs is errors.Is with a friendlier failure.
func errorsIs(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want %v", err, target)
	}
}
