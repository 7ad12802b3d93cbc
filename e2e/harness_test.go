// Package e2e drives the real tether and tether-edge binaries with real
// OpenSSH (ssh, scp, sshd from Debian) on loopback. Nothing is mocked.
package e2e

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"
)

var (
	binDir    string // built tether and tether-edge
	opKey     string // operator private key path
	opPub     string // operator public key path
	loginUser string
	sshdPath  = "/usr/sbin/sshd"
)

func TestMain(m *testing.M) {
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// Embedded SSH servers run commands with $SHELL, as sshd runs the login
	// shell. A developer's interactive shell start-up (bash sourcing
	// ~/.bashrc for ssh sessions, pyenv and the like) is not what these
	// tests measure, so agents get a plain POSIX shell.
	os.Setenv("SHELL", "/bin/sh")
	for _, tool := range []string{"ssh", "scp"} {
		if _, err := exec.LookPath(tool); err != nil {
			fmt.Fprintf(os.Stderr, "e2e: %s not found: install openssh-client (make test does this as root)\n", tool)
			return 1
		}
	}
	if _, err := os.Stat(sshdPath); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %s not found: install openssh-server (make test does this as root)\n", sshdPath)
		return 1
	}
	tmp, err := os.MkdirTemp("", "tether-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	binDir = filepath.Join(tmp, "bin")
	if dir := os.Getenv("TETHER_BIN_DIR"); dir != "" {
		// make test builds once and points here, so the binaries are not rebuilt.
		binDir = dir
	} else {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Dir(filepath.Dir(file))
		cmd := exec.Command("go", "build", "-o", binDir+"/", "./cmd/tether", "./cmd/tether-edge")
		cmd.Dir = root
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "e2e: build binaries:", err)
			return 1
		}
	}
	u, err := user.Current()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	loginUser = u.Username
	opKey = filepath.Join(tmp, "operator")
	opPub = opKey + ".pub"
	if out, err := exec.Command("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "e2e-operator", "-f", opKey).CombinedOutput(); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: ssh-keygen: %v: %s\n", err, out)
		return 1
	}
	return m.Run()
}

// proc is a started binary whose output goes to a log file.
type proc struct {
	t    *testing.T
	name string
	cmd  *exec.Cmd
	log  string
	done chan struct{}
	err  error
}

func start(t *testing.T, name string, bin string, args ...string) *proc {
	t.Helper()
	logPath := filepath.Join(t.TempDir(), name+".log")
	f, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", name, err)
	}
	p := &proc{t: t, name: name, cmd: cmd, log: logPath, done: make(chan struct{})}
	go func() { p.err = cmd.Wait(); f.Close(); close(p.done) }()
	t.Cleanup(func() {
		p.stop(syscall.SIGTERM)
		if t.Failed() {
			b, _ := os.ReadFile(logPath)
			t.Logf("---- %s log ----\n%s", name, tail(b, 6000))
		}
	})
	return p
}

func tail(b []byte, n int) []byte {
	if len(b) > n {
		return b[len(b)-n:]
	}
	return b
}

// stop signals the process and waits (SIGKILL after 10 s).
func (p *proc) stop(sig syscall.Signal) {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(sig)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
		<-p.done
	}
}

func (p *proc) exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

func (p *proc) logText() string {
	b, _ := os.ReadFile(p.log)
	return string(b)
}

// freePort returns a port free on 127.0.0.1 for both TCP and UDP.
func freePort(t *testing.T) int {
	t.Helper()
	for i := 0; i < 20; i++ {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		port := l.Addr().(*net.TCPAddr).Port
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		l.Close()
		if err == nil {
			u.Close()
			return port
		}
	}
	t.Fatal("no free TCP+UDP port")
	return 0
}

