package e2e

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportRules keeps the import rules of docs/architecture.md true: the agent binary
// links no hub, CA-signing or database code, and tunnel imports nothing of ours.
func TestImportRules(t *testing.T) {
	deps := func(pkg string) []string {
		out, err := exec.Command("go", "list", "-deps", pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	const mod = "github.com/tether-dev/tether/"
	rules := []struct {
		pkg       string
		forbidden []string
	}{
		{mod + "cmd/tether-edge", []string{mod + "hub", mod + "pki/ca", mod + "provisioners", "modernc.org/sqlite", "github.com/prometheus/client_golang"}},
		{mod + "edge", []string{mod + "hub", mod + "pki/ca"}},
		{mod + "tunnel", []string{mod + "hub", mod + "edge", mod + "pki"}},
		{mod + "pki", []string{mod + "tunnel", mod + "hub", mod + "edge"}},
		{mod + "provisioners/runner", []string{mod + "hub", mod + "edge"}},
		{mod + "provisioners/cluster", []string{mod + "hub", mod + "edge"}},
	}
	for _, r := range rules {
		for _, d := range deps(r.pkg) {
			for _, f := range r.forbidden {
				if d == f || strings.HasPrefix(d, f+"/") {
					t.Errorf("%s depends on %s", r.pkg, d)
				}
			}
		}
	}
}
