package e2e

import (
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/faultproxy"
	"github.com/tether-dev/tether/internal/testenv"
)

// resumeTuning makes a cut of a couple of seconds end the agent's tunnel
// session (both transports), so that the streams through it must resume.
var resumeTuning = []string{"--keepalive", "1s", "--dead-peer-timeout", "3s"}

// resumeFixture is a hub behind a fault link with one agent per transport.
type resumeFixture struct {
	h    *hub
	link *faultproxy.Link
	c    *sshClient
}

func newResumeFixture(t *testing.T, hubArgs []string, nodes map[string]string) *resumeFixture {
	t.Helper()
	link, hubPort := newLink(t)
	h := startHubArgs(t, hubPort, append(append([]string{"--advertise", link.Addr()}, resumeTuning...), hubArgs...)...)
	h.cli("operator", "add", "alice", "--key", opPub)
	join := h.token("--uses", fmt.Sprint(len(nodes)))
	for name, tr := range nodes {
		startAgent(t, join, name, append([]string{"--ssh", "embedded", "--transport", tr}, resumeTuning...)...)
	}
	for name, tr := range nodes {
		if tr == "auto" {
			tr = "quic" // auto races QUIC first, which wins on loopback
		}
		h.waitOnline(name, tr)
	}
	return &resumeFixture{h: h, link: link, c: newSSHClient(t, h)}
}

// resumed is the hub's count of streams re-attached after a reconnect.
func (f *resumeFixture) resumed(t *testing.T) float64 {
	t.Helper()
	v, _ := metricValue(f.h.metrics(t), `tether_resume_events_total{event="resumed"}`)
	return v
}

// cut takes the link down for d and brings it back as a flapping edge link
// comes back (TCP connections reset, UDP flows rebound).
func (f *resumeFixture) cut(t *testing.T, d time.Duration) {
	t.Helper()
	if err := f.link.Flap(d); err != nil {
		t.Fatal(err)
	}
}

// TestResumeSCPAcrossCuts copies a file with stock scp through the jump to
// a node whose link is cut five times for 2 to 10 s during the copy: the
// copy completes and the node's file has the same SHA-256, on both
// transports; the hub re-attached the stream after the cuts.
func TestResumeSCPAcrossCuts(t *testing.T) {
	const size = int64(1 << 30)
	f := newResumeFixture(t, nil, map[string]string{"res-quic": "quic", "res-tcp": "tcp"})
	dir := t.TempDir()
	src := filepath.Join(dir, "blob")
	want := writeRandomFile(t, src, size)
	cuts := []time.Duration{2 * time.Second, 4 * time.Second, 10 * time.Second, 3 * time.Second, 6 * time.Second}
	for _, node := range []string{"res-quic", "res-tcp"} {
		t.Run(node, func(t *testing.T) {
			before := f.resumed(t)
			dst := filepath.Join(t.TempDir(), "copy")
			done := make(chan struct{})
			var errOut string
			var code int
			start := time.Now()
			go func() {
				defer close(done)
				_, errOut, code = runCmdNoFatal(10*time.Minute, "scp", "-F", f.c.cfg, "-J", "alice@"+f.h.sshAddr(), src,
					loginUser+"@"+node+".tether:"+dst)
			}()
			// Cut at evenly spaced points of the copy, measured on the
			// node's file (the node is this machine).
			for i, d := range cuts {
				at := size * int64(i+1) / int64(len(cuts)+1)
				if !waitFileSize(dst, at, done, 5*time.Minute) {
					t.Fatalf("copy ended or stalled before cut %d (at %d bytes): exit %d, %s", i+1, at, code,
						strings.TrimSpace(errOut))
				}
				f.cut(t, d)
				t.Logf("cut %d: %s at %d MiB", i+1, d, at>>20)
			}
			<-done
			if code != 0 {
				t.Fatalf("scp across the cuts: exit %d: %s", code, errOut)
			}
			if got := fileSum(t, dst); got != want {
				t.Fatalf("copy differs from the source after %d cuts", len(cuts))
			}
			resumed := f.resumed(t) - before
			t.Logf("%s: %d MiB across %d cuts in %s; streams resumed %v", node, size>>20, len(cuts),
				time.Since(start).Round(time.Second), resumed)
			if resumed < 1 {
				t.Fatal("the copy survived, but no stream was resumed: the cuts did not end the tunnel session")
			}
		})
	}
}

