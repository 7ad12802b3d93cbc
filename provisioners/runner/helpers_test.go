package runner

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"
	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/edge/sshserver"
	"github.com/tether-dev/tether/internal/testenv"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// testNodeName is the node every test server is certified as.
const testNodeName = "node1"

// certOpts shapes a test certificate.
type certOpts struct {
	principals []string
	expired    bool
}

func signCert(t *testing.T, ca *testenv.Key, pub ssh.PublicKey, typ uint32, o certOpts) *ssh.Certificate {
	t.Helper()
	co := testenv.CertOpts{Principals: o.principals}
	if o.expired {
		co.ValidAfter, co.ValidBefore = testenv.Expired()
	}
	return testenv.SignCert(t, ca, pub, typ, co)
}

// hostCertKind selects what host key a test server presents.
type hostCertKind int

const (
	hostCertOK      hostCertKind = iota // from the trusted CA, for node1 and node1.tether
	hostCertNone                        // plain host key only
	hostCertRogue                       // from another CA
	hostCertExpired                     // from the trusted CA, expired
)

// testServer is an SSH server certified as testNodeName, trusting userCA
// for user certificates with the principal login.
type testServer struct {
	kind   string // "embedded" or "sshd"
	hostCA *testenv.Key
	userCA *testenv.Key
	login  string
	dials  atomic.Int32

	mu    sync.Mutex
	conns []net.Conn // every hub-side conn handed out, for dropConns
	dial  func(ctx context.Context) (net.Conn, error)
}

// Dial is the server's DialFunc; it ignores the node name, so connecting
// as another name reaches the same server.
func (s *testServer) Dial(ctx context.Context, node string) (net.Conn, error) {
	s.dials.Add(1)
	c, err := s.dial(ctx)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	s.conns = append(s.conns, c)
	s.mu.Unlock()
	return c, nil
}

// dropConns closes every hub-side connection, as when the tunnel breaks.
func (s *testServer) dropConns() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.conns {
		c.Close()
	}
}

// servers lists the server kinds every behavioural test runs against.
var serverKinds = []string{"embedded", "sshd"}

func newServer(t *testing.T, kind string, hc hostCertKind) *testServer {
	t.Helper()
	s := &testServer{kind: kind, hostCA: testenv.NewKey(t), userCA: testenv.NewKey(t), login: testenv.LoginName()}
	switch kind {
	case "embedded":
		s.startEmbedded(t, hc)
	case "sshd":
		s.startSSHD(t, hc)
	default:
		t.Fatalf("unknown server kind %q", kind)
	}
	return s
}

// forEachServer runs f as a subtest against each server kind.
func forEachServer(t *testing.T, f func(t *testing.T, s *testServer)) {
	for _, kind := range serverKinds {
		t.Run(kind, func(t *testing.T) { f(t, newServer(t, kind, hostCertOK)) })
	}
}

func (s *testServer) hostCert(t *testing.T, hostKey ssh.PublicKey, hc hostCertKind) *ssh.Certificate {
	t.Helper()
	o := certOpts{principals: []string{testNodeName, testNodeName + ".tether"}}
	switch hc {
	case hostCertNone:
		return nil
	case hostCertRogue:
		return signCert(t, testenv.NewKey(t), hostKey, ssh.HostCert, o)
	case hostCertExpired:
		o.expired = true
	}
	return signCert(t, s.hostCA, hostKey, ssh.HostCert, o)
}

// startEmbedded serves edge/sshserver in-process over net.Pipe, as the
// agent serves tunnel streams.
func (s *testServer) startEmbedded(t *testing.T, hc hostCertKind) {
	t.Helper()
	srv, err := sshserver.New(sshserver.Config{
		HostKeyPath: filepath.Join(t.TempDir(), "host_key"),
		Shell:       "/bin/sh",
		Logger:      testenv.Logger(t).With("side", "server"),
	})
	if err != nil {
		t.Fatal(err)
	}
	if cert := s.hostCert(t, srv.HostSigner().PublicKey(), hc); cert != nil {
		if err := srv.AddHostCertificate(cert); err != nil {
			t.Fatal(err)
		}
	}
	srv.SetTrustedUserCAs([]ssh.PublicKey{s.userCA.Pub()})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	s.dial = func(context.Context) (net.Conn, error) {
		hub, agent, err := socketPair()
		if err != nil {
			return nil, err
		}
		wg.Go(func() { srv.ServeConn(ctx, agent) })
		return hub, nil
	}
	t.Cleanup(func() {
		srv.Close()
		cancel()
		wg.Wait()
	})
}

// socketPair returns the two ends of a connected Unix socket pair: a
// buffered in-process stream like a tunnel stream. (net.Pipe is not: both
// SSH sides write their version line first and would block each other.)
func socketPair() (net.Conn, net.Conn, error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	var conns [2]net.Conn
	for i, fd := range fds {
		f := os.NewFile(uintptr(fd), "socketpair")
		c, err := net.FileConn(f) // dups the descriptor
		f.Close()
		if err != nil {
			if i == 1 {
				conns[0].Close()
			} else {
				syscall.Close(fds[1])
			}
			return nil, nil, err
		}
		conns[i] = c
	}
	return conns[0], conns[1], nil
}

