package sshserver

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
)

func TestExecOutputAndStatus(t *testing.T) {
	e := newTestEnv(t)

	r := e.ssh(testHost, "echo out; echo err >&2; exit 3")
	if r.code != 3 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Fatalf("got exit %d stdout %q stderr %q; want 3 %q %q", r.code, r.stdout, r.stderr, "out\n", "err\n")
	}

}

// A command killed by a signal is reported like sshd does: exit-signal
// with the name, no exit-status, so OpenSSH's client exits 255.
func TestExitSignal(t *testing.T) {
	e := newTestEnv(t)
	r := e.ssh("-v", testHost, "kill -TERM $$")
	if r.code != 255 || !strings.Contains(r.stderr, "rtype exit-signal") ||
		strings.Contains(r.stderr, "rtype exit-status") {
		t.Fatalf("killed by SIGTERM: exit %d, want 255 after exit-signal only; stderr %q", r.code, r.stderr)
	}
	sess, err := e.dial().NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	err = sess.Run("kill -QUIT $$")
	var ee *gossh.ExitError
	if !errors.As(err, &ee) || ee.Signal() != "QUIT" || ee.ExitStatus() != 128+3 {
		t.Fatalf("x/crypto client: %v, want signal QUIT, status 131", err)
	}
}

func TestMissingShell(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.Shell = "/nonexistent/shell" })
	r := e.ssh(testHost, "true")
	if r.code != 127 || !strings.Contains(r.stderr, "sshserver: start session") {
		t.Fatalf("missing shell: exit %d, stderr %q", r.code, r.stderr)
	}
	r = e.ssh("-tt", testHost)
	if r.code != 127 || !strings.Contains(r.stdout+r.stderr, "sshserver: start session") {
		t.Fatalf("missing shell with pty: exit %d, stdout %q stderr %q", r.code, r.stdout, r.stderr)
	}
	// SFTP does not need a shell.
	batch := filepath.Join(e.dir, "batch")
	os.WriteFile(batch, []byte("pwd\n"), 0o600)
	mustSucceed(t, "sftp without a shell", e.run(nil, nil, "sftp", "-b", batch, testHost))
}

func TestExecEnvironment(t *testing.T) {
	e := newTestEnv(t)
	home, _ := os.UserHomeDir()
	r := e.run(nil, []string{"LANG=C.UTF-8", "LC_TETHER=yes", "SECRET=leak"}, "ssh",
		"-o", "SendEnv=LANG LC_* SECRET", testHost,
		`echo "$HOME|$USER|$PATH|$SHELL|$LANG|$LC_TETHER|$SECRET|$TERM|$(pwd)"; echo "$SSH_CONNECTION"`)
	mustSucceed(t, "ssh env", r)
	lines := strings.Split(strings.TrimSpace(r.stdout), "\n")
	if len(lines) != 2 {
		t.Fatalf("output %q", r.stdout)
	}
	f := strings.Split(lines[0], "|")
	if f[0] != home || f[1] == "" || f[2] == "" || f[3] != "/bin/sh" {
		t.Errorf("base environment %q", lines[0])
	}
	if f[4] != "C.UTF-8" || f[5] != "yes" {
		t.Errorf("LANG/LC_* not passed: %q", lines[0])
	}
	if f[6] != "" {
		t.Errorf("client variable SECRET was accepted: %q", lines[0])
	}
	if f[7] != "" {
		t.Errorf("TERM set without a pty: %q", lines[0])
	}
	if f[8] != home {
		t.Errorf("working directory %q, want %q", f[8], home)
	}
	if c := strings.Fields(lines[1]); len(c) != 4 || c[0] != "127.0.0.1" || c[3] != fmt.Sprint(e.port) {
		t.Errorf("SSH_CONNECTION %q", lines[1])
	}
}

