package bench

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// binDir returns the directory with tether and tether-edge: TETHER_BIN_DIR
// (make test builds there) or a fresh build.
func binDir(t *testing.T) string {
	if d := os.Getenv("TETHER_BIN_DIR"); d != "" {
		abs, err := filepath.Abs(d)
		if err != nil {
			t.Fatal(err)
		}
		return abs
	}
	d := t.TempDir()
	build(t, d, "../cmd/tether", "../cmd/tether-edge")
	return d
}

func build(t *testing.T, out string, pkgs ...string) {
	t.Helper()
	cmd := exec.Command("go", append([]string{"build", "-o", out + "/"}, pkgs...)...)
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", pkgs, err, b)
	}
}

// TestScenariosTiny builds the bench programs and runs every scenario at
// the tiny size, results to stdout only. It fails if a scenario fails or
// prints no row.
func TestScenariosTiny(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Fatal("ssh not found: install openssh-client (make test does this as root)")
	}
	bin := binDir(t)
	tools := t.TempDir()
	build(t, tools, "./cmd/tbench", "./cmd/agentsim", "./cmd/hubprof")
	start := time.Now()
	cmd := exec.Command(filepath.Join(tools, "tbench"), "-size", "tiny", "-results", "-", "-bin", bin, "-cache", t.TempDir(), "all")
	out, err := cmd.CombinedOutput()
	t.Logf("tbench -size tiny all took %v", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("tbench: %v\n%s", err, out)
	}
	for _, id := range []string{"P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8"} {
		if !strings.Contains(string(out), "| "+id+" |") {
			t.Errorf("no %s row in the output:\n%s", id, out)
		}
	}
}

// TestAgentsimTiny enrolls two simulated nodes on a real hub with the
// agentsim command and runs them until both are connected.
func TestAgentsimTiny(t *testing.T) {
	bin := binDir(t)
	tools := t.TempDir()
	build(t, tools, "./cmd/agentsim")
	work := t.TempDir()
	hub := exec.Command(filepath.Join(bin, "tether"), "hub", "--data-dir", work+"/hub", "--listen", "127.0.0.1:0", "--ssh-listen", "127.0.0.1:0", "--log-level", "warn")
	if err := hub.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = hub.Process.Kill(); _ = hub.Wait() }()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if _, err := os.Stat(work + "/hub/hub.json"); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("hub did not start")
		}
		time.Sleep(50 * time.Millisecond)
	}
	tok, err := exec.Command(filepath.Join(bin, "tether"), "token", "create", "--uses", "2", "--data-dir", work+"/hub").Output()
	if err != nil {
		t.Fatalf("token create: %v", err)
	}
	fleet := work + "/fleet.gob"
	if out, err := exec.Command(filepath.Join(tools, "agentsim"), "enroll", "-join", strings.TrimSpace(string(tok)), "-n", "2", "-out", fleet).CombinedOutput(); err != nil {
		t.Fatalf("agentsim enroll: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(tools, "agentsim"), "run", "-fleet", fleet, "-transport", "tcp", "-duration", "3s", "-report", "1s").CombinedOutput()
	if err != nil {
		t.Fatalf("agentsim run: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "connected 2/2") {
		t.Fatalf("agentsim run never had both agents connected:\n%s", out)
	}
}
