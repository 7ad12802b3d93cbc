package upgrade

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// CrashLoopExits: an agent upgrade is rolled back when the new version
// exits this many times in a row during its health check. The launcher
// (`tether-edge run`, before it execs the installed version) counts its
// starts of the new version: the updater's restart is the first, so the
// start after the Nth exit is start N+1, and that start runs the previous
// version instead.
const CrashLoopExits = 3

// agent install layout under the state dir.
const (
	agentDirName = "agent"
	binName      = upgradeproto.AgentBinaryName
	linkCurrent  = "current"
	linkPrevious = "previous"
)

func (n *Node) agentDir() string { return filepath.Join(n.Dir, agentDirName) }

// switchRecord is an agent upgrade's switch, beside its state.
type switchRecord struct {
	Previous       string    `json:"previous"` // the version to go back to
	To             string    `json:"to"`
	TimeoutSeconds int       `json:"timeout_seconds"`
	Deadline       time.Time `json:"deadline,omitzero"` // set when the new version is started
	Starts         int       `json:"starts"`            // launcher starts of the new version since then
}

func (sw *switchRecord) timeout() time.Duration {
	if sw.TimeoutSeconds > 0 {
		return time.Duration(sw.TimeoutSeconds) * time.Second
	}
	return upgradeproto.DefaultHealthTimeout
}

func (n *Node) switchPath(name string) string { return filepath.Join(n.recordDir(name), "switch.json") }

func (n *Node) loadSwitch(name string) (*switchRecord, error) {
	var sw switchRecord
	if err := readJSON(n.switchPath(name), &sw); err != nil {
		return nil, err
	}
	if !safeVersionDir(sw.Previous) || !safeVersionDir(sw.To) {
		return nil, fmt.Errorf("%s: bad versions %q, %q", n.switchPath(name), sw.Previous, sw.To)
	}
	return &sw, nil
}

// linkVersion is the version an agent/ symlink points at ("" if none).
func (n *Node) linkVersion(link string) string {
	t, err := os.Readlink(filepath.Join(n.agentDir(), link))
	if err != nil {
		return ""
	}
	v, ok := strings.CutPrefix(t, "versions/")
	if !ok {
		return ""
	}
	v, ok = strings.CutSuffix(v, "/"+binName)
	if !ok || !safeVersionDir(v) {
		return ""
	}
	return v
}

// InstalledVersion is the agent version the node runs: agent/current's,
// or this executable's when nothing was installed yet.
func (n *Node) InstalledVersion() string {
	if v := n.linkVersion(linkCurrent); v != "" {
		return v
	}
	return n.Version
}

// PreviousVersion is the last good version a rollback goes back to ("").
func (n *Node) PreviousVersion() string { return n.linkVersion(linkPrevious) }

// CurrentExe is the installed version's executable, "" when none is.
func (n *Node) CurrentExe() string {
	v := n.linkVersion(linkCurrent)
	if v == "" {
		return ""
	}
	p := filepath.Join(n.agentDir(), "versions", v, binName)
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}

// setLink points agent/<link> at version v atomically: a symlink under a
// temporary name renamed over the old one, so a power cut leaves the old
// link or the new one, never none or a torn one.
func (n *Node) setLink(link, v string) error {
	dir := n.agentDir()
	var r [6]byte
	_, _ = rand.Read(r[:])
	tmp := filepath.Join(dir, "."+link+".tmp-"+hex.EncodeToString(r[:]))
	if err := os.Symlink("versions/"+v+"/"+binName, tmp); err != nil {
		return fmt.Errorf("switch %s to %s: %w", link, v, err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, link)); err != nil {
		os.Remove(tmp)
		return fmt.Errorf("switch %s to %s: %w", link, v, err)
	}
	syncDir(dir)
	return nil
}

// installVersion puts a verified binary at agent/versions/V/tether-edge
// (temp name, fsync, rename: a running executable is never written over)
// and checks the installed file's digest once more.
func (n *Node) installVersion(v, src, digest string) error {
	dir := filepath.Join(n.agentDir(), "versions", v)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	dst := filepath.Join(dir, binName)
	if digest != "" {
		if got, err := fileDigest(dst); err == nil && got == digest {
			return nil
		}
	}
	tmp := dst + ".tmp"
	got, err := copyHashed(src, tmp, 0o755)
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("install agent %s: %w", v, err)
	}
	if digest != "" && got != digest {
		os.Remove(tmp)
		return fmt.Errorf("install agent %s: digest mismatch (want %s, got %s)", v, digest, got)
	}
	if err := os.Rename(tmp, dst); err != nil {
		return fmt.Errorf("install agent %s: %w", v, err)
	}
	syncDir(dir)
	return nil
}

