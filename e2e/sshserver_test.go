package e2e

import (
	"bufio"
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// loopbackEcho listens on 127.0.0.1 (the node's loopback: agents run on
// this machine) and answers each line with "echo:" + line.
func loopbackEcho(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.SetDeadline(time.Now().Add(20 * time.Second))
				line, _ := bufio.NewReader(c).ReadString('\n')
				io.WriteString(c, "echo:"+line)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// echoVia dials 127.0.0.1:port and returns the answer to one line ("" if
// nothing answers yet).
func echoVia(port int) string {
	c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", port), time.Second)
	if err != nil {
		return ""
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(c, "through-tether\n")
	reply, _ := bufio.NewReader(c).ReadString('\n')
	return reply
}

// startSSH runs a long-lived ssh client (a forwarding) until the test ends.
func startSSH(t *testing.T, args ...string) *exec.Cmd {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, "ssh", args...)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cancel()
		cmd.Wait()
		if t.Failed() {
			t.Logf("ssh %v stderr: %s", args, stderr.String())
		}
	})
	return cmd
}

// TestEmbeddedServerForwarding: stock OpenSSH ssh -L and ssh -R through the
// hub to a node with the embedded server, on the node's loopback only;
// a destination off the loopback and a role with --forwarding=false are
// refused with a reason; forwardings are in the hub's audit.
func TestEmbeddedServerForwarding(t *testing.T) {
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub)
	bobKey := testenv.NewKeyFile(t, filepath.Join(t.TempDir(), "bob")).Path
	h.cli("role", "create", "no-fwd", "--nodes", "*", "--logins", loginUser, "--forwarding=false")
	h.cli("operator", "add", "bob", "--key", bobKey+".pub", "--role", "no-fwd")
	startAgent(t, h.token(), "fwd1", "--ssh", "embedded")
	h.waitOnline("fwd1", "")
	alice := newSSHClient(t, h)
	bob := newSSHClientAs(t, h, "bob", bobKey)
	echo := loopbackEcho(t)

	// ssh -L: a local port on the operator's side reaches the node's loopback.
	local := freePort(t)
	startSSH(t, alice.jumpArgs("fwd1", "-N", "-o", "ExitOnForwardFailure=yes",
		"-L", fmt.Sprintf("127.0.0.1:%d:127.0.0.1:%d", local, echo))...)
	waitFor(t, "ssh -L answers", 30*time.Second, func() bool { return echoVia(local) == "echo:through-tether\n" })

	// ssh -R: a port on the node's loopback reaches the operator's side.
	remote := freePort(t)
	startSSH(t, alice.jumpArgs("fwd1", "-N", "-o", "ExitOnForwardFailure=yes",
		"-R", fmt.Sprintf("%d:127.0.0.1:%d", remote, echo))...)
	waitFor(t, "ssh -R answers", 30*time.Second, func() bool { return echoVia(remote) == "echo:through-tether\n" })

	// Off the loopback: refused with the reason.
	_, errOut, code := runCmdInput(t, 30*time.Second, "x\n", "ssh", alice.jumpArgs("fwd1", "-W", "192.0.2.1:80")...)
	if code != 255 || !strings.Contains(errOut, "is not the node's loopback") {
		t.Fatalf("ssh -W off the loopback: exit %d, %q", code, errOut)
	}
	// bob's role refuses forwarding; his shell still works.
	if out, errOut, code := bob.run(30*time.Second, "fwd1", "echo bob-in"); code != 0 ||
		strings.TrimSpace(out) != "bob-in" {
		t.Fatalf("bob's shell: exit %d, %q %q", code, out, errOut)
	}
	_, errOut, code = runCmdInput(t, 30*time.Second, "x\n", "ssh",
		bob.jumpArgs("fwd1", "-W", fmt.Sprintf("127.0.0.1:%d", echo))...)
	if code != 255 || !strings.Contains(errOut, "none of your roles") {
		t.Fatalf("bob forwarding: exit %d, %q", code, errOut)
	}

	var ok, refused bool
	waitFor(t, "forwardings in the audit", 20*time.Second, func() bool {
		ok, refused = false, false
		for _, e := range h.audit("--node", "fwd1") {
			switch {
			case e.Kind == "ssh_forward" && e.Result == "ok" && e.Operator == "alice":
				ok = true
			case e.Kind == "ssh_forward" && e.Result == "refused" && e.Operator == "bob":
				refused = true
			}
		}
		return ok && refused
	})
}

