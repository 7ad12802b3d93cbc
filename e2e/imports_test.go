package e2e

import (
	"os/exec"
	"strings"
	"testing"
)

// TestImportRules keeps the import rules of docs/design/layout.md true: the agent binary
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
		{mod + "cmd/tether-edge", []string{
			mod + "hub", mod + "pki/ca", mod + "provisioners", "modernc.org/sqlite", "github.com/prometheus/client_golang",
		}},
		{mod + "edge", []string{mod + "hub", mod + "pki/ca"}},
		{mod + "tunnel", []string{mod + "hub", mod + "edge", mod + "pki"}},
		{mod + "pki", []string{mod + "tunnel", mod + "hub", mod + "edge"}},
		{mod + "provisioners/runner", []string{mod + "hub", mod + "edge"}},
		{mod + "provisioners/cluster", []string{mod + "hub", mod + "edge"}},
		{mod + "provisioners/kubeone", []string{mod + "hub", mod + "edge"}},
		{mod + "provisioners/upgrade", []string{mod + "hub", mod + "edge"}},
		// A wire contract imports nothing of either end, so both ends may
		// import it (the upgrade verbs: the hub's drive and the agent's updater).
		{mod + "tunnel/control", []string{mod + "hub", mod + "edge", mod + "provisioners"}},
		{mod + "tunnel/siteproto", []string{mod + "hub", mod + "edge", mod + "provisioners"}},
		{mod + "tunnel/upgradeproto", []string{mod + "hub", mod + "edge", mod + "provisioners"}},
		{mod + "tunnel/onboardproto", []string{mod + "hub", mod + "edge", mod + "provisioners"}},
		// The hub links no agent code: what a site hub shares with the
		// agent (its uplink to the parent) lives in tunnel/uplink.
		{mod + "cmd/tether", []string{mod + "edge"}},
		{mod + "tunnel/uplink", []string{mod + "hub", mod + "edge"}},
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

// TestHubLinksNoAgent: no package of the hub imports the agent, directly
// or through another package.
func TestHubLinksNoAgent(t *testing.T) {
	const mod = "github.com/tether-dev/tether/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, mod+"hub/...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if len(lines) < 10 {
		t.Fatalf("go list %shub/... listed %d packages; want the hub's", mod, len(lines))
	}
	for _, line := range lines {
		f := strings.Fields(line)
		for _, d := range f[1:] {
			if d == mod+"edge" || strings.HasPrefix(d, mod+"edge/") {
				t.Errorf("%s depends on %s", f[0], d)
			}
		}
	}
}

// TestTestenvOnlyInTests keeps the shared test environment out of what
// ships: only tests and the bench tool may link internal/testenv.
func TestTestenvOnlyInTests(t *testing.T) {
	const mod = "github.com/tether-dev/tether/"
	out, err := exec.Command("go", "list", "-f", `{{.ImportPath}} {{join .Deps " "}}`, mod+"...").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(out)), "\n") {
		f := strings.Fields(line)
		if len(f) == 0 || strings.HasPrefix(f[0], mod+"bench") || f[0] == mod+"internal/testenv" {
			continue
		}
		for _, d := range f[1:] {
			if d == mod+"internal/testenv" {
				t.Errorf("%s links internal/testenv, which is for tests and bench only", f[0])
			}
		}
	}
}