// startSSHD runs the real OpenSSH sshd on 127.0.0.1 with a host
// certificate, the test user CA and internal-sftp.
func (s *testServer) startSSHD(t *testing.T, hc hostCertKind) {
	t.Helper()
	dir := t.TempDir()
	hostKey := testenv.NewKeyFile(t, filepath.Join(dir, "host_key"))
	d := testenv.StartSSHD(t, testenv.SSHDConfig{Dir: dir, HostKey: hostKey, HostCert: s.hostCert(t, hostKey.Pub(), hc),
		TrustedUserCAs: []ssh.PublicKey{s.userCA.Pub()}})
	s.dial = func(ctx context.Context) (net.Conn, error) {
		var d2 net.Dialer
		return d2.DialContext(ctx, "tcp", d.Addr)
	}
}

// auth returns a user certificate from ca for the server's login.
func (s *testServer) auth(t *testing.T, ca *testenv.Key, o certOpts) Auth {
	t.Helper()
	if o.principals == nil {
		o.principals = []string{s.login}
	}
	key := testenv.NewKey(t)
	cert := signCert(t, ca, key.Pub(), ssh.UserCert, o)
	signer, err := ssh.NewCertSigner(cert, key.Signer)
	if err != nil {
		t.Fatal(err)
	}
	return Auth{Login: s.login, Signer: signer}
}

// runner returns a Runner dialing s and trusting its host CA.
func (s *testServer) runner(t *testing.T, configure ...func(*Config)) *Runner {
	t.Helper()
	cfg := Config{
		Dial:      s.Dial,
		HostCAs:   func() []ssh.PublicKey { return []ssh.PublicKey{s.hostCA.Pub()} },
		KillGrace: 10 * time.Second,
		Logger:    testenv.Logger(t).With("side", "runner"),
	}
	for _, f := range configure {
		f(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// connect returns a Client for testNodeName, closed at cleanup.
func (s *testServer) connect(t *testing.T) *Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c, err := s.runner(t).Connect(ctx, testNodeName, s.auth(t, s.userCA, certOpts{}))
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// run runs cmd with a generous timeout and returns its output.
func run(t *testing.T, c *Client, cmd Command) (Result, string, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var stdout, stderr bytes.Buffer
	res, err := c.Run(ctx, cmd, &stdout, &stderr)
	return res, stdout.String(), stderr.String(), err
}

// mustRun runs a command that must succeed and returns its stdout.
func mustRun(t *testing.T, c *Client, line string) string {
	t.Helper()
	res, out, errOut, err := run(t, c, Command{Line: line})
	if err != nil || res.ExitCode != 0 {
		t.Fatalf("%q: %+v, %v; stderr %q", line, res, err, errOut)
	}
	return out
}

// readPids reads the pid file a test script writes, one pid per line.
func readPids(t *testing.T, path string) []int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		t.Fatal(err)
	}
	var pids []int
	for _, f := range strings.Fields(string(data)) {
		pid, err := strconv.Atoi(f)
		if err != nil {
			t.Fatalf("pid file %s: %q", path, data)
		}
		pids = append(pids, pid)
	}
	return pids
}

// readPidsNoFail is readPids for other goroutines: unreadable is empty.
func readPidsNoFail(path string) []string {
	data, _ := os.ReadFile(path)
	return strings.Fields(string(data))
}

// waitPids waits until path lists at least n pids.
func waitPids(t *testing.T, path string, n int) []int {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		if pids := readPids(t, path); len(pids) >= n {
			return pids
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("pid file %s did not reach %d pids: %v", path, n, readPids(t, path))
	return nil
}

// waitGone waits until none of pids runs.
func waitGone(t *testing.T, pids []int, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		var left []int
		for _, p := range pids {
			if testenv.ProcessAlive(p) {
				left = append(left, p)
			}
		}
		if len(left) == 0 {
			return
		}
		if time.Now().After(deadline) {
			for _, p := range left {
				cmdline, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p))
				t.Errorf(
					"process %d (%q) still running %v after the run ended",
					p, bytes.ReplaceAll(cmdline, []byte{0}, []byte{' '}), within,
				)
				syscall.Kill(p, syscall.SIGKILL) // do not leave it to the next test
			}
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// processesWithEnv lists running processes whose environment holds kv.
func processesWithEnv(kv string) []int {
	entries, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile("/proc/" + e.Name() + "/environ")
		if err != nil {
			continue
		}
		for _, v := range bytes.Split(env, []byte{0}) {
			if string(v) == kv && testenv.ProcessAlive(pid) {
				pids = append(pids, pid)
				break
			}
		}
	}
	return pids
}