func fileDigest(p string) (string, error) {
	f, err := os.Open(p)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", err
	}
	return "sha256:" + hex.EncodeToString(h.Sum(nil)), nil
}

// installAgent installs the verified new version beside the running one
// and starts the updater; the record stays in installing until the updater
// switches.
func (n *Node) installAgent(s *State, o *upgradeproto.Offer) error {
	mgr := n.Manager()
	if err := mgr.check(); err != nil {
		return n.fail(s, err.Error())
	}
	m, err := o.Verify()
	if err != nil {
		return n.fail(s, err.Error())
	}
	if err := n.installVersion(s.ToVersion, filepath.Join(n.stageDir(s.Name), binName), m.Files()[0].Digest); err != nil {
		return n.fail(s, err.Error())
	}
	prev := n.InstalledVersion()
	if n.CurrentExe() == "" {
		// Nothing installed yet: the launcher itself is the version to
		// go back to, so it is installed as one.
		if !safeVersionDir(prev) {
			return n.fail(s, fmt.Sprintf("the running agent's version %q cannot name an install directory", prev))
		}
		if err := n.installVersion(prev, n.Exe, ""); err != nil {
			return n.fail(s, err.Error())
		}
	}
	sw := switchRecord{Previous: prev, To: s.ToVersion, TimeoutSeconds: o.HealthTimeoutSeconds}
	if err := writeJSON(n.switchPath(s.Name), sw); err != nil {
		return n.fail(s, err.Error())
	}
	os.RemoveAll(n.stageDir(s.Name))
	if err := n.spawnWatcher(s.Name, mgr); err != nil {
		return n.fail(s, "start the updater: "+err.Error())
	}
	return nil
}

