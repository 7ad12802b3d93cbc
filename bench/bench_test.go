package bench

import (
	"context"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// binDir returns the directory with tether and tether-edge: TETHER_BIN_DIR
// (make test builds there) or a fresh build.
func binDir(t *testing.T) string {
	d, err := testenv.BinDir(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
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
	cmd := exec.Command(filepath.Join(tools, "tbench"), "-size", "tiny", "-results", "-", "-bin", bin, "-cache",
		t.TempDir(), "all")
	out, err := cmd.CombinedOutput()
	t.Logf("tbench -size tiny all took %v", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("tbench: %v\n%s", err, out)
	}
	for _, id := range []string{"P1", "P2", "P3", "P4", "P5", "P6", "P7", "P8", "P9", "P10", "P11", "P12", "P13"} {
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
	hub := testenv.Start(t, "hub", filepath.Join(bin, "tether"), append([]string{"hub"},
		testenv.HubArgs(work+"/hub", "127.0.0.1:0", "127.0.0.1:0", "warn")...)...)
	if err := testenv.WaitHub(context.Background(), hub, work+"/hub", 30*time.Second); err != nil {
		t.Fatal(err)
	}
	tok, err := exec.Command(filepath.Join(bin, "tether"), "token", "create", "--uses", "2", "--data-dir",
		work+"/hub").Output()
	if err != nil {
		t.Fatalf("token create: %v", err)
	}
	fleet := work + "/fleet.gob"
	if out, err := exec.Command(
		filepath.Join(tools, "agentsim"), "enroll", "-join", strings.TrimSpace(string(tok)), "-n", "2", "-out", fleet,
	).CombinedOutput(); err != nil {
		t.Fatalf("agentsim enroll: %v\n%s", err, out)
	}
	out, err := exec.Command(filepath.Join(tools, "agentsim"), "run", "-fleet", fleet, "-transport", "tcp",
		"-duration", "3s", "-report", "1s").CombinedOutput()
	if err != nil {
		t.Fatalf("agentsim run: %v\n%s", err, out)
	}
	if !strings.Contains(string(out), "connected 2/2") {
		t.Fatalf("agentsim run never had both agents connected:\n%s", out)
	}
}
