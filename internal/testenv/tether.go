package testenv

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"time"
)

// Binaries are the tether binaries every harness runs.
var Binaries = []string{"tether", "tether-edge"}

// CheckBinaries fails unless dir holds the built binaries.
func CheckBinaries(dir string) error {
	for _, b := range Binaries {
		if _, err := os.Stat(filepath.Join(dir, b)); err != nil {
			return fmt.Errorf("testenv: %s not found in %s: run `make build` (or set TETHER_BIN_DIR): %w", b, dir, err)
		}
	}
	return nil
}

// BinDir returns the directory of the tether binaries: TETHER_BIN_DIR if
// set (make test builds once and points there), else a fresh build of
// this checkout into scratch.
func BinDir(scratch string) (string, error) {
	if dir := os.Getenv("TETHER_BIN_DIR"); dir != "" {
		abs, err := filepath.Abs(dir)
		if err != nil {
			return "", fmt.Errorf("testenv: TETHER_BIN_DIR: %w", err)
		}
		return abs, CheckBinaries(abs)
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(filepath.Dir(file))) // internal/testenv/ -> module root
	dir := filepath.Join(scratch, "bin")
	cmd := exec.Command("go", "build", "-o", dir+"/", "./cmd/tether", "./cmd/tether-edge")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testenv: build the binaries: %w\n%s", err, out)
	}
	return dir, nil
}

// HubArgs are the flags of `tether hub` on the given addresses; extra
// comes last.
func HubArgs(dataDir, listen, sshListen, logLevel string, extra ...string) []string {
	return append(
		[]string{"--data-dir", dataDir, "--listen", listen, "--ssh-listen", sshListen, "--log-level", logLevel},
		extra...)
}

// WaitHub waits until the hub process p serves: its data dir's hub.json
// names p's pid (a stale one from a killed hub does not count).
func WaitHub(ctx context.Context, p *Proc, dataDir string, timeout time.Duration) error {
	err := Poll(ctx, timeout, "the hub to start", func() bool {
		if p.Exited() {
			return true
		}
		b, err := os.ReadFile(filepath.Join(dataDir, "hub.json"))
		var info struct{ PID int }
		return err == nil && json.Unmarshal(b, &info) == nil && info.PID == p.PID()
	})
	if p.Exited() {
		return fmt.Errorf("testenv: hub exited at start: %v\n%s", p.Err(), p.Tail(4000))
	}
	return err
}

// AgentArgs are the flags of `tether-edge run` for a node; join may be ""
// (a restart from the identity in stateDir), name likewise.
//
// Embedded-server sessions run /bin/sh unless extra says otherwise (a later
// --shell wins): the default, the login shell from /etc/passwd, is bash
// for root here, and bash started over SSH reads the machine's ~/.bashrc,
// whose tools (pyenv's rehash lock, for one) are not the test's to depend
// on. The passwd default is covered by edge/sshserver's tests.
func AgentArgs(join, stateDir, name string, extra ...string) []string {
	args := []string{"run", "--state-dir", stateDir, "--shell", "/bin/sh"}
	if join != "" {
		args = append(args, "--join", join)
	}
	if name != "" {
		args = append(args, "--name", name)
	}
	return append(args, extra...)
}
