package main

import (
	"bytes"
	"strings"
	"testing"

	k1 "github.com/tether-dev/tether/provisioners/kubeone"
)

// `kubeone version` reads, to the hub, as the KubeOne 1.8.1 it imitates,
// with the Kubernetes minors that release installs; and the stand-in
// refuses at apply what that release's validation refuses.
func TestVersionAndRange(t *testing.T) {
	var out, errOut bytes.Buffer
	if code := run([]string{"version"}, &out, &errOut); code != 0 {
		t.Fatalf("kubeone version: exit %d: %s", code, errOut.String())
	}
	rel, err := k1.ParseVersion("kubeone", out.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	lo, hi, ok := rel.KubernetesMinors()
	if rel.GitVersion != release || !ok || lo != minMinor || hi != maxMinor {
		t.Fatalf("the hub reads the stand-in as %+v installing 1.%d..1.%d (%v); want %s installing 1.%d..1.%d",
			rel, lo, hi, ok, release, minMinor, maxMinor)
	}
	for _, tc := range []struct{ v, says string }{
		{"1.27.0", ""}, {"1.30.14", ""},
		{"1.26.9", "does not satisfy version constraint '>= 1.27': 1.26.9 is less than 1.27"},
		{"1.31.0", "does not satisfy version constraint '<= 1.30': 1.31.0 is greater than 1.30. " +
			"This version is not yet supported"},
		{"1.34.1", "greater than 1.30"},
		{"v1.30.5", "can't start with a leading 'v'"},
		{"latest", "is not a semver string"},
	} {
		err := checkKubernetes(tc.v)
		if (tc.says == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), tc.says) {
			t.Errorf("checkKubernetes(%q) = %v, want %q", tc.v, err, tc.says)
		}
	}
}
