package kubeone

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"slices"

	"go.yaml.in/yaml/v3"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/store"
)

// How KubeOne checks host keys, and so what the manifest pins.
//
// KubeOne's SSH code (k8c.io/kubeone pkg/ssh, connection.go) dials the
// bastion and then each node through a direct-tcpip channel with
// golang.org/x/crypto/ssh. When sshHostPublicKey / bastionHostPublicKey is
// set, its HostKeyCallback is
//
//	bytes.Equal(key.Marshal(), pinned)
//
// — no known_hosts parsing, no certificate authority, no host name check:
// the SSH wire encoding of the key the server authenticated with must
// equal the pinned bytes. (Unset, it uses ssh.InsecureIgnoreHostKey.) Its
// ClientConfig sets no HostKeyAlgorithms, so x/crypto's default order
// applies, which prefers every certificate algorithm
// (ssh-ed25519-cert-v01@openssh.com, rsa-sha2-256-cert-v01@openssh.com, …)
// over every plain key algorithm. The hub's bastion presents its
// hub-signed host certificate besides its plain key, and so does every
// node (embedded server or managed sshd) once the hub has certified it:
// the negotiation picks the certificate, and the key KubeOne compares is
// the whole certificate. Pinning the plain host key would always fail.
//
// The pinned values are therefore the wire form of the certificates
// presented right now. In the manifest they are base64 (the fields are
// []byte in KubeOne's v1beta2 HostConfig, which it reads as JSON). A
// certificate changes whenever the hub signs a new one: a node's at every
// connect of its agent and at renewal (two thirds of --host-cert-ttl), the
// bastion's at every hub start. A manifest is rendered just before it is
// used; an old one fails closed with "ssh: host key mismatch".

// APIVersion and Kind of the generated manifest.
const (
	APIVersion = "kubeone.k8c.io/v1beta2"
	Kind       = "KubeOneCluster"
)

// APIServerPort is the kube-apiserver port the manifest's apiEndpoint names.
const APIServerPort = 6443

// Bastion is the hub's SSH endpoint as the manifest names it.
type Bastion struct {
	Host string
	Port int
	// HostKey is the wire form (ssh.PublicKey.Marshal) of exactly what the
	// bastion presents: its host certificate.
	HostKey []byte
}

// RenderInput is everything a manifest is made of.
type RenderInput struct {
	// Cluster with its members (store.KubeOneStore.GetKubeOneCluster);
	// each member's privateAddress is its node's reported address.
	Cluster store.KubeOneCluster
	Bastion Bastion
	// HostKeys is, per member node ID, the wire form of what the node's
	// SSH server presents (its host certificate).
	HostKeys map[string][]byte
	KeyFile  string // sshPrivateKeyFile
	CertFile string // sshCertFile; "" leaves it out
}

// Render generates the cluster's KubeOneCluster manifest: members as
// hosts reached through the hub as bastion, every host key pinned, and the
// cluster's extra fields merged in (they never replace the hosts). It
// refuses a member without a known host key or address rather than write a
// host KubeOne would reach unverified.
func Render(in RenderInput) ([]byte, error) {
	c := in.Cluster
	if len(in.Bastion.HostKey) == 0 || in.Bastion.Host == "" || in.Bastion.Port <= 0 {
		return nil, fmt.Errorf("kubeone: render %s: the bastion's address and host key are required", c.Name)
	}
	var cp, workers []any
	for _, m := range c.Members {
		h, err := host(in, m)
		if err != nil {
			return nil, err
		}
		if m.Role == store.KubeOneControlPlane {
			cp = append(cp, h)
		} else {
			workers = append(workers, h)
		}
	}
	if len(cp) == 0 {
		return nil, invalidf("KubeOne cluster %q has no control-plane member left; set its members again", c.Name)
	}
	apiHost := cp[0].(map[string]any)["privateAddress"]
	doc := map[string]any{
		"apiVersion":     APIVersion,
		"kind":           Kind,
		"name":           c.Name,
		"versions":       map[string]any{"kubernetes": c.Kubernetes},
		"cloudProvider":  map[string]any{"none": map[string]any{}},
		"apiEndpoint":    map[string]any{"host": apiHost, "port": APIServerPort},
		"clusterNetwork": map[string]any{"cni": cniField(c.CNI)},
		"controlPlane":   map[string]any{"hosts": cp},
	}
	if len(workers) > 0 {
		doc["staticWorkers"] = map[string]any{"hosts": workers}
	}
	if c.Extra != "" {
		var extra map[string]any
		if err := json.Unmarshal([]byte(c.Extra), &extra); err != nil {
			return nil, fmt.Errorf("kubeone: render %s: stored extra fields: %w", c.Name, err)
		}
		merge(doc, extra)
	}
	b, err := marshalOrdered(doc)
	if err != nil {
		return nil, fmt.Errorf("kubeone: render %s: %w", c.Name, err)
	}
	return b, nil
}

