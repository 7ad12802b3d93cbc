// Package e2e drives the real tether and tether-edge binaries with real
// OpenSSH (ssh, scp, sshd from Debian) on loopback. Nothing is mocked.
package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
)

var (
	binDir    string // built tether and tether-edge
	opKey     string // operator private key path
	opPub     string // operator public key path
	loginUser string
	scratch   string // the run's temporary directory, removed at its end
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
	if _, err := os.Stat(testenv.SSHDPath); err != nil {
		fmt.Fprintf(os.Stderr, "e2e: %s not found: install openssh-server (make test does this as root)\n", testenv.SSHDPath)
		return 1
	}
	tmp, err := os.MkdirTemp("", "tether-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	defer os.RemoveAll(tmp)
	scratch = tmp
	if binDir, err = testenv.BinDir(tmp); err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	u, err := user.Current()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return 1
	}
	loginUser = u.Username
	// The file name is the key comment, which ssh-add -l shows.
	op, err := testenv.WriteKey(filepath.Join(tmp, "e2e-operator"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "e2e:", err)
		return 1
	}
	opKey, opPub = op.Path, op.Path+".pub"
	return m.Run()
}

// proc is a started binary whose output goes to a log file.
type proc = testenv.Proc

// start runs bin for the test (stopped at cleanup, its log shown if the
// test failed).
func start(t *testing.T, name string, bin string, args ...string) *proc {
	t.Helper()
	return testenv.Start(t, name, bin, args...)
}

// stopWait is how long a stopped process has before SIGKILL.
const stopWait = 10 * time.Second

// freePort returns a port free on 127.0.0.1 for both TCP and UDP.
var freePort = testenv.FreePort

// waitFor polls cond until it is true or the timeout passes.
var waitFor = testenv.WaitFor

// waitForState is waitFor for a condition on a value that is shown when
// it times out.
func waitForState[T any](t *testing.T, what string, timeout time.Duration, get func() T, cond func(T) bool) T {
	t.Helper()
	return testenv.WaitForValue(t, what, timeout, get, cond)
}

// runCmd runs a command to completion with a timeout.
func runCmd(t *testing.T, timeout time.Duration, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	stdout, stderr, code, err := runCmdErr(timeout, bin, args...)
	if err != nil {
		t.Fatal(err)
	}
	return stdout, stderr, code
}

// runCmdNoFatal is runCmd for a goroutine other than the test's, where
// t.Fatal must not be called: a command that did not run or timed out
// reports code -1 and the reason on stderr.
func runCmdNoFatal(timeout time.Duration, bin string, args ...string) (stdout, stderr string, code int) {
	stdout, stderr, code, err := runCmdErr(timeout, bin, args...)
	if err != nil {
		return stdout, err.Error(), -1
	}
	return stdout, stderr, code
}