// waitFor polls cond until it is true or the timeout passes.
func waitFor(t *testing.T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if cond() {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s", timeout, what)
}

// waitForState is waitFor for a condition on a value that is shown when
// it times out.
func waitForState[T any](t *testing.T, what string, timeout time.Duration, get func() T, cond func(T) bool) T {
	t.Helper()
	deadline := time.Now().Add(timeout)
	var v T
	for time.Now().Before(deadline) {
		if v = get(); cond(v) {
			return v
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("timed out after %s waiting for %s; last seen: %+v", timeout, what, v)
	return v
}

// runCmd runs a command to completion with a timeout.
func runCmd(t *testing.T, timeout time.Duration, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code = 0
	if err != nil {
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else {
			t.Fatalf("%s %v: %v", bin, args, err)
		}
	}
	if ctx.Err() != nil {
		t.Fatalf("%s %v: timed out after %s\nstderr: %s", bin, args, timeout, e.String())
	}
	return o.String(), e.String(), code
}

// hub is a running hub plus the paths tests need.
type hub struct {
	t         *testing.T
	dataDir   string
	apiPort   int
	sshPort   int
	extraArgs []string // more `tether hub` flags
	p         *proc
}

func (h *hub) apiAddr() string { return fmt.Sprintf("127.0.0.1:%d", h.apiPort) }
func (h *hub) sshAddr() string { return fmt.Sprintf("127.0.0.1:%d", h.sshPort) }

func startHub(t *testing.T) *hub {
	t.Helper()
	h := &hub{t: t, dataDir: filepath.Join(t.TempDir(), "hub"), apiPort: freePort(t), sshPort: freePort(t)}
	h.start()
	return h
}

func (h *hub) start() {
	t := h.t
	t.Helper()
	h.p = start(t, "hub", filepath.Join(binDir, "tether"), append([]string{"hub", "--data-dir", h.dataDir,
		"--listen", h.apiAddr(), "--ssh-listen", h.sshAddr(), "--log-level", "debug"}, h.extraArgs...)...)
	waitFor(t, "hub to listen", 20*time.Second, func() bool {
		if h.p.exited() {
			t.Fatalf("hub exited: %v\n%s", h.p.err, h.p.logText())
		}
		// hub.json names the pid of the hub that wrote it; a stale one from a
		// killed hub does not count.
		b, err := os.ReadFile(filepath.Join(h.dataDir, "hub.json"))
		var info struct{ PID int }
		return err == nil && json.Unmarshal(b, &info) == nil && info.PID == h.p.cmd.Process.Pid
	})
}

// cli runs `tether ARGS --data-dir D` and fails the test on error.
func (h *hub) cli(args ...string) string {
	h.t.Helper()
	out, errOut, code := runCmd(h.t, 30*time.Second, filepath.Join(binDir, "tether"), append(args, "--data-dir", h.dataDir)...)
	if code != 0 {
		h.t.Fatalf("tether %v: exit %d: %s", args, code, errOut)
	}
	return out
}

func (h *hub) token(args ...string) string {
	h.t.Helper()
	return strings.TrimSpace(h.cli(append([]string{"token", "create"}, args...)...))
}

type nodeJSON struct {
	ID           string            `json:"id"`
	Name         string            `json:"name"`
	Labels       map[string]string `json:"labels"`
	Online       bool              `json:"online"`
	Transport    string            `json:"transport"`
	AgentVersion string            `json:"agent_version"`
	OS           string            `json:"os"`
	LastSeen     time.Time         `json:"last_seen"`
}

func (h *hub) nodes() map[string]nodeJSON {
	h.t.Helper()
	var list []nodeJSON
	if err := json.Unmarshal([]byte(h.cli("nodes", "-o", "json")), &list); err != nil {
		h.t.Fatal(err)
	}
	m := map[string]nodeJSON{}
	for _, n := range list {
		m[n.Name] = n
	}
	return m
}

func (h *hub) waitOnline(name, transport string) {
	h.t.Helper()
	waitFor(h.t, name+" online over "+transport, 30*time.Second, func() bool {
		n, ok := h.nodes()[name]
		return ok && n.Online && (transport == "" || n.Transport == transport)
	})
}

// connects counts the sessions the hub has registered for node so far.
func (h *hub) connects(node string) int {
	return logCount(h.p.logText(), "node connected", node)
}

// waitConnected waits until the hub has registered more than before
// sessions for node (a new connection, not a stale one still online) and
// shows it online.
func (h *hub) waitConnected(node string, before int) {
	h.t.Helper()
	waitFor(h.t, node+" to connect again", 30*time.Second, func() bool { return h.connects(node) > before })
	h.waitOnline(node, "")
}

func (h *hub) hostPublicKey() gossh.PublicKey {
	return readHostPub(h.t, filepath.Join(h.dataDir, "ssh_host_ed25519_key"))
}

func readHostPub(t *testing.T, path string) gossh.PublicKey {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	s, err := gossh.ParsePrivateKey(b)
	if err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return s.PublicKey()
}

// agent starts tether-edge run for a node.
func startAgent(t *testing.T, join, name string, extra ...string) (*proc, string) {
	t.Helper()
	stateDir := filepath.Join(t.TempDir(), name)
	args := append([]string{"run", "--join", join, "--state-dir", stateDir, "--name", name,
		"--backoff-max", "2s", "--log-level", "debug"}, extra...)
	return start(t, "agent-"+name, filepath.Join(binDir, "tether-edge"), args...), stateDir
}

// sshd is a real OpenSSH server on loopback acting as a node's local sshd.
type sshd struct {
	port    int
	hostPub gossh.PublicKey
	dir     string // config, keys, and the Include'd sshd_config.d/
	hostKey string
	pidFile string
	config  string
}

// managedArgs are the tether-edge flags that let the agent manage this sshd.
func (s *sshd) managedArgs() []string {
	return []string{"--ssh", fmt.Sprintf("127.0.0.1:%d", s.port), "--manage-sshd", "--sshd-host-key", s.hostKey,
		"--sshd-dir", filepath.Join(s.dir, "tether"), "--sshd-drop-in", filepath.Join(s.dir, "sshd_config.d", "50-tether.conf"),
		"--sshd-config", s.config, "--sshd-pid-file", s.pidFile}
}

// startSSHD starts a loopback sshd; extra config lines come first (so they
// win over the defaults below, as sshd keeps the first value).
func startSSHD(t *testing.T, extra ...string) *sshd {
	t.Helper()
	if os.Geteuid() == 0 {
		_ = os.MkdirAll("/run/sshd", 0o755) // privilege separation dir
	}
	dir := t.TempDir()
	// sshd reads principals files as the login user, as it would in /etc/ssh.
	os.Chmod(dir, 0o755)
	_, priv, _ := ed25519.GenerateKey(rand.Reader)
	block, err := gossh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	hostKey := filepath.Join(dir, "ssh_host_ed25519_key")
	if err := os.WriteFile(hostKey, pem.EncodeToMemory(block), 0o600); err != nil {
		t.Fatal(err)
	}
	signer, _ := gossh.NewSignerFromKey(priv)
	os.WriteFile(hostKey+".pub", gossh.MarshalAuthorizedKey(signer.PublicKey()), 0o644)
	os.MkdirAll(filepath.Join(dir, "sshd_config.d"), 0o755)
	pubBytes, _ := os.ReadFile(opPub)
	ak := filepath.Join(dir, "authorized_keys")
	os.WriteFile(ak, pubBytes, 0o600)
	port := freePort(t)
	cfg := filepath.Join(dir, "sshd_config")
	os.WriteFile(cfg, []byte(fmt.Sprintf(`Include %s/sshd_config.d/*.conf
%s
Port %d
ListenAddress 127.0.0.1
HostKey %s
AuthorizedKeysFile %s
PidFile none
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
Subsystem sftp internal-sftp
LogLevel VERBOSE
# bash sources ~/.bashrc for sshd sessions; a developer's (pyenv and the
# like) is not what these tests measure.
SetEnv HOME=%s
`, dir, strings.Join(extra, "\n"), port, hostKey, ak, dir)), 0o600)
	p := start(t, "sshd", sshdPath, "-D", "-e", "-f", cfg)
	pidFile := filepath.Join(dir, "sshd.pid")
	os.WriteFile(pidFile, []byte(fmt.Sprint(p.cmd.Process.Pid)), 0o644)
	waitFor(t, "sshd to listen", 10*time.Second, func() bool {
		if p.exited() {
			t.Fatalf("sshd exited: %s", p.logText())
		}
		c, err := net.Dial("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return &sshd{port: port, hostPub: signer.PublicKey(), dir: dir, hostKey: hostKey, pidFile: pidFile, config: cfg}
}

// sshClient writes an ssh_config with strict host key checking against a
// known_hosts file the test controls: no trust-on-first-use anywhere.
type sshClient struct {
	operator string // bastion login
	t        *testing.T
	h        *hub
	cfg      string
	known    string
	mu       sync.Mutex
}

func newSSHClient(t *testing.T, h *hub) *sshClient {
	return newSSHClientAs(t, h, "alice", opKey)
}

// newSSHClientAs is an ssh client for operator name with the given key.
func newSSHClientAs(t *testing.T, h *hub, operator, key string) *sshClient {
	dir := t.TempDir()
	c := &sshClient{t: t, h: h, operator: operator, cfg: filepath.Join(dir, "ssh_config"), known: filepath.Join(dir, "known_hosts")}
	// The real `tether config ssh` output: hub host CA as @cert-authority,
	// strict checking, nothing learned on first use.
	generated := h.cli("config", "ssh", "--user", operator, "--known-hosts", c.known, "--identity-file", key)
	os.WriteFile(c.cfg, []byte(generated+fmt.Sprintf(`Host *
  IdentityFile %s
  IdentitiesOnly yes
  UserKnownHostsFile %s
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 10
`, key, c.known)), 0o600)
	return c
}

func (c *sshClient) trust(host string, key gossh.PublicKey) {
	c.mu.Lock()
	defer c.mu.Unlock()
	f, err := os.OpenFile(c.known, os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		c.t.Fatal(err)
	}
	defer f.Close()
	fmt.Fprintf(f, "%s %s", host, gossh.MarshalAuthorizedKey(key))
}

// jumpArgs are the ssh arguments for plain `ssh -J alice@HUB login@NODE.tether`;
// hub and node are both verified by their host certificates.
func (c *sshClient) jumpArgs(node string, extra ...string) []string {
	return append([]string{"-F", c.cfg, "-J", c.operator + "@" + c.h.sshAddr()}, append(extra, loginUser+"@"+node+".tether")...)
}

func (c *sshClient) run(timeout time.Duration, node string, command ...string) (string, string, int) {
	c.t.Helper()
	return runCmd(c.t, timeout, "ssh", append(c.jumpArgs(node), command...)...)
}
