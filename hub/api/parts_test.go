package api

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPartsImports keeps the API's three parts apart: the wire types
// import nothing of the hub, the client links no handler, and the route
// surface imports no feature, so that every feature may import it and
// this package may import the features without a cycle.
func TestPartsImports(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	const mod = "github.com/tether-dev/tether/"
	deps := func(pkg string) []string {
		out, err := exec.Command("go", "list", "-deps", mod+pkg).Output()
		if err != nil {
			t.Fatalf("go list -deps %s: %v", pkg, err)
		}
		return strings.Fields(string(out))
	}
	features := []string{"hub/api", "hub/jobs", "hub/cluster", "hub/kubeone", "hub/upgrade", "hub/mission",
		"hub/service", "hub/site", "hub/replica", "hub/operator"}
	for _, r := range []struct {
		pkg     string
		allowed func(dep string) bool
	}{
		{"hub/api/apitype", func(d string) bool { return !strings.HasPrefix(d, mod+"hub/") || d == mod+"hub/api/apitype" }},
		{"hub/api/apiclient", func(d string) bool {
			return !strings.HasPrefix(d, mod+"hub/") || d == mod+"hub/api/apitype" || d == mod+"hub/api/apiclient"
		}},
		// The route table registers these features' routes; it never imports them.
		{"hub/api", func(d string) bool {
			for _, f := range []string{"hub/kubeone", "hub/upgrade", "hub/mission", "hub/service", "hub/site",
				"hub/replica", "hub/operator"} {
				if d == mod+f {
					return false
				}
			}
			return true
		}},
		{"hub/api/route", func(d string) bool {
			for _, f := range features {
				if d == mod+f {
					return false
				}
			}
			return true
		}},
	} {
		for _, d := range deps(r.pkg) {
			if !r.allowed(d) {
				t.Errorf("%s depends on %s", r.pkg, strings.TrimPrefix(d, mod))
			}
		}
	}
}
