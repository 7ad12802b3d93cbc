package e2e

import (
	"context"
	"encoding/json"
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

// demoSSH is the ssh line `make demo` prints.
var demoSSH = regexp.MustCompile(`ssh -F (\S+) (\S+@node-1\.tether)`)

// TestDemoTwice runs scripts/demo.sh as `make demo` does, twice on one demo
// dir, the way a newcomer meets it: first with no key in ~/.ssh (the demo
// makes its own), then, after a key has appeared in ~/.ssh, again on other
// ports (what its port-in-use message tells you to do). Each run must end
// with every node online once it says it is running, and the ssh line it
// prints must log in.
func TestDemoTwice(t *testing.T) {
	root := t.TempDir()
	// The layout the script expects: it runs from the repository's top.
	script, err := os.ReadFile(filepath.Join("..", "scripts", "demo.sh"))
	if err != nil {
		t.Fatal(err)
	}
	testenv.WriteFile(t, filepath.Join(root, "scripts", "demo.sh"), script, 0o755)
	if err := os.Symlink(binDir, filepath.Join(root, "bin")); err != nil {
		t.Fatal(err)
	}
	home := filepath.Join(root, "home")
	if err := os.MkdirAll(home, 0o700); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(root, "demo")
	t.Cleanup(func() { runDemo(t, root, home, nil, "stop") })

	ports := testenv.FreePorts(t, 4)
	checkDemo(t, dir, runDemo(t, root, home, ports[:2], "start"))

	testenv.NewKeyFile(t, filepath.Join(home, ".ssh", "id_ed25519"))
	out := runDemo(t, root, home, ports[2:], "start")
	checkDemo(t, dir, out)
	cfg, _ := os.ReadFile(filepath.Join(dir, "ssh_config"))
	if !strings.Contains(string(cfg), filepath.Join(home, ".ssh", "id_ed25519")) {
		t.Errorf("the second run's ssh_config does not name ~/.ssh/id_ed25519:\n%s", cfg)
	}
}

// runDemo runs `scripts/demo.sh ARG` under root with HOME=home and the
// demo's ports (nil: the defaults, for stop), and returns its output. The
// processes it leaves behind are stopped at the test's end.
func runDemo(t *testing.T, root, home string, ports []int, arg string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	logPath := filepath.Join(t.TempDir(), "demo.log")
	logFile, err := os.Create(logPath)
	if err != nil {
		t.Fatal(err)
	}
	defer logFile.Close()
	cmd := exec.CommandContext(ctx, filepath.Join(root, "scripts", "demo.sh"), arg)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	// Its own process group, which the hub and agents it starts share.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "TETHER_") && !strings.HasPrefix(kv, "DEMO_") &&
			!strings.HasPrefix(kv, "SSH_AUTH_SOCK=") && !strings.HasPrefix(kv, "HOME=") {
			env = append(env, kv)
		}
	}
	env = append(env, "HOME="+home)
	if ports != nil {
		env = append(env, fmt.Sprintf("DEMO_API_PORT=%d", ports[0]), fmt.Sprintf("DEMO_SSH_PORT=%d", ports[1]))
	}
	cmd.Env = env
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pgid := cmd.Process.Pid
	t.Cleanup(func() { stopGroup(t, pgid) })
	runErr := cmd.Wait()
	out, _ := os.ReadFile(logPath)
	if runErr != nil {
		t.Fatalf("demo.sh %s (ports %v): %v\n%s", arg, ports, runErr, tail(out, 6000))
	}
	return string(out)
}

// checkDemo checks a demo that says it is running: every node is online
// right then, and the ssh line it printed logs in to node-1 without a
// prompt.
func checkDemo(t *testing.T, dir, out string) {
	t.Helper()
	if !strings.Contains(out, "Tether demo is running") {
		t.Fatalf("demo did not say it is running:\n%s", tail([]byte(out), 6000))
	}
	stdout, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "nodes", "-o", "json",
		"--data-dir", filepath.Join(dir, "hub"))
	if code != 0 {
		t.Fatalf("tether nodes: exit %d: %s", code, errOut)
	}
	var nodes []nodeJSON
	if err := json.Unmarshal([]byte(stdout), &nodes); err != nil {
		t.Fatalf("tether nodes -o json: %v\n%s", err, stdout)
	}
	online := 0
	for _, n := range nodes {
		if n.Online {
			online++
		}
	}
	if len(nodes) != 3 || online != 3 {
		t.Fatalf("the demo says it is running with %d of %d nodes online, want 3 of 3:\n%s\ndemo output:\n%s",
			online, len(nodes), stdout, tail([]byte(out), 4000))
	}
	m := demoSSH.FindStringSubmatch(out)
	if m == nil {
		t.Fatalf("demo printed no ssh line:\n%s", out)
	}
	o, errOut, code := runCmd(t, 60*time.Second, "ssh", "-F", m[1], "-o", "BatchMode=yes",
		"-o", "GlobalKnownHostsFile=/dev/null",
		"-o", "ConnectTimeout=10", m[2], "echo demo-ok")
	if code != 0 || strings.TrimSpace(o) != "demo-ok" {
		t.Fatalf("%s: exit %d, out %q, err %q", m[0], code, o, errOut)
	}
}