func TestExecStdinRoundTrip(t *testing.T) {
	e := newTestEnv(t)
	in := make([]byte, 4<<20)
	rand.Read(in)
	r := e.run(bytes.NewReader(in), nil, "ssh", testHost, "cat")
	mustSucceed(t, "ssh cat", r)
	if got, want := sha256.Sum256([]byte(r.stdout)), sha256.Sum256(in); got != want {
		t.Fatalf("cat round trip: got %d bytes, sha256 mismatch", len(r.stdout))
	}

	// EOF on stdin reaches the command.
	r = e.run(strings.NewReader("a\nb\nc\n"), nil, "ssh", testHost, "wc -l")
	mustSucceed(t, "ssh wc", r)
	if strings.TrimSpace(r.stdout) != "3" {
		t.Fatalf("wc -l: %q", r.stdout)
	}
}

func TestPTYSession(t *testing.T) {
	e := newTestEnv(t)
	r := e.run(nil, []string{"TERM=xterm-tether"}, "ssh", "-tt", testHost, `tty; echo "term=$TERM tty=$SSH_TTY"; echo ok`)
	mustSucceed(t, "ssh -tt", r)
	out := strings.ReplaceAll(r.stdout, "\r\n", "\n")
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[0], "/dev/pts/") || lines[2] != "ok" {
		t.Fatalf("pty output %q", r.stdout)
	}
	if want := "term=xterm-tether tty=" + lines[0]; lines[1] != want {
		t.Fatalf("got %q, want %q", lines[1], want)
	}
	if strings.Contains(r.stdout, "\r\r\n") {
		t.Errorf("newlines translated twice: %q", r.stdout)
	}

	// Interactive shell on a PTY, driven through stdin.
	r = e.run(strings.NewReader("echo interactive-$((6*7))\nexit 5\n"), nil, "ssh", "-tt", testHost)
	if r.code != 5 || !strings.Contains(r.stdout, "interactive-42") {
		t.Fatalf("interactive shell: exit %d, stdout %q", r.code, r.stdout)
	}
}

// An interactive shell on a terminal puts background jobs in process groups
// of their own; they are still in the session and must die with it.
func TestPTYJobControlJobsKilled(t *testing.T) {
	e := newTestEnv(t)
	pidFile := filepath.Join(e.dir, "job.pid")
	in := fmt.Sprintf("set -m; sleep 300 & echo $! > %s\nexit\n", pidFile)
	r := e.run(strings.NewReader(in), nil, "ssh", "-tt", testHost)
	mustSucceed(t, "ssh -tt job", r)
	data, err := os.ReadFile(pidFile)
	if err != nil {
		t.Fatal(err)
	}
	var pid int
	fmt.Sscan(string(data), &pid)
	testenv.WaitProcessGone(t, pid, 10*time.Second)
}

func TestShellWithoutPTY(t *testing.T) {
	e := newTestEnv(t)
	r := e.run(strings.NewReader("echo no-pty-$((6*7))\ntty || true\n"), nil, "ssh", "-T", testHost)
	mustSucceed(t, "ssh -T", r)
	if !strings.Contains(r.stdout, "no-pty-42") || !strings.Contains(r.stdout, "not a tty") {
		t.Fatalf("shell without pty: %q", r.stdout)
	}
}

