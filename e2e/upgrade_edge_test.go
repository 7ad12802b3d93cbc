package e2e

// The node side of over-the-air upgrades with real binaries: agents of
// two versions built from this checkout, a real hub, real state dirs, and
// the node verbs called as the hub's rollout controller calls them.

import (
	"encoding/json"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/edge/upgrade"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

const (
	oldVersion = "v1.0.0"
	newVersion = "v1.1.0"
)

// upNode is an agent under `tether-edge run --supervise`, started from a
// launcher of oldVersion.
type upNode struct {
	t        *testing.T
	h        *hub
	name     string
	dir      string
	launcher string
	sup      *proc
}

// launcherCopy puts a tether-edge of version into a directory every user
// may read (tests run it as nobody too).
func launcherCopy(t *testing.T, version string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "tether-launcher-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(testenv.EdgeVersion(t, version))
	if err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(dir, "tether-edge")
	testenv.WriteFile(t, p, b, 0o755)
	return p
}

func startUpNode(t *testing.T, h *hub, name string) *upNode {
	t.Helper()
	n := &upNode{t: t, h: h, name: name, dir: filepath.Join(t.TempDir(), name), launcher: launcherCopy(t, oldVersion)}
	n.start(h.token())
	h.waitOnline(name, "")
	if v := h.nodes()[name].AgentVersion; v != oldVersion {
		t.Fatalf("%s runs %q, want %s", name, v, oldVersion)
	}
	return n
}

func (n *upNode) start(join string) {
	args := testenv.AgentArgs(join, n.dir, n.name, "--backoff-max", "1s", "--log-level", "debug",
		"--ssh", "embedded", "--supervise")
	n.sup = start(n.t, "agent-"+n.name, n.launcher, args...)
}

// verb runs `tether-edge upgrade ARGS --state-dir DIR` as the hub does.
func (n *upNode) verb(stdin []byte, env []string, args ...string) (stdout, stderr string, code int) {
	n.t.Helper()
	cmd := exec.Command(n.launcher, append(append([]string{"upgrade"}, args...), "--state-dir", n.dir)...)
	cmd.Stdin = strings.NewReader(string(stdin))
	cmd.Env = append(os.Environ(), env...)
	var o, e testenv.SyncBuffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		n.t.Fatal(err)
	}
	return o.String(), e.String(), code
}

func (n *upNode) offer(o upgradeproto.Offer) upgrade.State {
	n.t.Helper()
	b, _ := json.Marshal(o)
	out, errOut, code := n.verb(b, nil, "offer")
	if code != 0 && code != 3 {
		n.t.Fatalf("offer: exit %d: %s", code, errOut)
	}
	return decodeUpState(n.t, out)
}

func (n *upNode) apply(name string, env ...string) (upgrade.State, string, int) {
	n.t.Helper()
	out, errOut, code := n.verb(nil, env, "apply", name)
	if code != 0 && code != 3 {
		n.t.Fatalf("apply: exit %d: %s", code, errOut)
	}
	return decodeUpState(n.t, out), errOut, code
}

func (n *upNode) status(name string) upgrade.State {
	n.t.Helper()
	out, errOut, code := n.verb(nil, nil, "status", name)
	if code != 0 {
		n.t.Fatalf("status: exit %d: %s", code, errOut)
	}
	var l []upgrade.State
	if err := json.Unmarshal([]byte(out), &l); err != nil || len(l) != 1 {
		n.t.Fatalf("status %q: %v", out, err)
	}
	return l[0]
}

// waitEnd waits for the upgrade's record to end.
func (n *upNode) waitEnd(name string, within time.Duration) upgrade.State {
	n.t.Helper()
	return waitForState(n.t, name+" to end", within, func() upgrade.State { return n.status(name) },
		func(s upgrade.State) bool { return s.Step.Terminal() })
}

// current is the version agent/current points at ("" if none).
func (n *upNode) link(l string) string {
	t, err := os.Readlink(filepath.Join(n.dir, "agent", l))
	if err != nil {
		return ""
	}
	if _, err := os.Stat(filepath.Join(n.dir, "agent", t)); err != nil {
		n.t.Fatalf("agent/%s points at %s, which is not there: %v", l, t, err)
	}
	return strings.TrimSuffix(strings.TrimPrefix(t, "versions/"), "/tether-edge")
}

