package kubeone

import (
	"encoding/json"
	"testing"
)

// FuzzParseExtra: --manifest-extra is YAML from a user. Whatever it is,
// ParseExtra does not panic, and what it accepts stores as JSON and
// renders into a manifest whose hosts are still the hub's.
func FuzzParseExtra(f *testing.F) {
	for _, seed := range []string{
		"",                                     // nothing
		"features: {coreDNS: {replicas: 1}}\n", // a mapping merged in
		"clusterNetwork: {podSubnet: 10.10.0.0/16}\n",
		"controlPlane: {hosts: []}\n",          // reserved
		"a: &x [1, *x]\n",                      // alias cycle
		"- 1\n- 2\n",                           // not a mapping
		"? [a]\n: b\n",                         // non-string key
		"a: !!binary aGVsbG8=\n",               // tagged value
		"apiEndpoint: {host: h, port: 6443}\n", // replaces the generated one
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, extra string) {
		m, err := ParseExtra(extra)
		if err != nil || m == nil {
			return
		}
		b, err := json.Marshal(m)
		if err != nil {
			return // Create refuses it as ErrInvalid
		}
		in := renderInput(t)
		in.Cluster.Extra = string(b)
		if _, err := Render(in); err != nil {
			t.Fatalf("accepted extra %q does not render: %v", extra, err)
		}
	})
}
