package e2e

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/faultproxy"
	"github.com/tether-dev/tether/internal/testenv"
)

// Helpers for the fault and attack tests (fault_*_test.go, attack_*_test.go).

// soak reports whether the long versions run: `make soak` sets TETHER_SOAK.
func soak() bool { return os.Getenv("TETHER_SOAK") != "" }

// soakOr is short in `make test` and long in `make soak`.
func soakOr[T any](short, long T) T {
	if soak() {
		return long
	}
	return short
}

// startHubArgs starts a hub with extra `tether hub` flags on the given API
// port (0: a free one).
func startHubArgs(t *testing.T, apiPort int, args ...string) *hub {
	t.Helper()
	return startHubIn(t, "", apiPort, args...)
}

// newLink puts a fault proxy (TCP and UDP on one port) in front of a hub
// port that is not started yet: agents joined with `--advertise
// link.Addr()` tokens dial through it.
func newLink(t *testing.T) (link *faultproxy.Link, hubPort int) {
	t.Helper()
	hubPort = freePort(t)
	link, err := faultproxy.NewLink("127.0.0.1:0", fmt.Sprintf("127.0.0.1:%d", hubPort))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { link.Close() })
	return link, hubPort
}

// load is what the leak checks compare: the hub's goroutines (its
// go_goroutines metric) and open file descriptors (/proc/PID/fd).
type load struct{ goroutines, fds int }

func (l load) String() string { return fmt.Sprintf("%d goroutines, %d fds", l.goroutines, l.fds) }

// steadyLoad samples the hub for a few seconds and returns the smallest
// values seen: transient goroutines (a request being served, a timer
// firing) come and go; leaked ones stay.
func (h *hub) steadyLoad(t *testing.T) load {
	t.Helper()
	best := load{goroutines: 1 << 30, fds: 1 << 30}
	for range 6 {
		body := h.metrics(t)
		g, ok := metricValue(body, "go_goroutines")
		if !ok {
			t.Fatal("hub metrics lack go_goroutines")
		}
		best.goroutines = min(best.goroutines, int(g))
		best.fds = min(best.fds, countFDs(t, h.p.PID()))
		time.Sleep(400 * time.Millisecond)
	}
	return best
}

func countFDs(t *testing.T, pid int) int {
	t.Helper()
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		t.Fatalf("count fds of %d: %v", pid, err)
	}
	return len(ents)
}

// metricValue returns the value of the first sample whose name (with
// labels, if given in name) matches.
func metricValue(body, name string) (float64, bool) {
	for _, line := range strings.Split(body, "\n") {
		if rest, ok := strings.CutPrefix(line, name); ok && strings.HasPrefix(rest, " ") {
			v, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
			return v, err == nil
		}
	}
	return 0, false
}

// logCount counts the hub log lines of msg for node.
func logCount(text, msg, node string) int {
	re := regexp.MustCompile(`msg="` + regexp.QuoteMeta(msg) + `".* node=` + regexp.QuoteMeta(node) + `( |$)`)
	return len(re.FindAllStringIndex(text, -1))
}

// session is a long-running `ssh -J` command.
type session struct {
	cmd      *exec.Cmd
	out, err testenv.SyncBuffer
	done     chan struct{}
	exitCode int
	ended    time.Time
}

// startSession runs command on node through the jump until it ends or
// stop is called.
func (c *sshClient) startSession(node, command string) *session {
	c.t.Helper()
	s := &session{done: make(chan struct{})}
	s.cmd = exec.Command("ssh", append(c.jumpArgs(node), command)...)
	s.cmd.Stdout, s.cmd.Stderr = &s.out, &s.err
	s.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := s.cmd.Start(); err != nil {
		c.t.Fatal(err)
	}
	go func() {
		err := s.cmd.Wait()
		s.ended = time.Now()
		s.exitCode = 0
		if ee, ok := err.(*exec.ExitError); ok {
			s.exitCode = ee.ExitCode()
		}
		close(s.done)
	}()
	c.t.Cleanup(s.stop)
	return s
}

// lines counts the lines the session printed.
func (s *session) lines() int { return strings.Count(s.out.String(), "\n") }

func (s *session) exited() bool {
	select {
	case <-s.done:
		return true
	default:
		return false
	}
}

// stop ends the session (its whole process group) and waits.
func (s *session) stop() {
	if s.exited() {
		return
	}
	_ = syscall.Kill(-s.cmd.Process.Pid, syscall.SIGKILL)
	<-s.done
}

// percentile of durations (p in 0..100), nearest rank.
func percentile(ds []time.Duration, p int) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	return s[max(0, min(len(s)-1, i-1))]
}

// jumpAll runs `echo word` on every node through the jump, in parallel.
func jumpAll(t *testing.T, c *sshClient, word string, nodes ...string) {
	t.Helper()
	type res struct {
		node, out, errOut string
		code              int
	}
	ch := make(chan res, len(nodes))
	for _, n := range nodes {
		go func() {
			// runCmd may call t.Fatal, which must not happen off the test
			// goroutine: run ssh directly.
			cmd := exec.Command("ssh", append(c.jumpArgs(n), "echo "+word)...)
			var o, e bytes.Buffer
			cmd.Stdout, cmd.Stderr = &o, &e
			done := make(chan error, 1)
			_ = cmd.Start()
			go func() { done <- cmd.Wait() }()
			code := 0
			select {
			case err := <-done:
				if ee, ok := err.(*exec.ExitError); ok {
					code = ee.ExitCode()
				} else if err != nil {
					code = -1
				}
			case <-time.After(60 * time.Second):
				_ = cmd.Process.Kill()
				<-done
				code = -2
			}
			ch <- res{n, o.String(), e.String(), code}
		}()
	}
	for range nodes {
		r := <-ch
		if r.code != 0 || strings.TrimSpace(r.out) != word {
			t.Errorf("jump to %s: exit %d, out %q, err %q", r.node, r.code, r.out, r.errOut)
		}
	}
	if t.Failed() {
		t.FailNow()
	}
}
