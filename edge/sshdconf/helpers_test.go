package sshdconf

import (
	"bufio"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/crypto/ssh"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// sshdPath is the real OpenSSH server. It must be an absolute path: sshd
// re-executes itself from argv[0] on every connection and on SIGHUP.
const sshdPath = "/usr/sbin/sshd"

// hostPrincipal is the name the host certificate is issued for, and the
// HostKeyAlias the client checks it against.
const hostPrincipal = "n1"

// needOpenSSH fails the test when the OpenSSH binaries are missing.
func needOpenSSH(t *testing.T) {
	t.Helper()
	if _, err := os.Stat(sshdPath); err != nil {
		t.Fatalf("%s not found: install openssh-server", sshdPath)
	}
	for _, tool := range []string{"ssh", "ssh-keygen"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Fatalf("%s not found: install openssh-client", tool)
		}
	}
}

// testKey is an ed25519 key pair, optionally written as OpenSSH files.
type testKey struct {
	signer ssh.Signer
	priv   ed25519.PrivateKey
	path   string // private key file (mode 0600), "" if not written
}

func (k *testKey) pub() ssh.PublicKey { return k.signer.PublicKey() }

func newKey(t *testing.T) *testKey {
	t.Helper()
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		t.Fatal(err)
	}
	return &testKey{signer: signer, priv: priv}
}

// newKeyFile makes a key and writes path (private, 0600) and path.pub.
func newKeyFile(t *testing.T, path string) *testKey {
	t.Helper()
	k := newKey(t)
	block, err := ssh.MarshalPrivateKey(k.priv, filepath.Base(path))
	if err != nil {
		t.Fatal(err)
	}
	writeFile(t, path, pem.EncodeToMemory(block), 0o600)
	writeFile(t, path+".pub", ssh.MarshalAuthorizedKey(k.pub()), 0o644)
	k.path = path
	return k
}

func writeFile(t *testing.T, path string, data []byte, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, data, mode); err != nil {
		t.Fatal(err)
	}
}

// certOpts tweaks signCert.
type certOpts struct {
	validAfter, validBefore time.Time // zero: one hour around now
}

// signCert certifies pub with ca for principals.
func signCert(t *testing.T, ca *testKey, pub ssh.PublicKey, typ uint32, principals []string, o certOpts) *ssh.Certificate {
	t.Helper()
	now := time.Now()
	if o.validAfter.IsZero() {
		o.validAfter = now.Add(-time.Hour)
	}
	if o.validBefore.IsZero() {
		o.validBefore = now.Add(time.Hour)
	}
	c := &ssh.Certificate{
		Key:             pub,
		Serial:          uint64(now.UnixNano()),
		CertType:        typ,
		KeyId:           "test-" + principals[0],
		ValidPrincipals: principals,
		ValidAfter:      uint64(o.validAfter.Unix()),
		ValidBefore:     uint64(o.validBefore.Unix()),
	}
	if typ == ssh.UserCert {
		c.Permissions.Extensions = map[string]string{"permit-pty": ""}
	}
	if err := c.SignCert(rand.Reader, ca.signer); err != nil {
		t.Fatal(err)
	}
	return c
}

// currentUser is the login name sshd authenticates the test client as.
func currentUser(t *testing.T) string {
	t.Helper()
	u, err := user.Current()
	if err != nil {
		t.Fatal(err)
	}
	return u.Username
}

// sshdEnv is a real sshd on 127.0.0.1 configured through Apply: its main
// config includes dir/sshd_config.d/*.conf, where Paths.DropIn lives.
type sshdEnv struct {
	t       *testing.T
	dir     string
	paths   Paths
	cfg     string   // main sshd_config
	hostKey *testKey // sshd's host key, at paths.HostKey
	hostCA  *testKey
	userCA  *testKey
	user    string
	port    int

	cmd  *exec.Cmd
	logs *lineLog
	done chan struct{} // closed when sshd has exited and its log is drained
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
		hostCA: newKey(t),
		userCA: newKey(t),
		user:   currentUser(t),
	}
	e.hostKey = newKeyFile(t, e.paths.HostKey)
	return e
}

