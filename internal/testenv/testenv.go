// Package testenv is the one test environment the e2e suite, the runner
// and sshdconf tests and the bench tool share: keys and certificates,
// free loopback ports, bounded polls, processes with log capture (the
// tether hub and agents, real OpenSSH sshd) and the built binaries.
//
// Every helper comes in the form a test wants (it takes a T and fails it)
// and, where bench needs it, in a form that returns an error. Only test
// code and bench import this package: production code never does.
package testenv

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os/user"
	"strings"
	"sync"
	"time"
)

// T is the part of testing.TB the helpers use; *testing.T and *testing.B
// satisfy it. (An interface, so that bench links no testing package.)
type T interface {
	Helper()
	Fatalf(format string, args ...any)
	Logf(format string, args ...any)
	Cleanup(func())
	TempDir() string
	Failed() bool
}

// PickPort returns a port free right now on 127.0.0.1 for both TCP and
// UDP (the hub serves QUIC and TCP on one port), and never one it returned
// before in this process. Another process may take it before the caller
// binds it; StartSSHD retries for that reason.
func PickPort() (int, error) {
	ports, err := PickPorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}

// PickPorts is PickPort for n ports, all different. A port picked and
// closed is often handed out again soon (1 to 11 times in 300 picks here),
// so two picks for one hub's --listen and --ssh-listen once got the same
// port and the hub failed to start: every port this process was given is
// remembered and never returned again, and each candidate stays bound
// until the pick ends, so the kernel offers another.
func PickPorts(n int) ([]int, error) {
	pickedMu.Lock()
	defer pickedMu.Unlock()
	var held []io.Closer
	defer func() {
		for _, c := range held {
			c.Close()
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 20*n {
			return nil, fmt.Errorf("testenv: no %d ports free on both TCP and UDP after %d tries", n, tries)
		}
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, fmt.Errorf("testenv: pick a loopback port: %w", err)
		}
		held = append(held, l)
		port := l.Addr().(*net.TCPAddr).Port
		if picked[port] {
			continue
		}
		u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		held = append(held, u)
		ports = append(ports, port)
	}
	for _, p := range ports {
		picked[p] = true
	}
	return ports, nil
}

// picked holds every port PickPorts returned in this process.
var (
	pickedMu sync.Mutex
	picked   = map[int]bool{}
)

// FreePort is PickPort for tests.
func FreePort(t T) int {
	t.Helper()
	return FreePorts(t, 1)[0]
}

// FreePorts is PickPorts for tests.
func FreePorts(t T, n int) []int {
	t.Helper()
	ports, err := PickPorts(n)
	if err != nil {
		t.Fatalf("%v", err)
	}
	return ports
}

// pollEvery is how often the polls below look again.
const pollEvery = 50 * time.Millisecond

// ErrTimeout is what Poll returns when the condition did not hold in time.
var ErrTimeout = errors.New("timed out")

// Poll calls cond until it holds, ctx ends or timeout passes. The error
// names what was waited for.
func Poll(ctx context.Context, timeout time.Duration, what string, cond func() bool) error {
	deadline := time.Now().Add(timeout)
	for !cond() {
		if time.Now().After(deadline) {
			return fmt.Errorf("testenv: %w after %v waiting for %s", ErrTimeout, timeout, what)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("testenv: waiting for %s: %w", what, ctx.Err())
		case <-time.After(pollEvery):
		}
	}
	return nil
}

// WaitFor polls cond until it holds, or fails the test after timeout
// saying what it waited for. cond may call t.Fatalf to give up early.
func WaitFor(t T, what string, timeout time.Duration, cond func() bool) {
	t.Helper()
	if err := Poll(context.Background(), timeout, what, cond); err != nil {
		t.Fatalf("%v", err)
	}
}

// WaitForValue is WaitFor for a condition on a value, which the failure
// message shows as last seen.
func WaitForValue[V any](t T, what string, timeout time.Duration, get func() V, cond func(V) bool) V {
	t.Helper()
	var v V
	err := Poll(context.Background(), timeout, what, func() bool { v = get(); return cond(v) })
	if err != nil {
		t.Fatalf("%v; last seen: %+v", err, v)
	}
	return v
}

// LoginName is the user the tests run as: the login on every loopback
// sshd and embedded server ("root" if it cannot be told).
func LoginName() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "root"
}

// Logger is a debug-level logger that writes to the test log, so that a
// failing test shows what the code under test logged.
func Logger(t interface{ Log(args ...any) }) *slog.Logger {
	return slog.New(slog.NewTextHandler(logWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type logWriter struct{ t interface{ Log(args ...any) } }

func (w logWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}
