// Package kubeone manages KubeOne clusters through the hub: a cluster is a
// set of registered nodes (control plane and workers, by node ID), a
// Kubernetes version, and an SSH identity the hub makes for it. The hub is
// KubeOne's bastion; each member's tunnel is the way in; the manifest the
// hub generates tells KubeOne exactly that, with every host key pinned.
//
// The cluster's identity is one ed25519 key pair per cluster (keys.go):
// the private key lives in the hub's data dir (DATA/kubeone/NAME/, 0700;
// the key 0600) and never leaves it through the API. The door
// (hub/access) lets that key log in to the bastion as the cluster's
// bastion user (access.KubeOneBastionUser) and jump to the cluster's
// members only; the members, and no other node, are sent the key and its
// certificate principal for the cluster's login.
//
// # API for the rest of the hub
//
// This is what the hub's wiring and the apply/reset jobs call; it stays
// stable:
//
//   - [NewClusters] builds a [Clusters] from a [Config] (store, data dir, [Live]
//     for what only the running hub knows: the bastion's address and the
//     host keys presented now).
//   - [Clusters.Create], [Clusters.Delete], [Clusters.SetMembers] change
//     clusters (and the access that follows from them); [Clusters.Get] and
//     [Clusters.List] return [Cluster] views; [Clusters.Load] returns the
//     stored record with its members and their nodes.
//   - [Clusters.Manifest] renders a cluster's manifest with the host keys
//     presented right now (so call it right before running kubeone; see
//     the note on pinning in manifest.go), and re-issues the cluster's
//     user certificate first written to [Clusters.CertPath];
//     [ManifestOptions] name another bastion address or other key/cert
//     file paths (copies in a job's private directory). [Render] is the
//     pure function under it.
//   - [Clusters.PrivateKeyPath] and [Clusters.CertPath] (absolute), or
//     [PrivateKeyPath] and [CertPath] for a given data dir, name the
//     cluster's key files.
//   - [Clusters.Status] is the cluster's members with their tunnels; its
//     LastApply comes from the store ([store.KubeOneStore.SetKubeOneStatus]),
//     its Kube from [Config.KubeHealth].
//   - [Clusters.Collector] exports tether_kubeone_clusters and
//     tether_kubeone_members.
//   - [Runs] are KubeOne runs (`tether kubeone apply|reset`): jobs of
//     kinds [ApplyKind] and [ResetKind] the hub runs itself, one per
//     cluster at a time, and the hub's own connections to a cluster's API
//     server (kubeconfig, /readyz, proxy). [HubLive] is [Live] for a
//     running hub.
//   - [API] serves /v1/kubeone.
//
// KubeOne with this manifest: it dials the bastion as the cluster's
// bastion user, authenticating with the certificate (sshCertFile: with a
// certificate KubeOne offers it instead of the plain key, to the bastion
// too, which accepts either), then each node through a direct-tcpip
// channel. KubeOne's default sshAgentSocket is env:SSH_AUTH_SOCK, whose
// keys it offers after the certificate: a job running it should unset
// SSH_AUTH_SOCK so that no other key is offered.
package kubeone

import (
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/validate"
	k1 "github.com/tether-dev/tether/provisioners/kubeone"
)

// Sentinel errors callers branch on (the API answers 400, 404, 409).
var (
	// ErrInvalid: the request is wrong (a name, a version, a member).
	ErrInvalid = errors.New("kubeone: invalid cluster")
	// ErrNotFound: no KubeOne cluster of that name.
	ErrNotFound = errors.New("kubeone: no such cluster")
	// ErrConflict: the request clashes with what exists (a name taken, a
	// member not connected when its host key is needed).
	ErrConflict = errors.New("kubeone: conflict")
)

// invalid is an error of kind ErrInvalid with a complete message.
type invalid struct{ msg string }

func (e *invalid) Error() string { return e.msg }
func (e *invalid) Unwrap() error { return ErrInvalid }

func invalidf(format string, args ...any) error { return &invalid{msg: fmt.Sprintf(format, args...)} }

// conflict is an error of kind ErrConflict with a complete message.
type conflict struct{ msg string }

func (e *conflict) Error() string { return e.msg }
func (e *conflict) Unwrap() error { return ErrConflict }

func conflictf(format string, args ...any) error { return &conflict{msg: fmt.Sprintf(format, args...)} }

// Status values of a cluster this package sets; the apply and reset jobs
// set others.
const (
	StatusCreated = "created"
)