func TestWindowChangeAndSignal(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()

	// Window change resizes the terminal.
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if err := sess.RequestPty("xterm", 24, 80, gossh.TerminalModes{gossh.ECHO: 0}); err != nil {
		t.Fatal(err)
	}
	out, err := sess.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdin, err := sess.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.Start("stty size; read x; stty size"); err != nil {
		t.Fatal(err)
	}
	br := bufio.NewReader(out)
	if line := readLine(t, br); line != "24 80" {
		t.Fatalf("initial size %q", line)
	}
	if err := sess.WindowChange(50, 132); err != nil {
		t.Fatal(err)
	}
	// The resize and this input travel in order on one connection, but the
	// resize is applied by another goroutine; give it a moment.
	time.Sleep(200 * time.Millisecond)
	fmt.Fprintln(stdin, "go")
	// gliderlabs does not apply terminal modes, so "go" is echoed back.
	if line := readLine(t, br, "go"); line != "50 132" {
		t.Fatalf("size after window-change %q", line)
	}
	if err := sess.Wait(); err != nil {
		t.Fatal(err)
	}

	// A client signal reaches the command, and exit-signal reports it.
	sess2, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess2.Close()
	out2, _ := sess2.StdoutPipe()
	if err := sess2.Start("echo started; exec sleep 30"); err != nil {
		t.Fatal(err)
	}
	if line, _ := bufio.NewReader(out2).ReadString('\n'); line != "started\n" {
		t.Fatalf("got %q", line)
	}
	if err := sess2.Signal(gossh.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var ee *gossh.ExitError
	if err := sess2.Wait(); !errors.As(err, &ee) || ee.Signal() != "TERM" || ee.ExitStatus() != 143 {
		t.Fatalf("after SIGTERM: %v", err)
	}
}

// A client may request a PTY and resize it without ever starting a shell;
// that must not wedge the session's request handling (and so Close).
func TestWindowChangesWithoutShell(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	if err := sess.RequestPty("xterm", 24, 80, nil); err != nil {
		t.Fatal(err)
	}
	for i := range 5 {
		if err := sess.WindowChange(30+i, 100); err != nil {
			t.Fatal(err)
		}
	}
	// A request with a reply proves the loop is still serving.
	if ok, err := sess.SendRequest("env", true, gossh.Marshal(struct{ K, V string }{"LANG", "C"})); err != nil || !ok {
		t.Fatalf("env request after window changes: %v %v", ok, err)
	}
	done := make(chan struct{})
	go func() {
		e.srv.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("Close hung")
	}
}

func TestClientDisconnectKillsProcess(t *testing.T) {
	e := newTestEnv(t)
	cmd, pid := e.startSleeper()
	cmd.Process.Kill()
	waitExit(t, cmd)
	testenv.WaitProcessGone(t, pid, 10*time.Second)
}

func TestChannelCloseKillsProcess(t *testing.T) {
	e := newTestEnv(t)
	c := e.dial()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	out, _ := sess.StdoutPipe()
	if err := sess.Start("echo $$; exec sleep 300"); err != nil {
		t.Fatal(err)
	}
	var pid int
	if _, err := fmt.Fscan(out, &pid); err != nil {
		t.Fatal(err)
	}
	// Closing the channel while the connection stays up (as a multiplexing
	// client does) ends the session too.
	sess.Close()
	testenv.WaitProcessGone(t, pid, 10*time.Second)
	// The connection is still usable.
	sess2, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess2.Close()
	if out, err := sess2.Output("echo again"); err != nil || string(out) != "again\n" {
		t.Fatalf("second session: %q, %v", out, err)
	}
}

func TestIdleTimeout(t *testing.T) {
	e := newTestEnv(t, func(c *Config) { c.IdleTimeout = 300 * time.Millisecond })
	mustSucceed(t, "quick command", e.ssh(testHost, "echo hi"))
	// The idle connection is cut and its session hung up; the client sees
	// the connection close or the exit-signal HUP, 255 either way. The
	// command must not have finished.
	if r := e.ssh(testHost, "sleep 3; echo too-late"); r.code != 255 || strings.Contains(r.stdout, "too-late") {
		t.Fatalf("idle connection: exit %d, stdout %q", r.code, r.stdout)
	}
}

// underNohupEnv marks the child process of TestSessionsHangUpUnderNohup.
const underNohupEnv = "SSHSERVER_TEST_UNDER_NOHUP"

// TestSessionsHangUpUnderNohup: an agent started with SIGHUP ignored (here
// the test binary, run again under nohup) still hangs up a session's plain
// background jobs when its client goes away. Without hangupReachesSessions
// the ignored SIGHUP passes through exec and the job outlives its session.
func TestSessionsHangUpUnderNohup(t *testing.T) {
	if os.Getenv(underNohupEnv) == "" {
		nohup, err := exec.LookPath("nohup")
		if err != nil {
			t.Skip("nohup (coreutils) not installed")
		}
		cmd := exec.CommandContext(
			t.Context(), nohup, os.Args[0], "-test.run=^TestSessionsHangUpUnderNohup$", "-test.v", "-test.count=1",
		)
		cmd.Env = append(os.Environ(), underNohupEnv+"=1")
		out, err := cmd.CombinedOutput()
		t.Logf("child under nohup:\n%s", out)
		if err != nil {
			t.Fatalf("child under nohup failed: %v", err)
		}
		return
	}
	if !signal.Ignored(syscall.SIGHUP) {
		t.Fatal("the child does not start with SIGHUP ignored: the test would prove nothing")
	}
	backgroundJobHungUp(t)
}

// TestBackgroundJobsHungUpWhenClientGoes: a client that goes away while its
// command runs hangs up the session: a plain background job dies with it,
// a nohup'ed one (once nohup ignores the hangup) lives on.
func TestBackgroundJobsHungUpWhenClientGoes(t *testing.T) { backgroundJobHungUp(t) }

func backgroundJobHungUp(t *testing.T) {
	e := newTestEnv(t)
	plain := filepath.Join(e.dir, "plain.pid")
	detached := filepath.Join(e.dir, "nohup.pid")
	client, _ := e.startWithPid(detached, fmt.Sprintf(`sleep 300 >/dev/null 2>&1 </dev/null & echo $! > %[1]s.tmp
		mv %[1]s.tmp %[1]s
		nohup sh -c 'echo $$ > %[2]s.tmp && mv %[2]s.tmp %[2]s && exec sleep 300' >/dev/null 2>&1 </dev/null &
		sleep 300`, plain, detached))
	nohupPid := readPid(t, detached)
	t.Cleanup(func() { syscall.Kill(nohupPid, syscall.SIGKILL) })
	plainPid := readPid(t, plain)
	t.Cleanup(func() { syscall.Kill(plainPid, syscall.SIGKILL) })
	client.Process.Kill()
	client.Wait()
	testenv.WaitProcessGone(t, plainPid, 10*time.Second)
	if !testenv.ProcessAlive(nohupPid) {
		t.Fatalf("nohup'ed process %d did not outlive the hangup", nohupPid)
	}
}

// A session without a terminal, like one of sshd, sends nothing to what its
// command left running when the command exits: `nohup cmd &`, `setsid cmd &`
// and a plain `cmd &` all outlive it. nohup and setsid start right away, as
// a user types them; a hangup at the end of the session would race them and
// usually win. Each case runs a few times, as a race would not lose every time.
func TestBackgroundJobsOutliveExecSession(t *testing.T) {
	e := newTestEnv(t)
	for _, tc := range []struct{ name, prefix string }{
		{"nohup", "nohup "},
		{"setsid", "setsid "},
		{"plain", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for i := range 5 {
				marker := uniqueSleep(t)
				command := tc.prefix + "sleep " + marker + " >/dev/null 2>&1 &"
				mustSucceed(t, command, e.ssh(testHost, command))
				// The session is over once ssh returned: anything it sent the
				// process was sent before the exit status.
				pid := waitSleeper(t, marker)
				time.Sleep(100 * time.Millisecond)
				if !testenv.ProcessAlive(pid) {
					t.Fatalf("run %d: %q (pid %d) did not outlive the session", i+1, command, pid)
				}
			}
		})
	}
}