func runCmdErr(timeout time.Duration, bin string, args ...string) (stdout, stderr string, code int, err error) {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	if err := cmd.Run(); err != nil {
		ee, ok := err.(*exec.ExitError)
		if !ok {
			return "", "", 0, fmt.Errorf("%s %v: %w", bin, args, err)
		}
		code = ee.ExitCode()
	}
	if ctx.Err() != nil {
		return "", "", 0, fmt.Errorf("%s %v: timed out after %s\nstderr: %s", bin, args, timeout, e.String())
	}
	return o.String(), e.String(), code, nil
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

// quickDeadPeer are the earlier liveness defaults (keepalives every 5 s, a
// peer silent for 15 s is dead), for tests that kill a hub or an agent
// without a goodbye and wait for the other side to notice: the defaults'
// 60 s would outlast their waits. A test that waits for agents to notice a
// killed hub gives them to the agents too: agents ping, and on QUIC their
// own timeout decides when they give a silent hub up.
var quickDeadPeer = []string{"--keepalive", "5s", "--dead-peer-timeout", "15s"}

func startHub(t *testing.T) *hub {
	t.Helper()
	return startHubIn(t, "", 0)
}

// startHubIn starts a hub with extra `tether hub` flags on dataDir ("": a
// new one) and the given API port (0: a free one).
func startHubIn(t *testing.T, dataDir string, apiPort int, args ...string) *hub {
	t.Helper()
	if dataDir == "" {
		dataDir = filepath.Join(t.TempDir(), "hub")
	}
	if apiPort == 0 {
		apiPort = freePort(t)
	}
	h := &hub{t: t, dataDir: dataDir, apiPort: apiPort, sshPort: freePort(t), extraArgs: args}
	h.start()
	return h
}

func (h *hub) start() {
	t := h.t
	t.Helper()
	h.p = start(t, "hub", filepath.Join(binDir, "tether"), append([]string{"hub"},
		testenv.HubArgs(h.dataDir, h.apiAddr(), h.sshAddr(), "debug", h.extraArgs...)...)...)
	if err := testenv.WaitHub(context.Background(), h.p, h.dataDir, 20*time.Second); err != nil {
		t.Fatalf("%v", err)
	}
}

// cli runs `tether ARGS --data-dir D` and fails the test on error.
func (h *hub) cli(args ...string) string {
	h.t.Helper()
	out, errOut, code := runCmd(h.t, 30*time.Second, filepath.Join(binDir, "tether"),
		append(args, "--data-dir", h.dataDir)...)
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

// waitOnline waits for node name to read online (over transport, "" for
// either). 60 s: after a hub was killed and restarted a QUIC agent hears of
// it only at its next heartbeat (every 20 s by default) and then backs off.
func (h *hub) waitOnline(name, transport string) {
	h.t.Helper()
	waitFor(h.t, name+" online over "+transport, 60*time.Second, func() bool {
		n, ok := h.nodes()[name]
		return ok && n.Online && (transport == "" || n.Transport == transport)
	})
}

// connects counts the sessions the hub has registered for node so far.
func (h *hub) connects(node string) int {
	return logCount(h.p.Log(), "node connected", node)
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
	args := testenv.AgentArgs(join, stateDir, name,
		append([]string{"--backoff-max", "2s", "--log-level", "debug"}, extra...)...)
	return start(t, "agent-"+name, filepath.Join(binDir, "tether-edge"), args...), stateDir
}

// sshd is a real OpenSSH server on loopback acting as a node's local sshd.
type sshd struct {
	*testenv.SSHD
	port    int
	hostPub gossh.PublicKey
	dir     string // config, keys, and the Include'd sshd_config.d/
}

// managedArgs are the tether-edge flags that let the agent manage this sshd.
func (s *sshd) managedArgs() []string {
	return []string{"--ssh", s.Addr, "--manage-sshd", "--sshd-host-key", s.HostKey.Path,
		"--sshd-dir", filepath.Join(s.dir, "tether"),
		"--sshd-drop-in", filepath.Join(s.dir, "sshd_config.d", "50-tether.conf"),
		"--sshd-config", s.Config, "--sshd-pid-file", s.PidFile}
}

// startSSHD starts a loopback sshd that lets the operator key in and
// includes the drop-in directory a managing agent writes; extra config
// lines win over the defaults.
func startSSHD(t *testing.T, extra ...string) *sshd {
	t.Helper()
	dir := t.TempDir()
	if err := os.MkdirAll(filepath.Join(dir, "sshd_config.d"), 0o755); err != nil {
		t.Fatal(err)
	}
	pub, err := os.ReadFile(opPub)
	if err != nil {
		t.Fatal(err)
	}
	s := testenv.StartSSHD(t, testenv.SSHDConfig{Dir: dir, Include: filepath.Join(dir, "sshd_config.d", "*.conf"),
		Lines: extra, AuthorizedKeys: pub})
	return &sshd{SSHD: s, port: s.Port, hostPub: s.HostKey.Pub(), dir: dir}
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
	c := &sshClient{t: t, h: h, operator: operator, cfg: filepath.Join(dir, "ssh_config"),
		known: filepath.Join(dir, "known_hosts")}
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
	return append([]string{"-F", c.cfg, "-J", c.operator + "@" + c.h.sshAddr()},
		append(extra, loginUser+"@"+node+".tether")...)
}

func (c *sshClient) run(timeout time.Duration, node string, command ...string) (string, string, int) {
	c.t.Helper()
	return runCmd(c.t, timeout, "ssh", append(c.jumpArgs(node), command...)...)
}