// agentPID is the supervised agent's pid (status.json), once it differs from skip.
func (n *upNode) agentPID(skip int) int {
	n.t.Helper()
	return waitForState(n.t, "the agent's pid", 30*time.Second, func() int {
		var st struct{ PID int }
		b, err := os.ReadFile(filepath.Join(n.dir, "status.json"))
		if err != nil || json.Unmarshal(b, &st) != nil {
			return 0
		}
		return st.PID
	}, func(p int) bool { return p != 0 && p != skip && p != n.sup.PID() && testenv.ProcessAlive(p) })
}

// waitVersion waits until the hub shows the node online on version v, on
// a connection made after before.
func (n *upNode) waitVersion(v string, before int) {
	n.t.Helper()
	waitFor(n.t, n.name+" online on "+v, 60*time.Second, func() bool {
		nd := n.h.nodes()[n.name]
		return n.h.connects(n.name) > before && nd.Online && nd.AgentVersion == v
	})
}

func decodeUpState(t *testing.T, out string) upgrade.State {
	t.Helper()
	var s upgrade.State
	if err := json.Unmarshal([]byte(out), &s); err != nil {
		t.Fatalf("state %q: %v", out, err)
	}
	return s
}

// agentUpgrade offers and uploads an agent upgrade of binary and applies it.
func (n *upNode) agentUpgrade(name string, binary []byte, timeout int, env ...string) upgrade.State {
	n.t.Helper()
	o := testenv.AgentOffer(n.t, name, newVersion, binary)
	o.HealthTimeoutSeconds = timeout
	if s := n.offer(o); s.Step != upgradeproto.StepDownloading {
		n.t.Fatalf("offer: %s %q", s.Step, s.Reason)
	}
	testenv.UploadUpgradeFiles(n.t, n.dir, name, binary)
	s, _, _ := n.apply(name, env...)
	return s
}

