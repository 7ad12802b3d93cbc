package kubeone

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/store"
)

// TestSpecCheck: what a create request says by itself — name, version,
// login, CNI, member shape, extra fields — is refused with an error that
// names the problem and the rule, and an even control plane passes with a
// warning.
func TestSpecCheck(t *testing.T) {
	ok := func() Spec {
		return Spec{Name: "edge1", ControlPlane: []string{"n1", "n2", "n3"}, Workers: []string{"n4"}, Kubernetes: "1.30.5"}
	}
	cases := []struct {
		name    string
		change  func(*Spec)
		err     string // substring; "" means valid
		warning string
	}{
		{"valid", func(*Spec) {}, "", ""},
		{"even control plane warns", func(s *Spec) { s.ControlPlane = []string{"n1", "n2"} }, "", "2 control-plane nodes"},
		{"name upper", func(s *Spec) { s.Name = "Edge1" }, `invalid cluster name "Edge1"`, ""},
		{"name dots", func(s *Spec) { s.Name = "a.b" }, "invalid cluster name", ""},
		{"name too long", func(s *Spec) { s.Name = strings.Repeat("a", 64) }, "invalid cluster name", ""},
		{"name empty", func(s *Spec) { s.Name = "" }, "invalid cluster name", ""},
		{"version with v", func(s *Spec) { s.Kubernetes = "v1.30.5" }, "not a release version: KubeOne installs Kubernetes 1.29 to 1.33", ""},
		{"version minor only", func(s *Spec) { s.Kubernetes = "1.30" }, "not a release version", ""},
		{"version pre-release", func(s *Spec) { s.Kubernetes = "1.30.0-rc.1" }, "not a release version", ""},
		{"version too old", func(s *Spec) { s.Kubernetes = "1.28.9" }, "Kubernetes version 1.28.9 cannot be installed: KubeOne installs Kubernetes 1.29 to 1.33", ""},
		{"version too new", func(s *Spec) { s.Kubernetes = "1.34.0" }, "cannot be installed", ""},
		{"version major 2", func(s *Spec) { s.Kubernetes = "2.30.0" }, "cannot be installed", ""},
		{"version leading zero", func(s *Spec) { s.Kubernetes = "1.030.1" }, "not a release version", ""},
		{"oldest and newest", func(s *Spec) { s.Kubernetes = "1.29.0" }, "", ""},
		{"bad login", func(s *Spec) { s.Login = "Root" }, `--login: invalid login "Root"`, ""},
		{"bad cni", func(s *Spec) { s.CNI = "flannel" }, `unknown CNI "flannel": use one of canal, cilium, external, weave-net`, ""},
		{"no control plane", func(s *Spec) { s.ControlPlane = nil }, "at least one control-plane node", ""},
		{"node twice", func(s *Spec) { s.Workers = []string{"n1"} }, `node "n1" is named twice`, ""},
		{"extra not a mapping", func(s *Spec) { s.ManifestExtra = "- a\n- b\n" }, "not a YAML mapping", ""},
		{"extra sets hosts", func(s *Spec) { s.ManifestExtra = "controlPlane: {hosts: []}\n" }, `may not set "controlPlane"`, ""},
		{"extra sets version", func(s *Spec) { s.ManifestExtra = "versions: {kubernetes: 1.31.0}\n" }, `may not set "versions"`, ""},
		{"extra sets cni", func(s *Spec) { s.ManifestExtra = "clusterNetwork: {cni: {cilium: {}}}\n" }, "clusterNetwork.cni: use --cni", ""},
		{"extra non-string key", func(s *Spec) { s.ManifestExtra = "features:\n  1: x\n" }, "mapping key is not a string", ""},
		{"extra too big", func(s *Spec) { s.ManifestExtra = "a: " + strings.Repeat("x", MaxManifestExtra) }, "at most", ""},
		{"extra fine", func(s *Spec) { s.ManifestExtra = "clusterNetwork: {podSubnet: 10.10.0.0/16}\n" }, "", ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := ok()
			tc.change(&s)
			w, err := s.Check()
			if tc.err == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				if s.Login != "root" && s.Login != "" || s.CNI == "" {
					t.Errorf("defaults not filled: %+v", s)
				}
			} else {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("got %v, want an error containing %q", err, tc.err)
				}
				if !errors.Is(err, ErrInvalid) {
					t.Errorf("%v does not match ErrInvalid", err)
				}
			}
			if got := strings.Join(w, "; "); tc.warning == "" && got != "" || !strings.Contains(got, tc.warning) {
				t.Errorf("warnings %q, want %q", got, tc.warning)
			}
		})
	}
}

// TestResolveMembers: unknown and revoked nodes, nodes of another cluster
// and nodes with an engine of the cluster state machine are refused, all of them in one answer; the cluster's own
// members may stay.
func TestResolveMembers(t *testing.T) {
	byName := map[string]store.Node{
		"n1":   {ID: "1", Name: "n1"},
		"n2":   {ID: "2", Name: "n2"},
		"gone": {ID: "3", Name: "gone", RevokedAt: time.Unix(1, 0)},
		"b1":   {ID: "4", Name: "b1"},
		"k3s":  {ID: "5", Name: "k3s"},
	}
	memberOf := map[string]string{"4": "b", "2": "a"}
	engineOf := map[string]string{"5": "k3s"}
	cases := []struct {
		name    string
		cluster string
		cp, w   []string
		errs    []string
		want    []string // role:nodeID
	}{
		{"fine", "a", []string{"n1"}, []string{"n2"}, nil, []string{"control-plane:1", "worker:2"}},
		{"unknown", "a", []string{"nope"}, nil, []string{`no node named "nope" is registered`}, nil},
		{"revoked", "a", []string{"gone"}, nil, []string{`node "gone" is revoked`}, nil},
		{"other cluster", "a", []string{"b1"}, nil, []string{`node "b1" is already a member of KubeOne cluster "b"`}, nil},
		{"own member elsewhere", "c", []string{"n2"}, nil, []string{`already a member of KubeOne cluster "a"`}, nil},
		{"engine of the cluster state machine", "a", []string{"k3s"}, nil, []string{`node "k3s" has the k3s engine of ` + "`tether cluster`"}, nil},
		{"all at once", "a", []string{"nope", "gone"}, []string{"b1"}, []string{"nope", "gone", "b1"}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveMembers(tc.cluster, tc.cp, tc.w, byName, memberOf, engineOf)
			if len(tc.errs) > 0 {
				if !errors.Is(err, ErrInvalid) {
					t.Fatalf("got %v, want ErrInvalid", err)
				}
				for _, e := range tc.errs {
					if !strings.Contains(err.Error(), e) {
						t.Errorf("error %q does not say %q", err, e)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var ids []string
			for _, m := range got {
				ids = append(ids, m.Role+":"+m.NodeID)
			}
			if strings.Join(ids, ",") != strings.Join(tc.want, ",") {
				t.Errorf("members %v, want %v", ids, tc.want)
			}
		})
	}
}