// TestEmbeddedServerLoginRefused: a login outside the operator's roles is
// refused by the node with a reason the operator can act on (an SSH banner
// OpenSSH prints), and the hub's audit records it, linked to node and
// operator. Narrowing the role ends a live session that used the login.
func TestEmbeddedServerLoginRefused(t *testing.T) {
	h := startHub(t)
	bobKey := testenv.NewKeyFile(t, filepath.Join(t.TempDir(), "bob")).Path
	h.cli("role", "create", "ops", "--nodes", "*", "--logins", loginUser)
	h.cli("operator", "add", "bob", "--key", bobKey+".pub", "--role", "ops")
	startAgent(t, h.token(), "lr1", "--ssh", "embedded")
	h.waitOnline("lr1", "")
	bob := newSSHClientAs(t, h, "bob", bobKey)

	_, errOut, code := runCmd(t, 30*time.Second, "ssh", "-F", bob.cfg, "-J", "bob@"+h.sshAddr(),
		"nobody-else@lr1.tether", "true")
	if code != 255 || !strings.Contains(errOut, `may not log in as "nobody-else"`) ||
		!strings.Contains(errOut, loginUser) {
		t.Fatalf("login outside the role: exit %d, %q", code, errOut)
	}
	// Two rows: the node's report, and the jump that carried the attempt,
	// which must not read "ok".
	waitFor(t, "refused login in the audit, on its own row and on the jump's", 20*time.Second, func() bool {
		var reported, jump bool
		for _, e := range h.audit("--node", "lr1") {
			switch {
			case e.Kind == "login_refused" && e.Operator == "bob" && strings.Contains(e.Detail, "nobody-else") &&
				strings.HasPrefix(e.KeyFP, "SHA256:"):
				reported = true
			case e.Kind == "jump" && e.Operator == "bob":
				if e.Result != "login_refused" || !strings.Contains(e.Detail, `"nobody-else"`) {
					t.Fatalf("jump carrying the refused login audited as %q %q", e.Result, e.Detail)
				}
				jump = true
			}
		}
		return reported && jump
	})

	// A live session ends when the role no longer grants its login.
	done := make(chan struct{})
	go func() {
		defer close(done)
		bob.run(60*time.Second, "lr1", "echo started; sleep 45")
	}()
	waitFor(t, "bob's session to start", 20*time.Second, func() bool {
		return strings.Contains(h.p.Log(), `msg="jump started" component=bastion operator=bob`)
	})
	narrowed := time.Now()
	h.cli("role", "create", "ops", "--nodes", "*", "--logins", "nobody-else")
	select {
	case <-done:
		t.Logf("live session ended %s after the role was narrowed", time.Since(narrowed).Round(time.Millisecond))
	case <-time.After(10 * time.Second):
		t.Fatal("live session still running 10s after its login was taken away")
	}
}

// TestEmbeddedServerLikeOpenSSH: through the hub with stock OpenSSH, the
// embedded server reports a signal death as sshd does (ssh exits 255), keeps
// relative SFTP symlink targets, and runs sessions with --shell.
func TestEmbeddedServerLikeOpenSSH(t *testing.T) {
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub)
	startAgent(t, h.token(), "like1", "--ssh", "embedded", "--shell", "/bin/sh")
	h.waitOnline("like1", "")
	c := newSSHClient(t, h)

	if out, errOut, code := c.run(30*time.Second, "like1", "echo $0"); code != 0 || strings.TrimSpace(out) != "/bin/sh" {
		t.Fatalf("--shell: exit %d, %q %q", code, out, errOut)
	}
	if _, errOut, code := c.run(30*time.Second, "like1", "kill -TERM $$"); code != 255 {
		t.Fatalf("killed by SIGTERM: exit %d, want 255 (exit-signal); %q", code, errOut)
	}

	dir := t.TempDir()
	batch := filepath.Join(dir, "batch")
	os.WriteFile(batch, []byte("cd "+dir+"\nln -s ../lib/target.so rel\n"), 0o644)
	sftpArgs := []string{"-F", c.cfg, "-J", c.operator + "@" + h.sshAddr(), "-b", batch, loginUser + "@like1.tether"}
	if _, errOut, code := runCmd(t, 30*time.Second, "sftp", sftpArgs...); code != 0 {
		t.Fatalf("sftp ln -s: exit %d, %q", code, errOut)
	}
	if target, err := os.Readlink(filepath.Join(dir, "rel")); err != nil || target != "../lib/target.so" {
		t.Fatalf("symlink target %q (%v), want ../lib/target.so", target, err)
	}
}

// TestBackgroundJobsOutliveSessionLikeSSHD: what a command without a
// terminal starts in the background outlives the session on the embedded
// server as on stock sshd (here behind an agent's --ssh relay), typed as
// users type it: `nohup cmd &`, `setsid cmd &`, a plain `cmd &`. Neither
// server hangs up such a session when its command exits; a hangup sent then
// would race nohup and setsid, and win most of the time.
func TestBackgroundJobsOutliveSessionLikeSSHD(t *testing.T) {
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub)
	join := h.token("--uses", "2")
	sd := startSSHD(t)
	startAgent(t, join, "bg-emb", "--ssh", "embedded", "--shell", "/bin/sh")
	startAgent(t, join, "bg-sshd", "--ssh", sd.Addr)
	h.waitOnline("bg-emb", "")
	h.waitOnline("bg-sshd", "")
	c := newSSHClient(t, h)
	c.trust("bg-sshd.tether", sd.hostPub)

	for _, node := range []string{"bg-emb", "bg-sshd"} {
		for _, prefix := range []string{"nohup ", "setsid ", ""} {
			name := cmp.Or(strings.TrimSpace(prefix), "plain")
			t.Run(node+"/"+name, func(t *testing.T) {
				for i := range 3 {
					marker := fmt.Sprintf("300.%d%d%d", os.Getpid(), time.Now().UnixNano()%1e6, i)
					t.Cleanup(func() {
						for _, pid := range testenv.ProcessesWithArgs("sleep", marker) {
							syscall.Kill(pid, syscall.SIGKILL)
						}
					})
					command := prefix + "sleep " + marker + " >/dev/null 2>&1 &"
					if _, errOut, code := c.run(30*time.Second, node, command); code != 0 {
						t.Fatalf("%q: exit %d, %q", command, code, errOut)
					}
					// ssh returned, so the session is over: whatever it sent
					// the process was sent before the exit status.
					pids := waitForState(t, command+" running", 10*time.Second,
						func() []int { return testenv.ProcessesWithArgs("sleep", marker) },
						func(p []int) bool { return len(p) > 0 })
					time.Sleep(100 * time.Millisecond)
					if !testenv.ProcessAlive(pids[0]) {
						t.Fatalf("run %d: %q (pid %d) did not outlive the session", i+1, command, pids[0])
					}
				}
			})
		}
	}
}