func readFile(t *testing.T, p string) []byte {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// The happy path: the new version is installed beside the old, switched
// in, restarted by the supervisor, welcomed by the hub: succeeded, with
// the old version kept as previous.
func TestUpgradeEdgeAgent(t *testing.T) {
	h := startHub(t)
	n := startUpNode(t, h, "up-1")
	before := h.connects("up-1")
	s := n.agentUpgrade("edge-1.1", readFile(t, testenv.EdgeVersion(t, newVersion)), 30)
	if s.Step != upgradeproto.StepInstalling {
		t.Fatalf("apply: %s %q", s.Step, s.Reason)
	}
	s = n.waitEnd("edge-1.1", 60*time.Second)
	if s.Step != upgradeproto.StepSucceeded || s.FromVersion != oldVersion || s.ToVersion != newVersion {
		t.Fatalf("%s %q (%s -> %s)", s.Step, s.Reason, s.FromVersion, s.ToVersion)
	}
	n.waitVersion(newVersion, before)
	if c, p := n.link("current"), n.link("previous"); c != newVersion || p != oldVersion {
		t.Fatalf("current %q previous %q", c, p)
	}
	// The same offer again is the record as it is; the version running
	// now is skipped.
	if again := n.offer(
		testenv.AgentOffer(t, "edge-1.1", newVersion, readFile(t, testenv.EdgeVersion(t, newVersion))),
	); again.Step != upgradeproto.StepSucceeded {
		t.Fatalf("offer again: %s", again.Step)
	}
	if s := n.offer(
		testenv.AgentOffer(t, "edge-1.1b", newVersion, []byte("x")),
	); s.Step != upgradeproto.StepSkipped || s.Reason != "already at "+newVersion {
		t.Fatalf("offer of the running version: %s %q", s.Step, s.Reason)
	}
	if s := n.offer(
		testenv.AgentOffer(t, "edge-1.0", oldVersion, []byte("x")),
	); s.Step != upgradeproto.StepFailed || !strings.Contains(s.Reason, "downgrade from v1.1.0 to v1.0.0 refused") {
		t.Fatalf("downgrade: %s %q", s.Step, s.Reason)
	}
}

// A release that starts but never reaches the hub: back on the old
// version within the health timeout, the reason recorded.
func TestUpgradeEdgeAgentNoReconnect(t *testing.T) {
	h := startHub(t)
	n := startUpNode(t, h, "up-2")
	before := h.connects("up-2")
	began := time.Now()
	n.agentUpgrade("edge-1.1", []byte("#!/bin/sh\nexec sleep 600\n"), 5)
	s := n.waitEnd("edge-1.1", 60*time.Second)
	if s.Step != upgradeproto.StepRolledBack ||
		s.Reason != "new version v1.1.0 did not reconnect within 5s; back on v1.0.0" {
		t.Fatalf("%s %q", s.Step, s.Reason)
	}
	n.waitVersion(oldVersion, before)
	t.Logf("back on %s %s after the apply (health timeout 5s)", oldVersion, time.Since(began).Round(100*time.Millisecond))
	if c := n.link("current"); c != oldVersion {
		t.Fatalf("current %q", c)
	}
}

// A release that exits at once: rolled back after 3 exits in a row.
func TestUpgradeEdgeAgentCrashLoop(t *testing.T) {
	h := startHub(t)
	n := startUpNode(t, h, "up-3")
	before := h.connects("up-3")
	n.agentUpgrade("edge-1.1", []byte("#!/bin/sh\necho broken release >&2\nexit 1\n"), 120)
	s := n.waitEnd("edge-1.1", 60*time.Second)
	if s.Step != upgradeproto.StepRolledBack || s.Reason != "new version v1.1.0 crashed 3 times; back on v1.0.0" {
		t.Fatalf("%s %q", s.Step, s.Reason)
	}
	n.waitVersion(oldVersion, before)
	if c := n.link("current"); c != oldVersion {
		t.Fatalf("current %q", c)
	}
}

// The updater killed (kill -9) at each point of the switch, then the agent
// killed too: after the restart the node is in a known state, on a whole
// version: rolled back when the switch had not started the new version,
// succeeded when it had.
func TestUpgradeEdgeKilledMidSwitch(t *testing.T) {
	h := startHub(t)
	bin := readFile(t, testenv.EdgeVersion(t, newVersion))
	for i, point := range upgrade.CrashPoints {
		t.Run(point, func(t *testing.T) {
			name := "up-k" + strconv.Itoa(i)
			n := startUpNode(t, h, name)
			n.t = t
			pid := n.agentPID(0)
			n.agentUpgrade("edge-1.1", bin, 20, "TETHER_UPGRADE_TEST_KILL_AT="+point)
			// The updater is gone once nobody holds its lock.
			// The updater is gone once its lock file exists and nobody holds it.
			waitFor(t, "the updater to be killed at "+point, 30*time.Second, func() bool {
				return lockFree(filepath.Join(n.dir, "upgrades", "edge-1.1", "watch.lock"))
			})
			if testenv.ProcessAlive(pid) {
				_ = syscall.Kill(pid, syscall.SIGKILL)
			}
			n.agentPID(pid)
			s := n.waitEnd("edge-1.1", 60*time.Second)
			want := map[string]upgradeproto.Step{
				"before-switch": upgradeproto.StepRolledBack, "after-previous": upgradeproto.StepRolledBack,
				"after-switch": upgradeproto.StepRolledBack, "after-health-check": upgradeproto.StepSucceeded,
				"after-restart": upgradeproto.StepSucceeded,
			}[point]
			if s.Step != want {
				t.Fatalf("killed at %s: %s %q, want %s", point, s.Step, s.Reason, want)
			}
			v := map[upgradeproto.Step]string{
				upgradeproto.StepRolledBack: oldVersion, upgradeproto.StepSucceeded: newVersion,
			}[want]
			if c := n.link("current"); c != v {
				t.Fatalf("current %q, want %s", c, v)
			}
			waitFor(t, name+" online on "+v, 60*time.Second, func() bool {
				nd := h.nodes()[name]
				return nd.Online && nd.AgentVersion == v
			})
			t.Logf("killed at %s: %s %q", point, s.Step, s.Reason)
		})
	}
}

// A power cut during the health check of a release that never reaches
// the hub: the updater, the agent and its supervisor all gone. When the
// node comes back after the deadline, the agent's start rolls back by
// itself before the new version runs.
func TestUpgradeEdgePowerCutOverdue(t *testing.T) {
	h := startHub(t)
	n := startUpNode(t, h, "up-7")
	before := h.connects("up-7")
	n.agentUpgrade("edge-1.1", []byte("#!/bin/sh\nexec sleep 600\n"), 3, "TETHER_UPGRADE_TEST_KILL_AT=after-health-check")
	waitFor(t, "the updater to be killed", 30*time.Second, func() bool {
		return lockFree(filepath.Join(n.dir, "upgrades", "edge-1.1", "watch.lock"))
	})
	pid := n.agentPID(0)
	n.sup.Kill() // the agent dies with it (as with its unit)
	testenv.WaitProcessGone(t, pid, 30*time.Second)
	var sw struct{ Deadline time.Time }
	if err := json.Unmarshal(readFile(t, filepath.Join(n.dir, "upgrades", "edge-1.1", "switch.json")), &sw); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the health deadline to pass", 30*time.Second, func() bool { return time.Now().After(sw.Deadline) })
	if s := n.status("edge-1.1"); s.Step != upgradeproto.StepHealthCheck || n.link("current") != newVersion {
		t.Fatalf("after the power cut: %s %q on %s, want health_check on the new version", s.Step, s.Reason,
			n.link("current"))
	}
	n.start("")
	s := n.waitEnd("edge-1.1", 30*time.Second)
	if s.Step != upgradeproto.StepRolledBack ||
		s.Reason != "new version v1.1.0 did not reconnect within 3s (the updater was not running); back on v1.0.0" {
		t.Fatalf("%s %q", s.Step, s.Reason)
	}
	n.waitVersion(oldVersion, before)
}

// A file changed after the hub uploaded it: nothing runs, the reason is
// exact, nothing of the upgrade is left on disk.
func TestUpgradeEdgeTampered(t *testing.T) {
	h := startHub(t)
	n := startUpNode(t, h, "up-4")
	good := readFile(t, testenv.EdgeVersion(t, newVersion))
	o := testenv.AgentOffer(t, "edge-1.1", newVersion, good)
	n.offer(o)
	evil := []byte("#!/bin/sh\necho pwned\n")
	testenv.UploadUpgradeFiles(t, n.dir, "edge-1.1", evil)
	if err := os.Rename(
		filepath.Join(upgradeproto.IncomingDir(n.dir, "edge-1.1"), upgradeproto.DigestHex(upgradeproto.DigestOf(evil))),
		filepath.Join(upgradeproto.IncomingDir(n.dir, "edge-1.1"), upgradeproto.DigestHex(upgradeproto.DigestOf(good))),
	); err != nil {
		t.Fatal(err)
	}
	s, _, code := n.apply("edge-1.1")
	want := "digest mismatch (want " + upgradeproto.DigestOf(good) + ", got " + upgradeproto.DigestOf(evil) + ")"
	if s.Step != upgradeproto.StepFailed || s.Reason != want || code != 3 {
		t.Fatalf("%s %q (exit %d), want failed %q", s.Step, s.Reason, code, want)
	}
	for _, p := range []string{
		upgradeproto.IncomingDir(n.dir, "edge-1.1"), filepath.Join(n.dir, "upgrades", "edge-1.1", "stage"),
		filepath.Join(n.dir, "agent", "versions", newVersion),
	} {
		if _, err := os.Stat(p); err == nil {
			t.Errorf("%s left on disk", p)
		}
	}
	if c := n.link("current"); c != "" {
		t.Fatalf("current switched to %q", c)
	}
}

// An upgrade waiting for confirmation stays waiting across an agent
// restart; nobody but root can confirm it on the node; root can, and who
// did is recorded.
func TestUpgradeEdgeConfirm(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("confirming on the node takes root (make test runs e2e as root)")
	}
	h := startHub(t)
	n := startUpNode(t, h, "up-5")
	out := t.TempDir()
	install := []byte("echo installing >&2\ntouch " + filepath.Join(out, "installed") + "\n")
	o := testenv.BundleOffer(t, "patch-42", "42", map[string][]byte{"install.sh": install})
	o.FromVersion, o.RequireConfirmation = "41", true
	if s := n.offer(o); s.Step != upgradeproto.StepAwaitingConfirmation {
		t.Fatalf("offer: %s", s.Step)
	}
	testenv.UploadUpgradeFiles(t, n.dir, "patch-42", install)
	if _, errOut, code := n.verb(nil, nil, "apply", "patch-42"); code != 1 ||
		!strings.Contains(errOut, "waits for confirmation") {
		t.Fatalf("apply unconfirmed: exit %d %s", code, errOut)
	}
	// The agent restarts (kill -9, the supervisor starts it again).
	pid := n.agentPID(0)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	n.agentPID(pid)
	confirm := func(cred *syscall.Credential, args ...string) (string, string, int) {
		cmd := exec.Command(n.launcher, append([]string{"confirm", "--state-dir", n.dir}, args...)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Credential: cred}
		var o, e testenv.SyncBuffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatal(err)
		}
		return o.String(), e.String(), code
	}
	list := waitForState(t, "the socket to list the waiting upgrade", 30*time.Second, func() string {
		o, _, _ := confirm(nil, "--list")
		return o
	}, func(s string) bool { return strings.Contains(s, "patch-42") })
	if !strings.Contains(list, "41 -> 42") || !strings.Contains(list, o.Digest) {
		t.Fatalf("--list:\n%s", list)
	}
	if u, err := user.Lookup("nobody"); err == nil {
		uid, _ := strconv.Atoi(u.Uid)
		gid, _ := strconv.Atoi(u.Gid)
		_, errOut, code := confirm(&syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, "patch-42")
		if code == 0 || !strings.Contains(errOut, "only root may confirm") {
			t.Fatalf("nobody's confirm: exit %d %s", code, errOut)
		}
		if s := n.status("patch-42"); s.Step != upgradeproto.StepAwaitingConfirmation {
			t.Fatalf("after nobody's confirm: %s", s.Step)
		}
	}
	stdout, errOut, code := confirm(nil)
	host, _ := os.Hostname()
	who := "root@" + host + " (on the node)"
	if code != 0 || !strings.Contains(stdout, "confirmed patch-42 (41 -> 42, "+o.Digest+") as "+who) {
		t.Fatalf("confirm: exit %d %s %s", code, stdout, errOut)
	}
	if s := n.status("patch-42"); s.Step != upgradeproto.StepDownloading || s.ConfirmedBy != who {
		t.Fatalf("%s by %q", s.Step, s.ConfirmedBy)
	}
	s, errOut, _ := n.apply("patch-42")
	if s.Step != upgradeproto.StepSucceeded || !strings.Contains(errOut, "installing") {
		t.Fatalf("apply: %s %q, stderr %s", s.Step, s.Reason, errOut)
	}
	// Without a running agent, confirm says so.
	n.sup.Stop(syscall.SIGTERM, stopWait)
	if _, errOut, code := confirm(nil, "--list"); code == 0 || !strings.Contains(errOut, "no running agent") {
		t.Fatalf("confirm without agent: exit %d %s", code, errOut)
	}
}