// uniqueSleep returns a sleep argument no other process has, e.g.
// "300.123450007", and kills whatever runs `sleep` with it when t ends.
func uniqueSleep(t *testing.T) string {
	t.Helper()
	sleepSeq++
	marker := fmt.Sprintf("300.%d%04d", os.Getpid(), sleepSeq)
	t.Cleanup(func() {
		for _, pid := range testenv.ProcessesWithArgs("sleep", marker) {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	})
	return marker
}

var sleepSeq int

// waitSleeper waits for the process `sleep marker` and returns its pid.
func waitSleeper(t *testing.T, marker string) int {
	t.Helper()
	pids := testenv.WaitForValue(t, "sleep "+marker+" to run", 10*time.Second,
		func() []int { return testenv.ProcessesWithArgs("sleep", marker) },
		func(p []int) bool { return len(p) > 0 })
	return pids[0]
}

// The job runner asks for the old guarantee with KillOnEndRequest: what
// its command leaves behind is killed, nohup'ed or not.
func TestKillOnEndRequest(t *testing.T) {
	e := newTestEnv(t)
	pidFile := filepath.Join(e.dir, "bg.pid")
	sess, err := e.dial().NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	if ok, err := sess.SendRequest(KillOnEndRequest, true, nil); !ok || err != nil {
		t.Fatalf("%s: %v %v", KillOnEndRequest, ok, err)
	}
	if err := sess.Run(fmt.Sprintf("nohup sleep 300 >/dev/null 2>&1 </dev/null & echo $! > %s", pidFile)); err != nil {
		t.Fatal(err)
	}
	testenv.WaitProcessGone(t, readPid(t, pidFile), 10*time.Second)
}

func readPid(t *testing.T, path string) int {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(data)))
	if err != nil {
		t.Fatalf("pid file %s: %v", path, err)
	}
	return pid
}

