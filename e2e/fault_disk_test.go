package e2e

import (
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	_ "modernc.org/sqlite" // integrity check of the hub's database
)

// mountTmpfs mounts a tmpfs of size MiB at dir until the test ends (after
// every cleanup registered later, such as the hub's), or skips the test.
func mountTmpfs(t *testing.T, dir string, mib int) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root to mount a small tmpfs for the full-disk and read-only data dir tests")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(
		"mount", "-t", "tmpfs", "-o", fmt.Sprintf("size=%dm,mode=0700", mib), "tmpfs", dir,
	).CombinedOutput(); err != nil {
		t.Skipf("cannot mount a tmpfs here (container without CAP_SYS_ADMIN?): %v: %s", err, out)
	}
	t.Cleanup(func() {
		if out, err := exec.Command("umount", "-l", dir).CombinedOutput(); err != nil {
			t.Errorf("umount %s: %v: %s", dir, err, out)
		}
	})
}

// fillDisk writes zeros into dir/filler until the file system is full.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	chunk := make([]byte, 1<<20)
	for range 4096 {
		if _, err := f.Write(chunk); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			t.Fatal(err)
		}
	}
	// Whatever blocks are left, take them too.
	for range 1 << 16 {
		if _, err := f.Write(chunk[:512]); err != nil {
			break
		}
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(dir, &st); err != nil {
		t.Fatal(err)
	}
	if free := st.Bavail * uint64(st.Bsize); free > 4096 {
		t.Fatalf("%d bytes still free after filling %s", free, dir)
	}
	return path
}