// files is the regular input of Apply: a host cert from hostCA for
// "n1", userCA trusted, the given keys revoked.
func (e *sshdEnv) files(revoked ...ssh.PublicKey) Files {
	return Files{
		HostCert:    signCert(e.t, e.hostCA, e.hostKey.pub(), ssh.HostCert, []string{hostPrincipal}, certOpts{}),
		UserCAs:     []ssh.PublicKey{e.userCA.pub()},
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

// writeConfig writes the main sshd_config for port.
func (e *sshdEnv) writeConfig(port int) {
	e.t.Helper()
	cfg := fmt.Sprintf(`# sshd for the sshdconf tests
Include %s/*.conf
Port %d
ListenAddress 127.0.0.1
HostKey %s
PidFile %s
UsePAM no
StrictModes no
AuthorizedKeysFile none
PasswordAuthentication no
KbdInteractiveAuthentication no
PubkeyAuthentication yes
PermitRootLogin prohibit-password
LogLevel VERBOSE
`, filepath.Dir(e.paths.DropIn), port, e.paths.HostKey, filepath.Join(e.dir, "sshd.pid"))
	writeFile(e.t, e.cfg, []byte(cfg), 0o644)
}

// start runs `sshd -D -e -f cfg` on a free port and waits until it listens.
// The port is picked by binding :0 and closing, so another process may grab
// it first: sshd then exits and start tries another port.
func (e *sshdEnv) start() {
	e.t.Helper()
	if os.Geteuid() == 0 {
		// sshd's privilege separation directory; Debian creates it at boot.
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			e.t.Fatal(err)
		}
	}
	var err error
	for range 3 {
		if err = e.tryStart(freePort(e.t)); err == nil {
			return
		}
		e.t.Logf("sshd did not start: %v", err)
	}
	e.t.Fatalf("sshd did not start: %v", err)
}

func (e *sshdEnv) tryStart(port int) error {
	e.writeConfig(port)
	cmd := exec.Command(sshdPath, "-D", "-e", "-f", e.cfg)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return err
	}
	if err := cmd.Start(); err != nil {
		return err
	}
	logs := newLineLog(e.t)
	done := make(chan struct{})
	go func() {
		defer close(done)
		logs.copy(stderr)
		cmd.Wait()
	}()
	if err := logs.wait(done, "Server listening on", 1, 10*time.Second); err != nil {
		cmd.Process.Kill()
		<-done
		return err
	}
	e.port, e.cmd, e.logs, e.done = port, cmd, logs, done
	e.t.Cleanup(func() {
		if e.t.Failed() {
			e.t.Logf("sshd log:\n%s", logs)
		}
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	return nil
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// reload sends SIGHUP through SignalReloader and waits for the re-executed
// sshd to listen again.
func (e *sshdEnv) reload() {
	e.t.Helper()
	n := e.logs.count("Server listening on")
	if err := SignalReloader(e.cmd.Process.Pid)(context.Background()); err != nil {
		e.t.Fatal(err)
	}
	if err := e.logs.wait(e.done, "Server listening on", n+1, 10*time.Second); err != nil {
		e.t.Fatalf("sshd after SIGHUP: %v", err)
	}
}

// client is what the ssh client logs in with and trusts.
type client struct {
	key        *testKey // private key file
	cert       string   // CertificateFile, "" for none
	knownHosts string   // UserKnownHostsFile
}

// newClient writes an operator key and a user certificate for it, signed
// by ca for the current user, and a known_hosts that trusts hostCA for n1.
func (e *sshdEnv) newClient(name string, ca *testKey, o certOpts) *client {
	e.t.Helper()
	dir := filepath.Join(e.dir, "client-"+name)
	key := newKeyFile(e.t, filepath.Join(dir, "id_ed25519"))
	cert := signCert(e.t, ca, key.pub(), ssh.UserCert, []string{e.user}, o)
	certPath := key.path + "-cert.pub"
	writeFile(e.t, certPath, ssh.MarshalAuthorizedKey(cert), 0o644)
	return &client{key: key, cert: certPath, knownHosts: e.knownHosts(name, e.hostCA)}
}

// knownHosts writes a known_hosts file trusting ca for hostPrincipal.
func (e *sshdEnv) knownHosts(name string, ca *testKey) string {
	e.t.Helper()
	path := filepath.Join(e.dir, "known_hosts-"+name)
	line := fmt.Sprintf("@cert-authority %s %s", hostPrincipal, ssh.MarshalAuthorizedKey(ca.pub()))
	writeFile(e.t, path, []byte(line), 0o644)
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
		"-i", c.key.path,
	}
	if c.cert != "" {
		args = append(args, "-o", "CertificateFile="+c.cert)
	}
	return append(args, "-p", fmt.Sprint(e.port), e.user+"@127.0.0.1")
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

// lineLog collects sshd's stderr, logs it to the test, and lets tests wait
// for a line.
type lineLog struct {
	t       *testing.T
	mu      sync.Mutex // guards the following fields
	lines   []string
	changed chan struct{} // closed and replaced on every new line
}

func newLineLog(t *testing.T) *lineLog {
	return &lineLog{t: t, changed: make(chan struct{})}
}

func (l *lineLog) copy(r interface{ Read([]byte) (int, error) }) {
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		l.mu.Lock()
		l.lines = append(l.lines, sc.Text())
		close(l.changed)
		l.changed = make(chan struct{})
		l.mu.Unlock()
	}
}

// count returns how many lines so far contain sub.
func (l *lineLog) count(sub string) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.countLocked(sub)
}

func (l *lineLog) countLocked(sub string) int {
	n := 0
	for _, line := range l.lines {
		if strings.Contains(line, sub) {
			n++
		}
	}
	return n
}

// wait blocks until n lines contain sub, done is closed, or timeout.
func (l *lineLog) wait(done <-chan struct{}, sub string, n int, timeout time.Duration) error {
	deadline := time.After(timeout)
	for {
		l.mu.Lock()
		got, changed := l.countLocked(sub), l.changed
		l.mu.Unlock()
		if got >= n {
			return nil
		}
		select {
		case <-changed:
		case <-done:
			return fmt.Errorf("sshd exited waiting for %q:\n%s", sub, l.String())
		case <-deadline:
			return fmt.Errorf("timed out waiting for %q:\n%s", sub, l.String())
		}
	}
}

// contains reports whether any line contains sub.
func (l *lineLog) contains(sub string) bool { return l.count(sub) > 0 }

func (l *lineLog) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return strings.Join(l.lines, "\n")
}

// errorsIs is errors.Is with a friendlier failure.
func errorsIs(t *testing.T, err, target error) {
	t.Helper()
	if !errors.Is(err, target) {
		t.Fatalf("error %v, want %v", err, target)
	}
}
