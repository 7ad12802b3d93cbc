package testenv

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// ProcessAlive reports whether pid runs: it exists and is not a zombie. A
// killed orphan stays a zombie until init reaps it, which in a container
// may take a while (or, with a PID 1 that does not reap, forever): it is
// dead all the same.
func ProcessAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if err := syscall.Kill(pid, 0); errors.Is(err, syscall.ESRCH) {
		return false
	}
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(stat, ')')
	return i < 0 || !bytes.HasPrefix(stat[i:], []byte(") Z"))
}

// WaitProcessGone fails t unless pid stops running (ProcessAlive) within d.
func WaitProcessGone(t testing.TB, pid int, d time.Duration) {
	t.Helper()
	deadline := time.Now().Add(d)
	for ProcessAlive(pid) {
		if time.Now().After(deadline) {
			t.Fatalf("process %d still running after %v", pid, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ProcessesWithArgs returns the live processes whose command line is
// exactly args. Tests give a process they cannot learn the pid of (started
// in the background on a node) a unique argument, e.g. "sleep 300.4711",
// find it with this and kill it by pid.
func ProcessesWithArgs(args ...string) []int {
	want := []byte(strings.Join(args, "\x00") + "\x00")
	names, _ := filepath.Glob("/proc/[0-9]*/cmdline")
	var pids []int
	for _, name := range names {
		b, err := os.ReadFile(name)
		if err != nil || !bytes.Equal(b, want) {
			continue
		}
		pid, err := strconv.Atoi(filepath.Base(filepath.Dir(name)))
		if err == nil && ProcessAlive(pid) {
			pids = append(pids, pid)
		}
	}
	return pids
}