func TestCloseEndsSessions(t *testing.T) {
	e := newTestEnv(t)
	cmd, pid := e.startSleeper()
	done := make(chan struct{})
	go func() {
		e.srv.Close()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(20 * time.Second):
		t.Fatal("Close did not return")
	}
	// Close waited for the session, which reaped the process.
	if err := waitExit(t, cmd); err == nil {
		t.Error("ssh exited 0 after the server closed")
	}
	testenv.WaitProcessGone(t, pid, 10*time.Second)

	// A closed server refuses new connections.
	if r := e.ssh(testHost, "true"); r.code != 255 {
		t.Fatalf("after Close: exit %d", r.code)
	}
}

func TestAgentForwarding(t *testing.T) {
	if _, err := exec.LookPath("ssh-agent"); err != nil {
		t.Skip("ssh-agent not installed")
	}
	e := newTestEnv(t)
	sock := filepath.Join(e.dir, "agent.sock")
	agent := exec.Command("ssh-agent", "-D", "-a", sock)
	if err := agent.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		agent.Process.Kill()
		agent.Wait()
	})
	for i := 0; ; i++ {
		if _, err := os.Stat(sock); err == nil {
			break
		}
		if i > 200 {
			t.Fatal("ssh-agent socket did not appear")
		}
		time.Sleep(10 * time.Millisecond)
	}
	add := exec.Command("ssh-add", e.key.Path)
	add.Env = []string{"SSH_AUTH_SOCK=" + sock}
	if out, err := add.CombinedOutput(); err != nil {
		t.Fatalf("ssh-add: %v: %s", err, out)
	}

	// The config says IdentityAgent none, which makes ssh drop any agent
	// and with it forwarding; -o wins over the config file.
	r := e.ssh("-A", "-o", "IdentityAgent="+sock, testHost, `ssh-add -l; echo "sock=$SSH_AUTH_SOCK"`)
	mustSucceed(t, "ssh -A", r)
	if !strings.Contains(r.stdout, gossh.FingerprintSHA256(e.key.Pub())) {
		t.Fatalf("forwarded agent does not list the key: %q", r.stdout)
	}
	sockLine := r.stdout[strings.LastIndex(r.stdout, "sock="):]
	remoteSock := strings.TrimSpace(strings.TrimPrefix(sockLine, "sock="))
	if remoteSock == "" {
		t.Fatal("SSH_AUTH_SOCK not set")
	}
	if _, err := os.Stat(filepath.Dir(remoteSock)); !os.IsNotExist(err) {
		t.Errorf("agent socket directory left behind: %v", err)
	}

	r = e.ssh(testHost, `echo "sock=$SSH_AUTH_SOCK"`)
	if strings.TrimSpace(r.stdout) != "sock=" {
		t.Errorf("SSH_AUTH_SOCK set without agent forwarding: %q", r.stdout)
	}
}

// readLine reads the next line that is not one of skip, without surrounding
// whitespace (PTY output ends lines with "\r\n").
func readLine(t *testing.T, br *bufio.Reader, skip ...string) string {
	t.Helper()
	for {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatalf("read: %v (partial %q)", err, line)
		}
		line = strings.TrimSpace(line)
		if !slices.Contains(skip, line) {
			return line
		}
	}
}