// writeRandomFile writes size pseudo-random bytes to path and returns their
// SHA-256.
func writeRandomFile(t *testing.T, path string, size int64) [32]byte {
	t.Helper()
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	h := sha256.New()
	r := rand.NewChaCha8([32]byte{7})
	if _, err := io.Copy(io.MultiWriter(out, h), io.LimitReader(r, size)); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

func fileSum(t *testing.T, path string) [32]byte {
	t.Helper()
	in, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	h := sha256.New()
	if _, err := io.Copy(h, in); err != nil {
		t.Fatal(err)
	}
	return [32]byte(h.Sum(nil))
}

// waitFileSize waits until path holds at least n bytes; false if done
// closes or limit passes first.
func waitFileSize(path string, n int64, done <-chan struct{}, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if st, err := os.Stat(path); err == nil && st.Size() >= n {
			return true
		}
		select {
		case <-done:
			return false
		case <-time.After(20 * time.Millisecond):
		}
	}
	return false
}

// pty is an interactive `ssh -tt` session through the jump, typed into.
type ptySession struct {
	in  io.WriteCloser
	out *testenv.SyncBuffer
	s   *session
}

func startPTY(t *testing.T, c *sshClient, node string) *ptySession {
	t.Helper()
	p := &ptySession{out: &testenv.SyncBuffer{}, s: &session{done: make(chan struct{})}}
	p.s.cmd = exec.Command("ssh", c.jumpArgs(node, "-tt")...)
	in, err := p.s.cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	p.in = in
	p.s.cmd.Stdout, p.s.cmd.Stderr = p.out, &p.s.err
	p.s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.s.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		err := p.s.cmd.Wait()
		p.s.ended = time.Now()
		if ee, ok := err.(*exec.ExitError); ok {
			p.s.exitCode = ee.ExitCode()
		}
		close(p.s.done)
	}()
	t.Cleanup(p.s.stop)
	return p
}

