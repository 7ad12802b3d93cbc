package sshserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
)

// testHost is the ssh_config Host alias of the test server.
const testHost = "node"

// testEnv is a Server fed by a loopback listener, plus an OpenSSH client
// configuration that trusts it and logs in with an authorized key.
type testEnv struct {
	t      *testing.T
	srv    *Server
	dir    string
	port   int
	config string       // ssh_config path, for ssh/scp/sftp -F
	key    *testenv.Key // authorized by default
}

// newTestEnv starts a server on 127.0.0.1 and writes the client side files.
// Cleanup closes everything and checks for leaked goroutines.
func newTestEnv(t *testing.T, configure ...func(*Config)) *testEnv {
	t.Helper()
	// Registered first, so it runs after every other cleanup.
	t.Cleanup(func() { goleak.VerifyNone(t) })
	dir := t.TempDir()
	cfg := Config{
		HostKeyPath: filepath.Join(dir, "host_key"),
		Shell:       "/bin/sh",
		Logger:      testenv.Logger(t),
	}
	for _, f := range configure {
		f(&cfg)
	}
	srv, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			wg.Go(func() { srv.ServeConn(ctx, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		srv.Close()
		cancel()
		wg.Wait()
	})

	e := &testEnv{t: t, srv: srv, dir: dir, port: ln.Addr().(*net.TCPAddr).Port}
	e.key = testenv.NewKeyFile(t, filepath.Join(dir, "id_operator"))
	srv.SetAuthorizedKeys([]gossh.PublicKey{e.key.Pub()})
	e.writeKnownHosts(fmt.Sprintf("[127.0.0.1]:%d %s", e.port, gossh.MarshalAuthorizedKey(srv.HostSigner().PublicKey())))
	e.config = filepath.Join(dir, "ssh_config")
	conf := fmt.Sprintf(`Host %s
  HostName 127.0.0.1
  Port %d
  User operator
  IdentityFile %s
  IdentitiesOnly yes
  IdentityAgent none
  UserKnownHostsFile %s
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  CheckHostIP no
  UpdateHostKeys no
  BatchMode yes
  PasswordAuthentication no
  KbdInteractiveAuthentication no
  ControlMaster no
  ControlPath none
  ConnectTimeout 10
  LogLevel ERROR
`, testHost, e.port, e.key.Path, filepath.Join(dir, "known_hosts"))
	if err := os.WriteFile(e.config, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	return e
}

func (e *testEnv) writeKnownHosts(lines ...string) {
	e.t.Helper()
	data := strings.Join(lines, "\n") + "\n"
	if err := os.WriteFile(filepath.Join(e.dir, "known_hosts"), []byte(data), 0o600); err != nil {
		e.t.Fatal(err)
	}
}

// result is what a client command produced.
type result struct {
	stdout, stderr string
	code           int
}

// clientCmd builds an OpenSSH client command (ssh, scp or sftp) using the
// test configuration. The environment is minimal so the developer's agent
// and variables do not leak in.
func (e *testEnv) clientCmd(ctx context.Context, prog string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, prog, append([]string{"-F", e.config}, args...)...)
	cmd.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + e.dir}
	return cmd
}

// run runs an OpenSSH client to completion with a timeout.
func (e *testEnv) run(stdin io.Reader, env []string, prog string, args ...string) result {
	e.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := e.clientCmd(ctx, prog, args...)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		e.t.Fatalf("%s %v: %v", prog, args, err)
	}
	if ctx.Err() != nil {
		e.t.Fatalf("%s %v: timed out; stderr: %s", prog, args, stderr.String())
	}
	return result{stdout: stdout.String(), stderr: stderr.String(), code: code}
}

// ssh runs `ssh -F config args...`.
func (e *testEnv) ssh(args ...string) result {
	e.t.Helper()
	return e.run(nil, nil, "ssh", args...)
}

// mustSucceed fails the test unless r exited 0.
func mustSucceed(t *testing.T, what string, r result) {
	t.Helper()
	if r.code != 0 {
		t.Fatalf("%s: exit %d\nstdout: %s\nstderr: %s", what, r.code, r.stdout, r.stderr)
	}
}

// startSleeper starts `ssh node` running a long sleep whose pid the remote
// shell writes to a file, and returns the client command and that pid.
func (e *testEnv) startSleeper() (*exec.Cmd, int) {
	e.t.Helper()
	pidFile := filepath.Join(e.dir, "sleeper.pid")
	return e.startWithPid(pidFile, fmt.Sprintf("echo $$ > %[1]s.tmp && mv %[1]s.tmp %[1]s && exec sleep 300", pidFile))
}

// startWithPid starts `ssh node command`, where command writes a pid to
// pidFile (atomically, by a rename) and keeps running, and returns the
// client command and that pid once it is there. The client is killed when
// the test ends.
func (e *testEnv) startWithPid(pidFile, command string) (*exec.Cmd, int) {
	e.t.Helper()
	os.Remove(pidFile)
	cmd := e.clientCmd(context.Background(), "ssh", testHost, command)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
	})
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		data, err := os.ReadFile(pidFile)
		if err == nil {
			pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
			if err != nil {
				e.t.Fatalf("pid file: %v", err)
			}
			return cmd, pid
		}
		time.Sleep(20 * time.Millisecond)
	}
	e.t.Fatalf("remote command did not start; ssh stderr: %s", stderr.String())
	return nil, 0
}

// waitExit waits for a started client command to end, with a timeout.
func waitExit(t *testing.T, cmd *exec.Cmd) error {
	t.Helper()
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-time.After(20 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatal("ssh client did not exit")
		return nil
	}
}

// dial opens an x/crypto client connection, for checks OpenSSH's client
// cannot make (exit-signal, window changes).
func (e *testEnv) dial() *gossh.Client {
	e.t.Helper()
	c, err := gossh.Dial("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(e.port)), &gossh.ClientConfig{
		User:            "operator",
		Auth:            []gossh.AuthMethod{gossh.PublicKeys(e.key.Signer)},
		HostKeyCallback: gossh.FixedHostKey(e.srv.HostSigner().PublicKey()),
		Timeout:         10 * time.Second,
	})
	if err != nil {
		e.t.Fatal(err)
	}
	e.t.Cleanup(func() { c.Close() })
	return c
}