// spawnWatcher starts `EXE upgrade watch` outside this process and the
// agent's: under systemd as a transient unit (systemd-run), so restarting
// the agent's unit does not stop it; otherwise in a new session.
func (n *Node) spawnWatcher(name string, mgr Manager) error {
	args := []string{"upgrade", "watch", "--state-dir", n.Dir, name}
	if mgr.Kind == ManagerSystemd {
		if p, err := exec.LookPath("systemd-run"); err == nil {
			unit := "tether-edge-upgrade-" + strings.ReplaceAll(name, ".", "-")
			out, err := exec.Command(p, append([]string{
				"--unit", unit, "--collect", "--quiet", "--", n.Exe,
			}, args...)...).CombinedOutput()
			if err == nil {
				return nil
			}
			n.log().Warn("systemd-run failed; starting the updater in its own session", "err", err, "output", string(out))
		}
	}
	logf, err := os.OpenFile(filepath.Join(n.recordDir(name), "watch.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer logf.Close()
	cmd := exec.Command(n.Exe, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	return cmd.Process.Release()
}

// crashPoint kills this process at the named point of the switch when
// TETHER_UPGRADE_TEST_KILL_AT names it: fault injection for the tests
// that prove every interruption ends in a known state.
func crashPoint(p string) {
	if os.Getenv("TETHER_UPGRADE_TEST_KILL_AT") == p {
		_ = syscall.Kill(os.Getpid(), syscall.SIGKILL)
		select {}
	}
}

// CrashPoints are the places of the switch TETHER_UPGRADE_TEST_KILL_AT names.
var CrashPoints = []string{"before-switch", "after-previous", "after-switch", "after-health-check", "after-restart"}

// Watch is the updater (`tether-edge upgrade watch`): it switches
// agent/current to the new version, restarts the agent through its
// service manager, and waits for the health check: the new version marks
// the record succeeded once the hub welcomed it (MarkHealthy). When the
// deadline passes first, it switches back and restarts the previous
// version. A second updater for the same upgrade exits at once.
func (n *Node) Watch(ctx context.Context, name string) error {
	wl, err := lockFile(filepath.Join(n.recordDir(name), "watch.lock"), 0)
	if errors.Is(err, ErrBusy) {
		n.log().Info("another updater watches this upgrade", "name", name)
		return nil
	}
	if err != nil {
		return err
	}
	defer wl.Close()
	s, err := n.Load(name)
	if err != nil {
		return err
	}
	sw, err := n.loadSwitch(name)
	if err != nil {
		if s.Step == upgradeproto.StepInstalling {
			_, _ = n.update(name, func(s *State) error { return n.fail(s, "the switch record is unreadable: "+err.Error()) })
		}
		return err
	}
	if s.Step == upgradeproto.StepInstalling {
		crashPoint("before-switch")
		if err := n.setLink(linkPrevious, sw.Previous); err != nil {
			return n.rollback(name, sw, err.Error(), false)
		}
		crashPoint("after-previous")
		if err := n.setLink(linkCurrent, sw.To); err != nil {
			return n.rollback(name, sw, err.Error(), false)
		}
		crashPoint("after-switch")
		if _, err := n.update(name, func(s *State) error {
			if s.Step != upgradeproto.StepInstalling {
				return fmt.Errorf("upgrade %s moved to %s meanwhile", name, s.Step)
			}
			sw.Deadline, sw.Starts = n.now().Add(sw.timeout()).UTC(), 0
			if err := writeJSON(n.switchPath(name), sw); err != nil {
				return err
			}
			return n.move(s, upgradeproto.StepHealthCheck, "restarting the agent on "+sw.To)
		}); err != nil {
			return err
		}
		crashPoint("after-health-check")
		if err := n.Manager().restart(); err != nil {
			return n.rollback(name, sw, "restart the agent: "+err.Error(), false)
		}
		crashPoint("after-restart")
	} else if s.Step != upgradeproto.StepHealthCheck {
		return nil
	}
	t := time.NewTicker(250 * time.Millisecond)
	defer t.Stop()
	for {
		s, err := n.Load(name)
		if err != nil {
			return err
		}
		if s.Step.Terminal() {
			if s.Step == upgradeproto.StepSucceeded {
				n.prune()
			}
			return nil
		}
		if cur, err := n.loadSwitch(name); err == nil {
			sw = cur
		}
		if n.now().After(sw.Deadline) {
			return n.rollback(name, sw, fmt.Sprintf("new version %s did not reconnect within %s", sw.To, sw.timeout()), true)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

// rollback switches agent/current back to the previous version and ends
// the record rolled_back(reason); restart restarts the agent on it.
func (n *Node) rollback(name string, sw *switchRecord, reason string, restart bool) error {
	done := false
	_, err := n.update(name, func(s *State) error {
		if s.Step != upgradeproto.StepInstalling && s.Step != upgradeproto.StepHealthCheck {
			return nil
		}
		if err := n.setLink(linkCurrent, sw.Previous); err != nil {
			return err
		}
		done = true
		return n.move(s, upgradeproto.StepRolledBack, reason+"; back on "+sw.Previous)
	})
	if err != nil || !done || !restart {
		return err
	}
	return n.Manager().restart()
}

// Launch is what the launcher (`tether-edge run`, once per start, before
// it execs the installed version) does about agent upgrades under way, and
// it returns the executable to run ("" for the launcher itself):
//   - an upgrade left in installing with no updater alive (killed, power
//     cut) is switched back to the previous version: rolled_back;
//   - in health_check, each start of the new version is counted, and the
//     start after CrashLoopExits exits runs the previous version instead:
//     rolled_back("new version V crashed N times");
//   - in health_check with no updater alive, an overdue check is rolled
//     back here, before the new version runs; one still in time gets a
//     new updater.
func (n *Node) Launch() (exe string, changed []State) {
	all, _ := n.List()
	for _, s := range all {
		if s.Kind != upgradeproto.KindAgent ||
			(s.Step != upgradeproto.StepInstalling && s.Step != upgradeproto.StepHealthCheck) {
			continue
		}
		if st := n.launchOne(s.Name); st != nil {
			changed = append(changed, *st)
		}
	}
	return n.CurrentExe(), changed
}

func (n *Node) launchOne(name string) *State {
	l, err := n.lock(name, 2*time.Second)
	if err != nil {
		return nil // an apply is running: it starts the updater itself
	}
	defer l.Close()
	s, err := n.Load(name)
	if err != nil {
		return nil
	}
	watcher := held(filepath.Join(n.recordDir(name), "watch.lock"))
	sw, swErr := n.loadSwitch(name)
	back := func(reason string) *State {
		if err := n.setLink(linkCurrent, sw.Previous); err != nil {
			n.log().Error("roll back", "name", name, "err", err)
			return nil
		}
		if n.move(s, upgradeproto.StepRolledBack, reason+"; back on "+sw.Previous) != nil {
			return nil
		}
		return s
	}
	switch {
	case s.Step == upgradeproto.StepInstalling && watcher:
		return nil
	case s.Step == upgradeproto.StepInstalling && swErr != nil:
		if n.fail(s, "interrupted before the switch (the updater was killed or the node lost power)") != nil {
			return nil
		}
		n.removeFiles(name)
		return s
	case s.Step == upgradeproto.StepInstalling:
		return back("the switch to " + sw.To + " was interrupted (the updater was killed or the node lost power)")
	case swErr != nil:
		if n.fail(s, "the switch record is unreadable: "+swErr.Error()) != nil {
			return nil
		}
		return s
	}
	// health_check
	if n.linkVersion(linkCurrent) == sw.To {
		sw.Starts++
		if err := writeJSON(n.switchPath(name), sw); err != nil {
			n.log().Error("count the new version's starts", "name", name, "err", err)
		}
		if sw.Starts > CrashLoopExits {
			return back(fmt.Sprintf("new version %s crashed %d times", sw.To, sw.Starts-1))
		}
	}
	if watcher {
		return nil
	}
	if n.now().After(sw.Deadline) {
		return back(fmt.Sprintf("new version %s did not reconnect within %s (the updater was not running)", sw.To,
			sw.timeout()))
	}
	if err := n.spawnWatcher(name, n.Manager()); err != nil {
		n.log().Error("restart the updater", "name", name, "err", err)
	}
	return nil
}

// MarkHealthy is the health check's success: the agent at version v was
// welcomed by the hub, so an agent upgrade to v in health_check succeeded.
// The versions other than current and previous are then removed.
func (n *Node) MarkHealthy(v string) []State {
	all, _ := n.List()
	var changed []State
	for _, s := range all {
		if s.Kind != upgradeproto.KindAgent || s.Step != upgradeproto.StepHealthCheck || s.ToVersion != v {
			continue
		}
		st, err := n.update(s.Name, func(s *State) error {
			if s.Step != upgradeproto.StepHealthCheck {
				return errors.New("moved meanwhile")
			}
			return n.move(s, upgradeproto.StepSucceeded, "version "+v+" connected to the hub")
		})
		if err == nil {
			changed = append(changed, *st)
			n.prune()
		}
	}
	return changed
}

// prune removes installed versions other than current and previous.
func (n *Node) prune() {
	keep := map[string]bool{n.linkVersion(linkCurrent): true, n.linkVersion(linkPrevious): true}
	dir := filepath.Join(n.agentDir(), "versions")
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if !keep[e.Name()] {
			os.RemoveAll(filepath.Join(dir, e.Name()))
		}
	}
}

// Service managers that can restart the agent.
const (
	ManagerNone       = "none"
	ManagerSystemd    = "systemd"
	ManagerSupervisor = "supervisor"
)

// Manager is how the running agent is restarted (agent/manager.json,
// written by the launcher or the supervisor at every start).
type Manager struct {
	Kind string `json:"kind"`
	Unit string `json:"unit,omitempty"` // systemd
	PID  int    `json:"pid,omitempty"`  // supervisor
}

// SetManager records how the agent is restarted.
func (n *Node) SetManager(m Manager) error {
	if err := os.MkdirAll(n.agentDir(), 0o755); err != nil {
		return err
	}
	return writeJSON(filepath.Join(n.agentDir(), "manager.json"), m)
}

// Manager is the recorded service manager (none if unknown).
func (n *Node) Manager() Manager {
	var m Manager
	if err := readJSON(filepath.Join(n.agentDir(), "manager.json"), &m); err != nil {
		return Manager{Kind: ManagerNone}
	}
	return m
}

func (m Manager) check() error {
	switch m.Kind {
	case ManagerSystemd:
		if m.Unit == "" || strings.ContainsAny(m.Unit, "/ ") {
			return fmt.Errorf("the agent's systemd unit %q is not a unit name", m.Unit)
		}
		return nil
	case ManagerSupervisor:
		if m.PID <= 1 || syscall.Kill(m.PID, 0) != nil {
			return fmt.Errorf("the agent's supervisor (pid %d) is not running", m.PID)
		}
		return nil
	}
	return errors.New("the agent runs under no service manager that can restart it: " +
		"run it as a systemd unit or with `tether-edge run --supervise`")
}

func (m Manager) restart() error {
	if err := m.check(); err != nil {
		return err
	}
	if m.Kind == ManagerSystemd {
		if out, err := exec.Command("systemctl", "restart", m.Unit).CombinedOutput(); err != nil {
			return fmt.Errorf("systemctl restart %s: %w: %s", m.Unit, err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	return syscall.Kill(m.PID, syscall.SIGUSR1)
}

// SystemdUnit is the systemd service this process runs in ("" if none):
// systemd sets INVOCATION_ID, and the cgroup's last element names the unit.
func SystemdUnit() string {
	if os.Getenv("INVOCATION_ID") == "" {
		return ""
	}
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	return unitOfCgroup(string(b))
}

// unitOfCgroup is the .service unit a /proc/PID/cgroup names (the
// unified hierarchy's line, or cgroup v1's name=systemd one), "" if none.
func unitOfCgroup(cgroup string) string {
	for _, line := range strings.Split(strings.TrimSpace(cgroup), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) == 3 && (parts[0] == "0" || strings.Contains(parts[1], "systemd")) {
			if u := filepath.Base(parts[2]); strings.HasSuffix(u, ".service") {
				return u
			}
		}
	}
	return ""
}