// Kubernetes versions: a create is checked against what the hub's own
// kubeone installs (its release, from `kubeone version`; the ranges per
// release are in provisioners/kubeone). When the hub has no kubeone to
// ask, against what some KubeOne release the hub runs (1.8 and later)
// installs: MinKubernetesMinor to MaxKubernetesMinor.
var MinKubernetesMinor, MaxKubernetesMinor = k1.KnownKubernetesMinors()

// CNIs the generated manifest can name (--cni), as KubeOne's
// clusterNetwork.cni field calls them.
var cnis = map[string]string{"canal": "canal", "cilium": "cilium", "weave-net": "weaveNet", "external": "external"}

// DefaultLogin and DefaultCNI apply when a Spec leaves them empty.
const (
	DefaultLogin = "root"
	DefaultCNI   = "canal"
)

// MaxManifestExtra bounds --manifest-extra.
const MaxManifestExtra = 64 << 10

// reservedExtra are the manifest fields the hub generates from the
// cluster itself; --manifest-extra may not set them, so the members, their
// addresses and their pinned host keys are always the hub's.
var reservedExtra = []string{"apiVersion", "kind", "name", "controlPlane", "staticWorkers", "versions"}

// Spec is what `tether kubeone create` asks for.
type Spec struct {
	Name         string   `json:"name"`
	ControlPlane []string `json:"control_plane"` // node names
	Workers      []string `json:"workers,omitempty"`
	Kubernetes   string   `json:"kubernetes"` // e.g. 1.30.5
	Login        string   `json:"login,omitempty"`
	CNI          string   `json:"cni,omitempty"`
	// ManifestExtra is YAML merged into the generated manifest.
	ManifestExtra string `json:"manifest_extra,omitempty"`
}

// Check validates what s says by itself (members are checked against the
// nodes by ResolveMembers), fills defaults, and returns warnings about
// what is allowed but unwise.
func (s *Spec) Check() (warnings []string, err error) {
	if err := validate.ClusterName(s.Name); err != nil {
		return nil, &invalid{msg: err.Error()}
	}
	if err := CheckKubernetes(s.Kubernetes); err != nil {
		return nil, err
	}
	if s.Login == "" {
		s.Login = DefaultLogin
	}
	if err := validate.Login(s.Login); err != nil {
		return nil, &invalid{msg: "--login: " + err.Error()}
	}
	if s.CNI == "" {
		s.CNI = DefaultCNI
	}
	if _, ok := cnis[s.CNI]; !ok {
		return nil, invalidf("unknown CNI %q: use one of %s", s.CNI, strings.Join(sortedKeys(cnis), ", "))
	}
	w, err := CheckMembers(s.ControlPlane, s.Workers)
	if err != nil {
		return nil, err
	}
	if _, err := ParseExtra(s.ManifestExtra); err != nil {
		return nil, err
	}
	return w, nil
}

// CheckMembers checks the shape of a member list: at least one
// control-plane node, no node twice; an even number of control-plane
// nodes is allowed with a warning.
func CheckMembers(controlPlane, workers []string) (warnings []string, err error) {
	if len(controlPlane) == 0 {
		return nil, invalidf("at least one control-plane node is required (--control-plane)")
	}
	seen := map[string]bool{}
	for _, n := range slices.Concat(controlPlane, workers) {
		if seen[n] {
			return nil, invalidf("node %q is named twice: a node is either control plane or worker, once", n)
		}
		seen[n] = true
	}
	if len(controlPlane)%2 == 0 {
		warnings = append(warnings,
			fmt.Sprintf("%d control-plane nodes: etcd needs a majority, so an even number tolerates no more failures than one "+
				"node fewer (use 1, 3 or 5)", len(controlPlane)))
	}
	return warnings, nil
}

// CheckKubernetes checks a Kubernetes version KubeOne can install: a
// release version MAJOR.MINOR.PATCH (no "v", no pre-release) within the
// minors some KubeOne release the hub runs installs. Clusters.Create then
// checks it against the hub's own kubeone.
func CheckKubernetes(v string) error {
	rule := fmt.Sprintf("KubeOne %s and later install Kubernetes 1.%d to 1.%d "+
		"(each release three or four of those minors), given as MAJOR.MINOR.PATCH, e.g. 1.30.5",
		k1.MinRelease, MinKubernetesMinor, MaxKubernetesMinor)
	minor, ok := kubernetesMinor(v)
	if !ok {
		return invalidf("Kubernetes version %.40q is not a release version: %s", v, rule)
	}
	if minor < 0 || minor < MinKubernetesMinor || minor > MaxKubernetesMinor {
		return invalidf("Kubernetes version %s cannot be installed: %s", v, rule)
	}
	return nil
}