// TestFaultDiskFull is fault 5, full disk: with the hub's data dir on a
// full file system, writes (tokens, operators, audit) fail with an error
// that says so, while existing tunnels, a running SSH session, new jumps,
// reads and agent reconnects keep working; once space is back everything
// works again and the database is intact.
//
// Two nodes, so that each claim is made about a node it is true of: the
// session runs on steady, whose agent is never touched, and must keep
// printing through the full disk; bounce's agent is SIGKILLed and
// restarted, and its node must come back (connected again, reachable by a
// new jump). A session served by the killed agent itself would end or not
// depending on which of the kill and the next tick wins.
func TestFaultDiskFull(t *testing.T) {
	t.Parallel()
	mnt := filepath.Join(t.TempDir(), "small")
	mountTmpfs(t, mnt, 32)
	h := startHubIn(t, filepath.Join(mnt, "hub"), 0)
	h.cli("operator", "add", "alice", "--key", opPub)
	tok := h.token("--uses", "2")
	startAgent(t, tok, "steady", "--ssh", "embedded")
	bounce, bounceState := startAgent(t, tok, "bounce", "--ssh", "embedded")
	h.waitOnline("steady", "")
	h.waitOnline("bounce", "")
	c := newSSHClient(t, h)
	sess := c.startSession("steady", "while :; do echo tick; sleep 0.2; done")
	waitFor(t, "the session to run", 30*time.Second, func() bool { return sess.lines() >= 2 })

	filler := fillDisk(t, mnt)
	// keepsRunning fails the test unless the session prints more lines
	// from now on (bounded wait, not a fixed sleep).
	keepsRunning := func(when string) {
		t.Helper()
		from := sess.lines()
		waitFor(t, "the session on steady to keep printing "+when, 30*time.Second, func() bool {
			if sess.exited() {
				t.Fatalf("the SSH session on steady ended %s (exit %d, %d lines, %s)", when, sess.exitCode, sess.lines(),
					sess.err.String())
			}
			return sess.lines() >= from+2
		})
	}
	keepsRunning("once the disk was full")

	// Writes fail, clearly.
	tether := filepath.Join(binDir, "tether")
	for _, args := range [][]string{{"token", "create"}, {"role", "create", "r1", "--nodes", "*", "--logins", "root"}} {
		_, errOut, code := runCmd(t, 30*time.Second, tether, append(args, "--data-dir", h.dataDir)...)
		if code == 0 || !strings.Contains(errOut, "disk is full") {
			t.Fatalf("tether %v on a full disk: exit %d, %q; want a clear 'disk is full' error", args, code, errOut)
		}
		t.Logf("tether %s on a full disk: %s", strings.Join(args, " "), strings.TrimSpace(errOut))
	}
	// Reads, the live session, new jumps and a reconnecting agent work.
	if n := h.nodes()["steady"]; !n.Online {
		t.Fatal("node not shown online while the disk is full")
	}
	if out, errOut, code := c.run(30*time.Second, "bounce", "echo still-here"); code != 0 ||
		strings.TrimSpace(out) != "still-here" {
		t.Fatalf("jump while the disk is full: exit %d %q %q", code, out, errOut)
	}
	connects := h.connects("bounce")
	bounce.Stop(syscall.SIGKILL, stopWait)
	again := start2(t, bounceState)
	h.waitConnected("bounce", connects)
	if out, errOut, code := c.run(30*time.Second, "bounce", "echo reconnected"); code != 0 ||
		strings.TrimSpace(out) != "reconnected" {
		t.Fatalf("jump after a reconnect on a full disk: exit %d %q %q", code, out, errOut)
	}
	keepsRunning("while another node reconnected on a full disk")
	if !strings.Contains(h.p.Log(), "disk is full") {
		t.Fatal("the hub did not log the failed writes")
	}

	// Space is back: writes work again.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	h.token()
	for _, node := range []string{"steady", "bounce"} {
		if out, errOut, code := c.run(30*time.Second, node, "echo space"); code != 0 || strings.TrimSpace(out) != "space" {
			t.Fatalf("jump to %s after space came back: exit %d %q %q", node, code, out, errOut)
		}
	}
	keepsRunning("after space came back")
	sess.stop()
	again.Stop(syscall.SIGTERM, stopWait)

	// No corruption: stop the hub, check the database, start again.
	h.p.Stop(syscall.SIGTERM, stopWait)
	db, err := sql.Open("sqlite", "file:"+filepath.Join(h.dataDir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	var check string
	if err := db.QueryRow("PRAGMA integrity_check").Scan(&check); err != nil || check != "ok" {
		t.Fatalf("integrity_check after a full disk: %q %v", check, err)
	}
	db.Close()
	h.start()
	if _, ok := h.nodes()["steady"]; !ok || !strings.Contains(h.cli("operator", "list"), "alice") {
		t.Fatal("state lost across the full disk")
	}
}

// TestFaultReadOnlyDataDir is fault 5, read-only: a hub whose data dir is
// read-only refuses to start with an error naming the directory, and
// changes nothing in it.
func TestFaultReadOnlyDataDir(t *testing.T) {
	t.Parallel()
	mnt := filepath.Join(t.TempDir(), "ro")
	mountTmpfs(t, mnt, 16)
	h := startHubIn(t, filepath.Join(mnt, "hub"), 0)
	h.cli("operator", "add", "alice", "--key", opPub)
	h.p.Stop(syscall.SIGTERM, stopWait)
	before := dirDigest(t, h.dataDir)
	if out, err := exec.Command("mount", "-o", "remount,ro", mnt).CombinedOutput(); err != nil {
		t.Fatalf("remount read-only: %v: %s", err, out)
	}
	_, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "hub", "--data-dir", h.dataDir,
		"--listen", h.apiAddr(), "--ssh-listen", h.sshAddr())
	if code == 0 || !strings.Contains(errOut, h.dataDir) || !strings.Contains(errOut, "read-only") {
		t.Fatalf("hub on a read-only data dir: exit %d, %q; want an error naming the read-only data dir", code, errOut)
	}
	t.Logf("hub on a read-only data dir: %s", strings.TrimSpace(errOut))
	if after := dirDigest(t, h.dataDir); after != before {
		t.Fatal("the data dir changed")
	}
}

// dirDigest lists names, sizes and modification times under dir.
func dirDigest(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.Walk(dir, func(p string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		fmt.Fprintf(&b, "%s %d %d\n", p, fi.Size(), fi.ModTime().UnixNano())
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}