// topLevel is the order of the manifest's first fields, as KubeOne's
// examples write them; other fields (from the extra ones) follow sorted.
var topLevel = []string{
	"apiVersion",
	"kind",
	"name",
	"versions",
	"cloudProvider",
	"apiEndpoint",
	"clusterNetwork",
	"controlPlane",
	"staticWorkers",
}

// marshalOrdered writes doc as YAML (two-space indent), its top-level
// fields in topLevel order; nested mappings are sorted by key.
func marshalOrdered(doc map[string]any) ([]byte, error) {
	root := &yaml.Node{Kind: yaml.MappingNode}
	keys := slices.DeleteFunc(sortedKeys(doc), func(k string) bool { return slices.Contains(topLevel, k) })
	for _, k := range slices.Concat(topLevel, keys) {
		v, ok := doc[k]
		if !ok {
			continue
		}
		var kn, vn yaml.Node
		kn.SetString(k)
		if err := vn.Encode(v); err != nil {
			return nil, err
		}
		root.Content = append(root.Content, &kn, &vn)
	}
	var buf bytes.Buffer
	enc := yaml.NewEncoder(&buf)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func host(in RenderInput, m store.KubeOneMember) (map[string]any, error) {
	name := m.Node.Name
	key := in.HostKeys[m.NodeID]
	if len(key) == 0 {
		return nil, fmt.Errorf(
			"%w: member %q is not connected, so the host key it presents is not known; "+
				"the manifest pins every host key, so connect it and try again", ErrConflict, name)
	}
	if m.Node.Facts.Address == "" {
		return nil, fmt.Errorf(
			"%w: member %q has not reported its address (its agent reports it in every hello: "+
				"connect it once with a current agent)", ErrConflict, name)
	}
	h := map[string]any{
		"publicAddress":        name,
		"privateAddress":       m.Node.Facts.Address,
		"sshPort":              22,
		"sshUsername":          in.Cluster.Login,
		"sshPrivateKeyFile":    in.KeyFile,
		"sshHostPublicKey":     base64.StdEncoding.EncodeToString(key),
		"bastion":              in.Bastion.Host,
		"bastionPort":          in.Bastion.Port,
		"bastionUser":          access.KubeOneBastionUser(in.Cluster.Name),
		"bastionHostPublicKey": base64.StdEncoding.EncodeToString(in.Bastion.HostKey),
	}
	if in.CertFile != "" {
		h["sshCertFile"] = in.CertFile
	}
	return h, nil
}

// cniField is KubeOne's clusterNetwork.cni for a --cni value.
func cniField(cni string) map[string]any {
	field := cnis[cni]
	if field == "" {
		field = cnis[DefaultCNI]
	}
	spec := map[string]any{}
	if field == "canal" {
		spec["mtu"] = 1450 // KubeOne's default for canal; the field is required
	}
	return map[string]any{field: spec}
}

// merge sets extra's fields in doc: mappings merge key by key, anything
// else replaces.
func merge(doc, extra map[string]any) {
	for k, v := range extra {
		if em, ok := v.(map[string]any); ok {
			if dm, ok := doc[k].(map[string]any); ok {
				dm = maps.Clone(dm)
				merge(dm, em)
				doc[k] = dm
				continue
			}
		}
		doc[k] = v
	}
}
