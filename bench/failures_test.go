package bench

import (
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestFailuresTiny runs the failure scenario (F1, which "all" leaves out)
// once per failure with short keepalives, so that it cannot rot: every
// failure must print its rows. It measures nothing.
func TestFailuresTiny(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		t.Fatal("ssh not found: install openssh-client (make test does this as root)")
	}
	bin := binDir(t)
	tools := t.TempDir()
	build(t, tools, "./cmd/tbench")
	start := time.Now()
	out, err := exec.Command(filepath.Join(tools, "tbench"), "-size", "tiny", "-results", "-", "-bin", bin, "-cache",
		t.TempDir(), "f1").CombinedOutput()
	t.Logf("tbench -size tiny f1 took %v", time.Since(start).Round(time.Millisecond))
	if err != nil {
		t.Fatalf("tbench: %v\n%s", err, out)
	}
	for _, what := range []string{
		"agent link cut", "scp across 5 link cuts", "hub kill -9, restarted at once", "hub kill -9, not restarted",
		"replica kill -9", "site hub kill -9",
	} {
		for _, tr := range []string{"QUIC", "TCP"} {
			if !hasRow(string(out), what, tr) {
				t.Errorf("no F1 row for %q, %s, in the output:\n%s", what, tr, out)
			}
		}
	}
}

// hasRow reports whether an F1 row of out says all of words.
func hasRow(out string, words ...string) bool {
	for _, l := range strings.Split(out, "\n") {
		if !strings.HasPrefix(l, "| F1 |") {
			continue
		}
		all := true
		for _, w := range words {
			all = all && strings.Contains(l, w)
		}
		if all {
			return true
		}
	}
	return false
}
