package e2e

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// quickStart is the first fenced block under the README's "## Quick start"
// heading.
func quickStart(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "\n## Quick start\n")
	if !ok {
		t.Fatal(`README.md has no "## Quick start" heading`)
	}
	if next := strings.Index(section, "\n## "); next >= 0 {
		section = section[:next]
	}
	_, block, ok := strings.Cut(section, "\n```\n")
	if !ok {
		t.Fatal("README.md Quick start has no fenced block")
	}
	block, _, ok = strings.Cut(block, "\n```\n")
	if !ok {
		t.Fatal("README.md Quick start: unterminated fenced block")
	}
	return block
}

// The Quick start's hub ports: not make demo's, so that both can run.
const quickStartAPI, quickStartSSH = "127.0.0.1:17443", "127.0.0.1:12222"

// TestReadmeQuickStart runs the README's Quick start as a bash script (-e:
// every command must succeed, the final ssh included) in an empty directory
// with the built binaries as bin/, a fresh $HOME with no SSH key, and free
// ports in place of its own. `make build` is the one line not run: the
// binaries under test are already built. The hub and agents the script
// leaves running are stopped at cleanup. Run at the top of a checkout, it
// must leave nothing there that git does not ignore, and its ports must not
// be make demo's.
func TestReadmeQuickStart(t *testing.T) {
	script := quickStart(t)
	var lines []string
	for _, l := range strings.Split(script, "\n") {
		if !strings.HasPrefix(l, "make build") {
			lines = append(lines, l)
		}
	}
	script = strings.Join(lines, "\n")
	for _, port := range demoPorts(t) {
		if strings.Contains(script, "127.0.0.1:"+port) {
			t.Errorf("the Quick start uses port %s, make demo's: it fails while the demo runs", port)
		}
	}
	for _, addr := range []string{quickStartAPI, quickStartSSH} {
		if !strings.Contains(script, addr) {
			t.Fatalf("the Quick start no longer uses %s; update this test's port substitution:\n%s", addr, script)
		}
		script = strings.ReplaceAll(script, addr, fmt.Sprintf("127.0.0.1:%d", freePort(t)))
	}

	dir := t.TempDir()
	home := filepath.Join(dir, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	work := filepath.Join(dir, "work")
	if err := os.MkdirAll(work, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink(binDir, filepath.Join(work, "bin")); err != nil {
		t.Fatal(err)
	}
	testenv.WriteFile(t, filepath.Join(work, "quickstart.sh"), []byte(script+"\n"), 0o755)
	logPath := filepath.Join(dir, "quickstart.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, "bash", "-e", "quickstart.sh")
	cmd.Dir = work
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group: the background hub and agents are in it too,
	// and are stopped with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TETHER_") && !strings.HasPrefix(kv, "SSH_AUTH_SOCK=") &&
			!strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "USER=") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, "HOME="+home, "USER="+loginUser)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() { stopGroup(t, pgid) })
	runErr := cmd.Wait()
	out, _ := os.ReadFile(logPath)
	if runErr != nil {
		t.Fatalf("README Quick start failed: %v\nscript:\n%s\noutput (last 6000 bytes):\n%s", runErr, script, tail(out, 6000))
	}
	for _, want := range []string{"n1 | Linux", "n2 | Linux", "job ", "operator alice added"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("Quick start output has no %q:\n%s", want, tail(out, 6000))
		}
	}
	entries, err := os.ReadDir(work)
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		name := e.Name()
		if name == "bin" || name == "quickstart.sh" {
			continue
		}
		if e.IsDir() {
			name += "/" // how git matches a directory pattern
		}
		check := exec.Command("git", "check-ignore", "--no-index", "-q", name)
		check.Dir = ".." // the checkout's .gitignore
		var ee *exec.ExitError
		switch err := check.Run(); {
		case errors.As(err, &ee) && ee.ExitCode() == 1:
			t.Errorf("the Quick start leaves %s in the source tree, which git does not ignore", name)
		case err != nil:
			t.Logf("cannot ask git whether %s is ignored (not a git checkout?): %v", name, err)
		}
	}
}

// demoPorts are make demo's default ports, as scripts/demo.sh sets them.
func demoPorts(t *testing.T) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "scripts", "demo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	var ports []string
	for _, v := range []string{"DEMO_API_PORT", "DEMO_SSH_PORT"} {
		m := regexp.MustCompile(`\$\{` + v + `:-(\d+)\}`).FindSubmatch(b)
		if m == nil {
			t.Fatalf("scripts/demo.sh sets no default for %s", v)
		}
		ports = append(ports, string(m[1]))
	}
	return ports
}

// stopGroup ends the processes left in process group pgid: SIGTERM, then
// SIGKILL if any is still there after stopWait.
func stopGroup(t *testing.T, pgid int) {
	if err := syscall.Kill(-pgid, syscall.SIGTERM); err != nil {
		return // nothing left
	}
	err := testenv.Poll(context.Background(), stopWait, "the Quick start's processes to stop", func() bool {
		return syscall.Kill(-pgid, 0) != nil
	})
	if err != nil {
		t.Logf("%v; killing them", err)
		_ = syscall.Kill(-pgid, syscall.SIGKILL)
	}
}

func tail(b []byte, n int) string {
	if len(b) > n {
		b = b[len(b)-n:]
	}
	return string(b)
}
