package upgrade

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"syscall"
	"time"
)

// EnvSupervisor names the supervisor's pid in its child's environment
// (the child then leaves agent/manager.json to it).
const EnvSupervisor = "TETHER_EDGE_SUPERVISOR"

// supervisor timings: the pause before a child that exited is started
// again, and how long a child asked to stop has before SIGKILL.
const (
	restartPause = time.Second
	stopGrace    = 10 * time.Second
)

// Supervise is `tether-edge run --supervise`, the service manager for
// machines without systemd (and the tests): it runs exe with args as its
// child and starts it again when it exits (after a short pause) or when
// the updater asks with SIGUSR1 (SIGTERM to the child first). It never
// execs another version itself: the supervisor stays the binary it was
// started as while it runs; the child is the launcher, which runs the
// installed version. It returns the child's exit status when ctx ends
// (the child is stopped with SIGTERM) or when the child exits with a
// status in final (the hub refused the node for good).
func Supervise(ctx context.Context, n *Node, exe string, args []string, final []int) (int, error) {
	if err := n.SetManager(Manager{Kind: ManagerSupervisor, PID: os.Getpid()}); err != nil {
		return 1, err
	}
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	defer signal.Stop(usr1)
	env := append(os.Environ(), EnvSupervisor+"="+strconv.Itoa(os.Getpid()))
	for {
		cmd := exec.Command(exe, args...)
		cmd.Env, cmd.Stdin, cmd.Stdout, cmd.Stderr = env, nil, os.Stdout, os.Stderr
		// The child dies with the supervisor, as a unit's process dies
		// with its unit.
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
		if err := cmd.Start(); err != nil {
			return 1, err
		}
		n.log().Info("supervisor started the agent", "pid", cmd.Process.Pid)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		stop := func() error {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case err := <-done:
				return err
			case <-time.After(stopGrace):
				_ = cmd.Process.Kill()
				return <-done
			}
		}
		select {
		case <-ctx.Done():
			return exitCode(stop()), nil
		case <-usr1:
			n.log().Info("supervisor restarts the agent (asked by the updater)")
			_ = stop()
			continue
		case err := <-done:
			code := exitCode(err)
			for _, f := range final {
				if code == f {
					return code, nil
				}
			}
			n.log().Warn("agent exited; starting it again", "status", code, "in", restartPause)
		}
		select {
		case <-ctx.Done():
			return 0, nil
		case <-usr1:
		case <-time.After(restartPause):
		}
	}
}

func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		if c := ee.ExitCode(); c >= 0 {
			return c
		}
		return 1
	}
	if err != nil {
		return 1
	}
	return 0
}
