package testenv

import (
	"os/exec"
	"syscall"
	"testing"
	"time"
)

// TestProcessAlive: a running child is alive; killed and not yet reaped
// (a zombie, as an orphan is until init reaps it) it is not.
func TestProcessAlive(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Wait()
	if !ProcessAlive(pid) {
		t.Fatalf("running child %d reported dead", pid)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	// Not reaped yet: kill(pid, 0) still succeeds on the zombie.
	WaitProcessGone(t, pid, 10*time.Second)
	if err := syscall.Kill(pid, 0); err != nil {
		t.Fatalf("child %d reaped before Wait: %v (the zombie case was not exercised)", pid, err)
	}
	if ProcessAlive(-1) || ProcessAlive(0) {
		t.Error("pid <= 0 reported alive")
	}
}
