package onboard

import (
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// TestProcessRunning: the supervised agent is watched by process state
// only, so a process whose command line does not (yet) read "tether-edge
// run" is running for WaitConnected but not an agent for a pid file; an
// exited child (a zombie until reaped) is not running.
func TestProcessRunning(t *testing.T) {
	self := os.Getpid()
	if !processRunning(self) || agentAlive(self) {
		t.Fatalf("this test process: running %v, agent %v; want running, not an agent", processRunning(self),
			agentAlive(self))
	}
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	defer cmd.Wait()
	testenv.WaitFor(t, "the exited child to read as not running", 10*time.Second,
		func() bool { return !processRunning(pid) })
}