// expect types an arithmetic echo and waits for the shell's answer (the
// typed text itself never contains the answer).
func (p *ptySession) expect(t *testing.T, mark string, limit time.Duration) {
	t.Helper()
	if _, err := fmt.Fprintf(p.in, "echo %s-$((6*7))\n", mark); err != nil {
		t.Fatalf("type into the session: %v", err)
	}
	want := mark + "-42"
	deadline := time.Now().Add(limit)
	for !strings.Contains(p.out.String(), want) {
		select {
		case <-p.s.done:
			t.Fatalf("session ended (exit %d) before %q: %s; output %q", p.s.exitCode, want, p.s.err.String(),
				p.out.String())
		case <-time.After(50 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("no %q within %s; output %q", want, limit, p.out.String())
		}
	}
}

// TestResumePTYOutageAndMove types into an interactive session with a stock
// ssh through the jump to a node on the auto transport: the session
// survives a 30 s outage of the node's link, and the node's move from QUIC
// to TCP when UDP stops getting through.
func TestResumePTYOutageAndMove(t *testing.T) {
	t.Parallel() // a 30 s outage on a link of its own: waiting, not working
	f := newResumeFixture(t, nil, map[string]string{"res-pty": "auto"})
	p := startPTY(t, f.c, "res-pty")
	p.expect(t, "before", 30*time.Second)
	outage := soakOr(30*time.Second, 60*time.Second)
	f.cut(t, outage)
	p.expect(t, "after-outage", 30*time.Second)
	if got := f.h.nodes()["res-pty"].Transport; !strings.HasPrefix(got, "quic") {
		t.Fatalf("node on %q after the outage, want quic before the move", got)
	}
	f.link.UDP.Down()
	waitForState(t, "the node on tcp", 60*time.Second, func() string { return f.h.nodes()["res-pty"].Transport },
		func(tr string) bool { return strings.HasPrefix(tr, "tcp") })
	p.expect(t, "after-move", 30*time.Second)
	if _, err := io.WriteString(p.in, "exit\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case <-p.s.done:
	case <-time.After(30 * time.Second):
		t.Fatal("session did not end on exit")
	}
	if p.s.exitCode != 0 {
		t.Fatalf("session exit %d: %s", p.s.exitCode, p.s.err.String())
	}
}

// TestResumeJobOutputAcrossCut runs a job whose command prints a line every
// 200 ms for 8 s while the node's link is cut for 4 s: the job succeeds
// and its log has every line, in order.
func TestResumeJobOutputAcrossCut(t *testing.T) {
	f := newResumeFixture(t, nil, map[string]string{"res-job": "tcp"})
	type result struct {
		j    jobJSON
		code int
	}
	done := make(chan result, 1)
	go func() {
		out, errOut, code := runCmdNoFatal(3*time.Minute, filepath.Join(binDir, "tether"), "run", "--data-dir",
			f.h.dataDir, "--progress", "never", "-o", "json", "--nodes", "res-job", "--",
			"for i in $(seq 1 40); do echo line-$i; sleep 0.2; done")
		var j jobJSON
		if err := json.Unmarshal([]byte(out), &j); err != nil {
			j.State = fmt.Sprintf("unreadable (exit %d): %q %s", code, out, errOut)
		}
		done <- result{j, code}
	}()
	time.Sleep(2 * time.Second)
	f.cut(t, 4*time.Second)
	r := <-done
	if r.code != 0 || r.j.State != "succeeded" {
		t.Fatalf("job across the cut: exit %d, job %+v", r.code, r.j)
	}
	log := f.h.cli("jobs", "logs", r.j.ID, "--node", "res-job")
	var lines []string
	for _, l := range strings.Split(log, "\n") {
		if strings.HasPrefix(strings.TrimSpace(l), "line-") {
			lines = append(lines, strings.TrimSpace(l))
		}
	}
	for i := range 40 {
		if i >= len(lines) || lines[i] != fmt.Sprintf("line-%d", i+1) {
			t.Fatalf("job log lines %d..: got %q, want line-1..line-40 in order; log:\n%s", i+1, lines, log)
		}
	}
}

// TestResumeWindowEnds cuts a node's link for longer than the hub's resume
// window: the operator's session ends soon after the window, and the jump's
// audit row says the node's link was down.
func TestResumeWindowEnds(t *testing.T) {
	f := newResumeFixture(t, []string{"--resume-window", "5s"}, map[string]string{"res-win": "tcp"})
	p := startPTY(t, f.c, "res-win")
	p.expect(t, "before", 30*time.Second)
	if err := f.link.Down(); err != nil {
		t.Fatal(err)
	}
	down := time.Now()
	select {
	case <-p.s.done:
	case <-time.After(40 * time.Second):
		t.Fatal("session still up 40 s into a cut with a 5 s resume window")
	}
	ended := p.s.ended.Sub(down)
	if err := f.link.Up(); err != nil {
		t.Fatal(err)
	}
	// The dead-peer timeout (3 s) comes first, then the window (5 s).
	if ended < 5*time.Second {
		t.Fatalf("session ended %s into the cut, before the 5 s window", ended)
	}
	t.Logf("session ended %s into the cut (exit %d: %s)", ended.Round(100*time.Millisecond), p.s.exitCode,
		strings.TrimSpace(p.s.err.String()))
	waitForState(t, "the jump's audit row", 30*time.Second, func() string { return f.h.cli("audit", "-o", "json") },
		func(s string) bool { return strings.Contains(s, "res-win's link was down for") })
}

// TestResumeAgentRestartEndsAtOnce: an agent killed -9 and started again
// says in its hello that it is another process (its resume instance), so
// the hub ends at once the streams it kept for the one that died, with the
// reason, instead of holding them for the whole resume window (60 s here):
// their other side died with the process.
func TestResumeAgentRestartEndsAtOnce(t *testing.T) {
	v := startVictim(t, "--keepalive", "1s", "--dead-peer-timeout", "4s")
	v.h.cli("operator", "add", "alice", "--key", opPub)
	p := startPTY(t, newSSHClient(t, v.h), "victim")
	p.expect(t, "before", 30*time.Second)
	v.p.Stop(syscall.SIGKILL, stopWait)
	v.restart()
	back := time.Now()
	select {
	case <-p.s.done:
	case <-time.After(20 * time.Second):
		t.Fatal("the session to the killed agent still up 20 s after the agent came back (60 s window)")
	}
	t.Logf("session ended %s after the agent came back (exit %d)", p.s.ended.Sub(back).Round(100*time.Millisecond),
		p.s.exitCode)
	waitForState(t, "the jump's audit row", 30*time.Second, func() string { return v.h.cli("audit", "-o", "json") },
		func(s string) bool { return strings.Contains(s, "node victim's agent restarted; session ended") })
}