// kubernetesMinor returns the minor of a release version 1.MINOR.PATCH
// (-1 for another major); ok is false if v is not MAJOR.MINOR.PATCH.
func kubernetesMinor(v string) (int, bool) {
	parts := strings.Split(v, ".")
	nums := make([]int, 0, 3)
	for _, p := range parts {
		n, err := strconv.Atoi(p)
		if err != nil || n < 0 || p == "" || (len(p) > 1 && p[0] == '0') {
			return 0, false
		}
		nums = append(nums, n)
	}
	if len(nums) != 3 {
		return 0, false
	}
	if nums[0] != 1 {
		return -1, true
	}
	return nums[1], true
}

// ParseExtra reads --manifest-extra: a YAML mapping of KubeOneCluster
// fields (nil if empty). The fields the hub generates from the cluster
// (reservedExtra) and clusterNetwork.cni (--cni) are refused.
func ParseExtra(extra string) (map[string]any, error) {
	if strings.TrimSpace(extra) == "" {
		return nil, nil
	}
	if len(extra) > MaxManifestExtra {
		return nil, invalidf("--manifest-extra is %d bytes; at most %d", len(extra), MaxManifestExtra)
	}
	var m map[string]any
	if err := yaml.Unmarshal([]byte(extra), &m); err != nil {
		return nil, invalidf("--manifest-extra is not a YAML mapping of KubeOneCluster fields: %v", err)
	}
	for _, k := range reservedExtra {
		if _, ok := m[k]; ok {
			return nil, invalidf(
				"--manifest-extra may not set %q: the hub generates it from the cluster (members, --kubernetes)", k)
		}
	}
	if cn, ok := m["clusterNetwork"].(map[string]any); ok {
		if _, ok := cn["cni"]; ok {
			return nil, invalidf(
				"--manifest-extra may not set clusterNetwork.cni: use --cni (external, for a CNI KubeOne does not install)")
		}
	}
	if err := checkJSONable(m, "--manifest-extra"); err != nil {
		return nil, err
	}
	return m, nil
}

// checkJSONable refuses what JSON (and so KubeOne, which reads YAML as
// JSON) cannot hold: mappings with keys that are not strings.
func checkJSONable(v any, path string) error {
	switch t := v.(type) {
	case map[string]any:
		for k, e := range t {
			if err := checkJSONable(e, path+"."+k); err != nil {
				return err
			}
		}
	case []any:
		for i, e := range t {
			if err := checkJSONable(e, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case map[any]any:
		return invalidf("%s: a mapping key is not a string", path)
	}
	return nil
}

// ResolveMembers turns member names into members by node ID, checking
// each against the registered nodes (by name), the other clusters'
// members (memberOf: node ID → cluster name; cluster's own members are
// free to stay) and the nodes with a Kubernetes engine of the cluster
// state machine (engineOf: node ID → engine; two Kubernetes on one node
// break both). Every problem is reported, not only the first: a node that
// does not exist or is revoked is ErrInvalid, a node with another
// Kubernetes owner ErrConflict (the store checks that again, in the
// transaction that stores the members).
func ResolveMembers(
	cluster string, controlPlane, workers []string, byName map[string]store.Node, memberOf, engineOf map[string]string,
) ([]store.KubeOneMember, error) {
	var errs []error
	var out []store.KubeOneMember
	add := func(names []string, role string) {
		for _, name := range names {
			n, ok := byName[name]
			switch {
			case !ok:
				errs = append(errs, invalidf("no node named %q is registered (see `tether nodes`)", name))
			case !n.RevokedAt.IsZero():
				errs = append(errs, invalidf("node %q is revoked: it can never be a cluster member", name))
			case memberOf[n.ID] != "" && memberOf[n.ID] != cluster:
				errs = append(errs, otherClusterConflict(name, memberOf[n.ID]))
			case engineOf[n.ID] != "":
				errs = append(errs, engineConflict(name, engineOf[n.ID]))
			default:
				out = append(out, store.KubeOneMember{NodeID: n.ID, Role: role, Node: n})
			}
		}
	}
	add(controlPlane, store.KubeOneControlPlane)
	add(workers, store.KubeOneWorker)
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return out, nil
}

// engineConflict refuses node because the cluster state machine's engine
// owns its Kubernetes.
func engineConflict(node, engine string) error {
	return conflictf("node %q has the %s engine of `tether cluster` (see `tether cluster status`): "+
		"one node runs one Kubernetes; `tether cluster deregister %s` and wait for it to be inactive first",
		node, engine, node)
}

// otherClusterConflict refuses node because KubeOne cluster owns it.
func otherClusterConflict(node, cluster string) error {
	return conflictf("node %q is already a member of KubeOne cluster %q (a node is in one cluster at most)", node, cluster)
}

func sortedKeys[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}
