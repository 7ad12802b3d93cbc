package kubeone

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/store"
	k1 "github.com/tether-dev/tether/provisioners/kubeone"
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
		{"version with v", func(s *Spec) { s.Kubernetes = "v1.30.5" },
			"not a release version: KubeOne 1.8 and later install Kubernetes 1.27 to 1.36", ""},
		{"version minor only", func(s *Spec) { s.Kubernetes = "1.30" }, "not a release version", ""},
		{"version pre-release", func(s *Spec) { s.Kubernetes = "1.30.0-rc.1" }, "not a release version", ""},
		{"version too old", func(s *Spec) { s.Kubernetes = "1.26.9" },
			"Kubernetes version 1.26.9 cannot be installed: KubeOne 1.8 and later install Kubernetes 1.27 to 1.36", ""},
		{"version too new", func(s *Spec) { s.Kubernetes = "1.37.0" }, "cannot be installed", ""},
		{"version major 2", func(s *Spec) { s.Kubernetes = "2.30.0" }, "cannot be installed", ""},
		{"version leading zero", func(s *Spec) { s.Kubernetes = "1.030.1" }, "not a release version", ""},
		{"oldest", func(s *Spec) { s.Kubernetes = "1.27.0" }, "", ""},
		{"newest", func(s *Spec) { s.Kubernetes = "1.36.2" }, "", ""},
		{"bad login", func(s *Spec) { s.Login = "Root" }, `--login: invalid login "Root"`, ""},
		{
			"bad cni",
			func(s *Spec) { s.CNI = "flannel" },
			`unknown CNI "flannel": use one of canal, cilium, external, weave-net`,
			"",
		},
		{"no control plane", func(s *Spec) { s.ControlPlane = nil }, "at least one control-plane node", ""},
		{"node twice", func(s *Spec) { s.Workers = []string{"n1"} }, `node "n1" is named twice`, ""},
		{"extra not a mapping", func(s *Spec) { s.ManifestExtra = "- a\n- b\n" }, "not a YAML mapping", ""},
		{
			"extra sets hosts",
			func(s *Spec) { s.ManifestExtra = "controlPlane: {hosts: []}\n" },
			`may not set "controlPlane"`,
			"",
		},
		{
			"extra sets version",
			func(s *Spec) { s.ManifestExtra = "versions: {kubernetes: 1.31.0}\n" },
			`may not set "versions"`,
			"",
		},
		{
			"extra sets cni",
			func(s *Spec) { s.ManifestExtra = "clusterNetwork: {cni: {cilium: {}}}\n" },
			"clusterNetwork.cni: use --cni",
			"",
		},
		{
			"extra non-string key",
			func(s *Spec) { s.ManifestExtra = "features:\n  1: x\n" },
			"mapping key is not a string",
			"",
		},
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
		kinds   []error  // every kind the answer carries
		want    []string // role:nodeID
	}{
		{"fine", "a", []string{"n1"}, []string{"n2"}, nil, nil, []string{"control-plane:1", "worker:2"}},
		{"unknown", "a", []string{"nope"}, nil, []string{`no node named "nope" is registered`}, []error{ErrInvalid}, nil},
		{"revoked", "a", []string{"gone"}, nil, []string{`node "gone" is revoked`}, []error{ErrInvalid}, nil},
		// Another Kubernetes owner is a conflict (409), naming the owner.
		{"other cluster", "a", []string{"b1"}, nil,
			[]string{`node "b1" is already a member of KubeOne cluster "b"`}, []error{ErrConflict}, nil},
		{"own member elsewhere", "c", []string{"n2"}, nil,
			[]string{`already a member of KubeOne cluster "a"`}, []error{ErrConflict}, nil},
		{"engine of the cluster state machine", "a", []string{"k3s"}, nil,
			[]string{`node "k3s" has the k3s engine of ` + "`tether cluster`", "`tether cluster deregister k3s`"},
			[]error{ErrConflict}, nil},
		{"all at once", "a", []string{"nope", "gone"}, []string{"b1"},
			[]string{"nope", "gone", "b1"}, []error{ErrInvalid, ErrConflict}, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			got, err := ResolveMembers(tc.cluster, tc.cp, tc.w, byName, memberOf, engineOf)
			if len(tc.errs) > 0 {
				for _, k := range tc.kinds {
					if !errors.Is(err, k) {
						t.Fatalf("got %v, want %v", err, k)
					}
				}
				if !slices.ContainsFunc(tc.kinds, func(k error) bool { return k == ErrInvalid }) && errors.Is(err, ErrInvalid) {
					t.Fatalf("got %v: another owner is a conflict, not an invalid request", err)
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

// A create is checked against the Kubernetes minors the hub's own kubeone
// installs (its release from `kubeone version`): out of range is refused
// naming the release, the range and the releases that would do; a kubeone
// the hub cannot ask, or a release it does not know, passes with a warning
// that says the check was only against the releases the hub knows.
func TestCheckRelease(t *testing.T) {
	release := func(v string, major, minor, patch int) func(context.Context) (k1.Release, error) {
		return func(context.Context) (k1.Release, error) {
			return k1.Release{Binary: "/usr/local/bin/kubeone", GitVersion: v, Major: major, Minor: minor, Patch: patch,
				Known: major > 0}, nil
		}
	}
	noKubeOne := func(context.Context) (k1.Release, error) {
		return k1.Release{}, fmt.Errorf("%w: no \"kubeone\" on the hub's PATH", k1.ErrNoBinary)
	}
	for _, tc := range []struct {
		name    string
		ask     func(context.Context) (k1.Release, error)
		version string
		kind    error  // nil: accepted
		says    string // in the error, or in the one warning
	}{
		{"in range", release("1.8.1", 1, 8, 1), "1.30.5", nil, ""},
		{"too new for 1.8", release("1.8.1", 1, 8, 1), "1.34.1", ErrInvalid,
			"Kubernetes 1.34.1 cannot be installed by the hub's kubeone 1.8.1 (/usr/local/bin/kubeone), " +
				"which installs 1.27 to 1.30: choose a version in that range, " +
				"or install KubeOne 1.12 to 1.14 on the hub's machine"},
		{"1.30 came in 1.8.1", release("1.8.0", 1, 8, 0), "1.30.2", ErrInvalid, "which installs 1.27 to 1.29"},
		{"too old for 1.12", release("1.12.0", 1, 12, 0), "1.30.5", ErrInvalid,
			"install KubeOne 1.8.1 to 1.11 on the hub's machine"},
		{"kubeone too old", release("1.7.3", 1, 7, 3), "1.27.1", ErrConflict, "older than KubeOne 1.8"},
		{"dev build", release("dev", 0, 0, 0), "1.34.1", nil,
			"the hub's kubeone dev (/usr/local/bin/kubeone) is a release the hub does not know"},
		{"no kubeone", noKubeOne, "1.34.1", nil,
			"checked only against what KubeOne 1.8 and later install (1.27 to 1.36): the hub's kubeone could not be asked"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := &Clusters{cfg: Config{KubeOneRelease: tc.ask}}
			warnings, err := s.checkRelease(context.Background(), tc.version)
			warned := len(warnings) == 1 && strings.Contains(warnings[0], tc.says)
			switch {
			case tc.kind != nil:
				if !errors.Is(err, tc.kind) || !strings.Contains(err.Error(), tc.says) {
					t.Fatalf("got %v, want %v saying %q", err, tc.kind, tc.says)
				}
			case err != nil:
				t.Fatalf("refused: %v", err)
			case tc.says == "" && len(warnings) > 0, tc.says != "" && !warned:
				t.Fatalf("warnings %q, want %q", warnings, tc.says)
			}
		})
	}
}
