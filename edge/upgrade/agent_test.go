package upgrade

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// agentAt makes a node with versions installed, current and previous set,
// and an agent upgrade record in step (installing or health_check).
func agentAt(t *testing.T, step upgradeproto.Step, current string, sw *switchRecord) *Node {
	t.Helper()
	n := newNode(t, "v1.0.0")
	for _, v := range []string{"v0.9.0", "v1.0.0", "v1.1.0"} {
		dir := filepath.Join(n.agentDir(), "versions", v)
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, binName), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.setLink(linkPrevious, "v0.9.0"); err != nil {
		t.Fatal(err)
	}
	if current != "" {
		if err := n.setLink(linkCurrent, current); err != nil {
			t.Fatal(err)
		}
	}
	s := &State{
		Name:        "edge",
		Kind:        upgradeproto.KindAgent,
		Digest:      upgradeproto.DigestOf(nil),
		FromVersion: "v1.0.0",
		ToVersion:   "v1.1.0",
		Step:        upgradeproto.StepPending,
	}
	if step == upgradeproto.StepAwaitingConfirmation {
		_ = s.Move(step, "", time.Now())
	}
	for _, st := range []upgradeproto.Step{
		upgradeproto.StepDownloading, upgradeproto.StepVerifying, upgradeproto.StepInstalling, upgradeproto.StepHealthCheck,
	} {
		if s.Step == step {
			break
		}
		if err := s.Move(st, "", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(n.recordDir("edge"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := n.save(s); err != nil {
		t.Fatal(err)
	}
	if sw != nil {
		if err := writeJSON(n.switchPath("edge"), sw); err != nil {
			t.Fatal(err)
		}
	}
	return n
}

// holdWatcher stands in for a live updater: it holds the watch lock.
func holdWatcher(t *testing.T, n *Node) {
	l, err := lockFile(filepath.Join(n.recordDir("edge"), "watch.lock"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(l.Close)
}

// Every place the updater can be killed (or the power cut) ends, at the
// next agent start, in a known state on a whole version: the launcher's
// recovery, for each state the switch can leave behind.
func TestLaunchAfterInterruptedSwitch(t *testing.T) {
	future := time.Now().Add(time.Hour)
	past := time.Now().Add(-time.Second)
	sw := func(deadline time.Time) *switchRecord {
		return &switchRecord{Previous: "v1.0.0", To: "v1.1.0", TimeoutSeconds: 60, Deadline: deadline}
	}
	cases := []struct {
		name    string
		step    upgradeproto.Step
		current string
		sw      *switchRecord
		watcher bool
		want    upgradeproto.Step
		reason  string
		runs    string // the version launched
	}{
		{
			"apply killed before the switch record",
			upgradeproto.StepInstalling,
			"v1.0.0",
			nil,
			false,
			upgradeproto.StepFailed,
			"interrupted before the switch",
			"v1.0.0",
		},
		{
			"killed before the switch (no current yet)",
			upgradeproto.StepInstalling,
			"",
			sw(time.Time{}),
			false,
			upgradeproto.StepRolledBack,
			"the switch to v1.1.0 was interrupted",
			"v1.0.0",
		},
		{
			"killed before the switch",
			upgradeproto.StepInstalling,
			"v1.0.0",
			sw(time.Time{}),
			false,
			upgradeproto.StepRolledBack,
			"the switch to v1.1.0 was interrupted",
			"v1.0.0",
		},
		{
			"killed after the switch",
			upgradeproto.StepInstalling,
			"v1.1.0",
			sw(time.Time{}),
			false,
			upgradeproto.StepRolledBack,
			"back on v1.0.0",
			"v1.0.0",
		},
		{
			"updater still switching",
			upgradeproto.StepInstalling,
			"v1.1.0",
			sw(time.Time{}),
			true,
			upgradeproto.StepInstalling,
			"",
			"v1.1.0",
		},
		{
			"killed in the health check, overdue",
			upgradeproto.StepHealthCheck,
			"v1.1.0",
			sw(past),
			false,
			upgradeproto.StepRolledBack,
			"new version v1.1.0 did not reconnect within 1m0s (the updater was not running); back on v1.0.0",
			"v1.0.0",
		},
		{
			"health check in time",
			upgradeproto.StepHealthCheck,
			"v1.1.0",
			sw(future),
			true,
			upgradeproto.StepHealthCheck,
			"",
			"v1.1.0",
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := agentAt(t, c.step, c.current, c.sw)
			if c.watcher {
				holdWatcher(t, n)
			}
			exe, _ := n.Launch()
			s, err := n.Load("edge")
			if err != nil {
				t.Fatal(err)
			}
			if s.Step != c.want || !strings.Contains(s.Reason, c.reason) {
				t.Fatalf("%s %q, want %s %q", s.Step, s.Reason, c.want, c.reason)
			}
			if want := filepath.Join(n.agentDir(), "versions", c.runs, binName); exe != want &&
				!(c.runs == "v1.0.0" && c.current == "" && exe == "") {
				t.Fatalf("launches %q, want %q", exe, want)
			}
		})
	}
}

// The new version exiting CrashLoopExits times in a row: the start after
// that runs the previous version, rolled_back with the count.
func TestLaunchCrashLoop(t *testing.T) {
	n := agentAt(t, upgradeproto.StepHealthCheck, "v1.1.0", &switchRecord{
		Previous: "v1.0.0", To: "v1.1.0", Deadline: time.Now().Add(time.Hour),
	})
	holdWatcher(t, n)
	newExe := filepath.Join(n.agentDir(), "versions", "v1.1.0", binName)
	for start := 1; start <= CrashLoopExits; start++ {
		if exe, _ := n.Launch(); exe != newExe {
			t.Fatalf("start %d runs %q, want the new version", start, exe)
		}
	}
	exe, changed := n.Launch()
	if exe != filepath.Join(n.agentDir(), "versions", "v1.0.0", binName) || len(changed) != 1 {
		t.Fatalf("start %d runs %q (%d changed), want the previous version", CrashLoopExits+1, exe, len(changed))
	}
	if s := changed[0]; s.Step != upgradeproto.StepRolledBack ||
		s.Reason != "new version v1.1.0 crashed 3 times; back on v1.0.0" {
		t.Fatalf("%s %q", s.Step, s.Reason)
	}
}

func TestMarkHealthy(t *testing.T) {
	n := agentAt(t, upgradeproto.StepHealthCheck, "v1.1.0", &switchRecord{Previous: "v1.0.0", To: "v1.1.0"})
	if err := n.setLink(linkPrevious, "v1.0.0"); err != nil {
		t.Fatal(err)
	}
	if got := n.MarkHealthy("v1.0.0"); len(got) != 0 {
		t.Fatalf("another version marked healthy: %+v", got)
	}
	got := n.MarkHealthy("v1.1.0")
	if len(got) != 1 || got[0].Step != upgradeproto.StepSucceeded {
		t.Fatalf("%+v", got)
	}
	ents, _ := os.ReadDir(filepath.Join(n.agentDir(), "versions"))
	var vs []string
	for _, e := range ents {
		vs = append(vs, e.Name())
	}
	if strings.Join(vs, " ") != "v1.0.0 v1.1.0" {
		t.Fatalf("versions kept: %v, want the current and the previous", vs)
	}
	if n.PreviousVersion() != "v1.0.0" || n.InstalledVersion() != "v1.1.0" {
		t.Fatalf("previous %q current %q", n.PreviousVersion(), n.InstalledVersion())
	}
}

func TestSetLinkLeavesNoTemp(t *testing.T) {
	n := agentAt(t, upgradeproto.StepHealthCheck, "v1.0.0", nil)
	for range 3 {
		if err := n.setLink(linkCurrent, "v1.1.0"); err != nil {
			t.Fatal(err)
		}
	}
	ents, _ := os.ReadDir(n.agentDir())
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), ".") {
			t.Errorf("temporary %s left", e.Name())
		}
	}
	if n.InstalledVersion() != "v1.1.0" {
		t.Fatal(n.InstalledVersion())
	}
}

// The confirm socket answers root only: a process of another uid that can
// reach the socket (its file mode opened here on purpose) is refused by
// the SO_PEERCRED check, and nothing is confirmed.
func TestConfirmSocket(t *testing.T) {
	if os.Getenv("UPGRADE_TEST_ASK") != "" {
		_, err := Ask(context.Background(), os.Getenv("UPGRADE_TEST_ASK"), SocketRequest{Op: "confirm", Name: "edge"})
		if errors.Is(err, ErrNotRoot) {
			os.Exit(7)
		}
		os.Stderr.WriteString(err.Error())
		os.Exit(1)
	}
	if os.Geteuid() != 0 {
		t.Skip("needs root (to run a client as nobody)")
	}
	n := agentAt(t, upgradeproto.StepAwaitingConfirmation, "", nil)
	dir, err := os.MkdirTemp("", "confirm-sock-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	// The node's records stay in n.Dir; the socket dir must be reachable by nobody.
	n2 := *n
	n2.Dir = dir
	if err := os.Rename(filepath.Join(n.Dir, "upgrades"), filepath.Join(dir, "upgrades")); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	served := make(chan error, 1)
	changed := make(chan []State, 1)
	go func() { served <- n2.ServeConfirm(ctx, func(s []State) { changed <- s }) }()
	t.Cleanup(func() { cancel(); <-served })
	sock := filepath.Join(dir, SocketName)
	testenv.WaitFor(t, "the confirm socket", 10*time.Second, func() bool { _, err := os.Stat(sock); return err == nil })
	if fi, _ := os.Stat(sock); fi.Mode().Perm() != 0o600 {
		t.Fatalf("socket mode %v, want 0600", fi.Mode().Perm())
	}
	if err := os.Chmod(sock, 0o666); err != nil {
		t.Fatal(err)
	}

	// As nobody: a copy of this test binary nobody may run.
	nobody, err := user.Lookup("nobody")
	if err != nil {
		t.Skip(err)
	}
	uid, _ := strconv.Atoi(nobody.Uid)
	gid, _ := strconv.Atoi(nobody.Gid)
	bin := filepath.Join(dir, "upgrade.test")
	copyFile(t, os.Args[0], bin)
	cmd := exec.Command(bin, "-test.run=^TestConfirmSocket$")
	cmd.Env = append(os.Environ(), "UPGRADE_TEST_ASK="+dir)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}}
	out, err := cmd.CombinedOutput()
	var ee *exec.ExitError
	if !errors.As(err, &ee) || ee.ExitCode() != 7 {
		t.Fatalf("nobody's confirm: %v %s, want refused as not root", err, out)
	}
	if s, _ := n2.Load("edge"); s.Step != upgradeproto.StepAwaitingConfirmation {
		t.Fatalf("nobody confirmed: %s", s.Step)
	}

	waiting, err := Ask(ctx, dir, SocketRequest{Op: "list"})
	if err != nil || len(waiting) != 1 || waiting[0].Name != "edge" {
		t.Fatalf("list: %+v, %v", waiting, err)
	}
	done, err := Ask(ctx, dir, SocketRequest{Op: "confirm", Name: "edge"})
	if err != nil || len(done) != 1 || done[0].Step != upgradeproto.StepDownloading ||
		!strings.HasPrefix(done[0].ConfirmedBy, "root@") || !strings.HasSuffix(done[0].ConfirmedBy, " (on the node)") {
		t.Fatalf("confirm: %+v, %v", done, err)
	}
	if got := <-changed; got[0].ConfirmedBy != done[0].ConfirmedBy {
		t.Fatalf("reported %+v", got)
	}
	if _, err := Ask(ctx, dir, SocketRequest{Op: "confirm", Name: "edge"}); err == nil ||
		!strings.Contains(err.Error(), "not awaiting confirmation") {
		t.Fatalf("second confirm: %v", err)
	}
	cancel()
	<-served
	served <- nil
	if _, err := Ask(context.Background(), dir, SocketRequest{Op: "list"}); !errors.Is(err, ErrNoAgent) {
		t.Fatalf("no agent: %v", err)
	}
}

func copyFile(t *testing.T, src, dst string) {
	t.Helper()
	in, err := os.Open(src)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.OpenFile(dst, os.O_CREATE|os.O_WRONLY, 0o755)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := io.Copy(out, in); err != nil {
		t.Fatal(err)
	}
	if err := out.Close(); err != nil {
		t.Fatal(err)
	}
}

func TestUnitOfCgroup(t *testing.T) {
	for in, want := range map[string]string{
		"0::/system.slice/tether-edge.service\n":                               "tether-edge.service",
		"12:pids:/x\n1:name=systemd:/system.slice/tether-edge.service\n0::/\n": "tether-edge.service",
		"0::/user.slice/user-0.slice/session-3.scope\n":                        "",
		"0::/system.slice/tether-edge.service/extra.service\n":                 "extra.service",
		"": "",
	} {
		if got := unitOfCgroup(in); got != want {
			t.Errorf("unitOfCgroup(%q) = %q, want %q", in, got, want)
		}
	}
}

// fakeSupervisor is a process that counts the restarts the updater asks
// for (SIGUSR1) in a file.
func fakeSupervisor(t *testing.T, n *Node) (count func() int) {
	t.Helper()
	f := filepath.Join(t.TempDir(), "usr1")
	cmd := exec.Command("/bin/sh", "-c",
		`trap 'echo x >> "$F"' USR1; echo ready >> "$F.ready"; while :; do sleep 0.05; done`)
	cmd.Env = append(os.Environ(), "F="+f)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	testenv.WaitFor(t, "the fake supervisor", 10*time.Second,
		func() bool { _, err := os.Stat(f + ".ready"); return err == nil })
	if err := n.SetManager(Manager{Kind: ManagerSupervisor, PID: cmd.Process.Pid}); err != nil {
		t.Fatal(err)
	}
	return func() int {
		b, _ := os.ReadFile(f)
		return strings.Count(string(b), "x")
	}
}

func TestWatch(t *testing.T) {
	t.Run("no health: rolled back and restarted", func(t *testing.T) {
		n := agentAt(t, upgradeproto.StepInstalling, "v1.0.0", &switchRecord{
			Previous: "v1.0.0", To: "v1.1.0", TimeoutSeconds: 1,
		})
		restarts := fakeSupervisor(t, n)
		if err := n.Watch(context.Background(), "edge"); err != nil {
			t.Fatal(err)
		}
		s, _ := n.Load("edge")
		if s.Step != upgradeproto.StepRolledBack ||
			s.Reason != "new version v1.1.0 did not reconnect within 1s; back on v1.0.0" {
			t.Fatalf("%s %q", s.Step, s.Reason)
		}
		if n.InstalledVersion() != "v1.0.0" || n.PreviousVersion() != "v1.0.0" {
			t.Fatalf("current %s previous %s", n.InstalledVersion(), n.PreviousVersion())
		}
		testenv.WaitFor(t, "two restarts (to the new version and back)", 10*time.Second,
			func() bool { return restarts() == 2 })
	})
	t.Run("healthy: succeeded, old versions pruned", func(t *testing.T) {
		n := agentAt(t, upgradeproto.StepInstalling, "v1.0.0", &switchRecord{
			Previous: "v1.0.0", To: "v1.1.0", TimeoutSeconds: 3600,
		})
		restarts := fakeSupervisor(t, n)
		done := make(chan error, 1)
		go func() { done <- n.Watch(context.Background(), "edge") }()
		testenv.WaitFor(t, "the restart on the new version", 10*time.Second, func() bool { return restarts() == 1 })
		if n.InstalledVersion() != "v1.1.0" || n.PreviousVersion() != "v1.0.0" {
			t.Fatalf("current %s previous %s", n.InstalledVersion(), n.PreviousVersion())
		}
		if got := n.MarkHealthy("v1.1.0"); len(got) != 1 {
			t.Fatalf("marked %d", len(got))
		}
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		if _, err := os.Stat(filepath.Join(n.agentDir(), "versions", "v0.9.0")); err == nil {
			t.Fatal("v0.9.0 kept beside current and previous")
		}
	})
	t.Run("a second updater leaves", func(t *testing.T) {
		n := agentAt(t, upgradeproto.StepInstalling, "v1.0.0", &switchRecord{Previous: "v1.0.0", To: "v1.1.0"})
		holdWatcher(t, n)
		if err := n.Watch(context.Background(), "edge"); err != nil {
			t.Fatal(err)
		}
		if s, _ := n.Load("edge"); s.Step != upgradeproto.StepInstalling || n.InstalledVersion() != "v1.0.0" {
			t.Fatalf("the second updater acted: %s on %s", s.Step, n.InstalledVersion())
		}
	})
}