// A bundle whose health script fails runs its rollback script; the
// scripts' output is on the verb's stderr, its exit status says so.
func TestUpgradeEdgeBundleRollback(t *testing.T) {
	h := startHub(t)
	n := startUpNode(t, h, "up-6")
	out := t.TempDir()
	files := map[string][]byte{
		"install.sh":  []byte("echo install ran >&2\ncp \"$TETHER_UPGRADE_DIR/app.conf\" " + out + "/\n"),
		"health.sh":   []byte("echo health failing >&2\nexit 9\n"),
		"rollback.sh": []byte("echo rollback ran >&2\nrm " + out + "/app.conf\n"),
		"app.conf":    []byte("v=2\n"),
	}
	o := testenv.BundleOffer(t, "app-2", "2", files)
	n.offer(o)
	for _, b := range files {
		testenv.UploadUpgradeFiles(t, n.dir, "app-2", b)
	}
	s, errOut, code := n.apply("app-2")
	if s.Step != upgradeproto.StepRolledBack || s.Reason != "health.sh exited with status 9; rollback.sh ran" ||
		code != 3 {
		t.Fatalf("%s %q exit %d\n%s", s.Step, s.Reason, code, errOut)
	}
	for _, w := range []string{"install ran", "health failing", "rollback ran"} {
		if !strings.Contains(errOut, w) {
			t.Errorf("stderr lacks %q:\n%s", w, errOut)
		}
	}
	if _, err := os.Stat(filepath.Join(out, "app.conf")); err == nil {
		t.Fatal("rollback.sh did not run")
	}
}

// lockFree reports whether the lock file exists and no process holds it.
func lockFree(p string) bool {
	f, err := os.Open(p)
	if err != nil {
		return false
	}
	defer f.Close()
	if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) != nil {
		return false
	}
	_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
	return true
}
