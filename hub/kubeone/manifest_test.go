package kubeone

import (
	"bytes"
	"crypto/ed25519"
	"encoding/base64"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"testing"

	"go.yaml.in/yaml/v3"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel/control"
)

var update = flag.Bool("update", false, "rewrite the golden manifests in testdata/")

// fixedKey is the wire form of an ed25519 public key made from seed, so
// the golden files stay the same from run to run.
func fixedKey(t *testing.T, seed byte) []byte {
	t.Helper()
	priv := ed25519.NewKeyFromSeed(bytes.Repeat([]byte{seed}, ed25519.SeedSize))
	pub, err := gossh.NewPublicKey(priv.Public())
	if err != nil {
		t.Fatal(err)
	}
	return pub.Marshal()
}

func member(id, name, role, addr string) store.KubeOneMember {
	return store.KubeOneMember{
		NodeID: id,
		Role:   role,
		Node:   store.Node{ID: id, Name: name, Facts: control.Facts{Address: addr}},
	}
}

func renderInput(t *testing.T) RenderInput {
	c := store.KubeOneCluster{Name: "edge1", ID: "c0ffee", Kubernetes: "1.30.5", Login: "root", CNI: "canal",
		Members: []store.KubeOneMember{
			member("id1", "n1", store.KubeOneControlPlane, "10.0.0.11"),
			member("id2", "n2", store.KubeOneControlPlane, "10.0.0.12"),
			member("id3", "n3", store.KubeOneControlPlane, "10.0.0.13"),
			member("id4", "n4", store.KubeOneWorker, "10.0.0.14"),
			member("id5", "n5", store.KubeOneWorker, "fd00::15"),
		}}
	keys := map[string][]byte{}
	for i, m := range c.Members {
		keys[m.NodeID] = fixedKey(t, byte(i+1))
	}
	return RenderInput{
		Cluster:  c,
		Bastion:  Bastion{Host: "hub.example.net", Port: 2222, HostKey: fixedKey(t, 100)},
		HostKeys: keys,
		KeyFile:  "/var/lib/tether/kubeone/edge1/id_ed25519",
		CertFile: "/var/lib/tether/kubeone/edge1/id_ed25519-cert.pub",
	}
}

// TestRenderGolden: the generated manifests, byte for byte (go test
// -run TestRenderGolden -update rewrites testdata/*.yaml), and what
// KubeOne reads from them: every host's pinned keys decode to exactly the
// keys given.
func TestRenderGolden(t *testing.T) {
	cases := []struct {
		name   string
		change func(*RenderInput)
	}{
		{"ha", func(*RenderInput) {}},
		{"single-extra", func(in *RenderInput) {
			in.Cluster.Members = in.Cluster.Members[:1]
			in.Cluster.Login, in.Cluster.CNI = "ubuntu", "cilium"
			// Maps merge into the generated ones; other values replace.
			in.Cluster.Extra = `{"clusterNetwork":{"podSubnet":"10.10.0.0/16"},"apiEndpoint":{"host":"api.edge1.example"},` +
				`"features":{"coreDNS":{"replicas":1}}}`
			in.CertFile = ""
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := renderInput(t)
			tc.change(&in)
			got, err := Render(in)
			if err != nil {
				t.Fatal(err)
			}
			path := filepath.Join("testdata", tc.name+".yaml")
			if *update {
				if err := os.WriteFile(path, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(path)
			if err != nil {
				t.Fatalf("%v (run with -update to create it)", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("manifest differs from %s (run with -update if the change is intended):\n%s", path, got)
			}
			var doc struct {
				APIVersion    string `yaml:"apiVersion"`
				Kind          string
				ControlPlane  struct{ Hosts []map[string]any } `yaml:"controlPlane"`
				StaticWorkers struct{ Hosts []map[string]any } `yaml:"staticWorkers"`
			}
			if err := yaml.Unmarshal(got, &doc); err != nil {
				t.Fatal(err)
			}
			if doc.APIVersion != APIVersion || doc.Kind != Kind {
				t.Errorf("apiVersion %q kind %q", doc.APIVersion, doc.Kind)
			}
			hosts := append(doc.ControlPlane.Hosts, doc.StaticWorkers.Hosts...)
			if len(hosts) != len(in.Cluster.Members) {
				t.Fatalf("%d hosts for %d members", len(hosts), len(in.Cluster.Members))
			}
			for i, h := range hosts {
				m := in.Cluster.Members[i]
				for field, want := range map[string][]byte{
					"sshHostPublicKey": in.HostKeys[m.NodeID], "bastionHostPublicKey": in.Bastion.HostKey,
				} {
					b, err := base64.StdEncoding.DecodeString(h[field].(string))
					if err != nil || !bytes.Equal(b, want) {
						t.Errorf("host %s: %s does not decode to the key given (%v)", m.Node.Name, field, err)
					}
				}
				if h["publicAddress"] != m.Node.Name || h["privateAddress"] != m.Node.Facts.Address ||
					h["bastionUser"] != "kubeone-edge1" {
					t.Errorf("host %d: %v", i, h)
				}
			}
		})
	}
}

// TestRenderRefuses: a member whose host key or address is not known, or
// a cluster without a control plane, gets no manifest: KubeOne would reach
// such a host unverified, or not at all.
func TestRenderRefuses(t *testing.T) {
	cases := []struct {
		name   string
		change func(*RenderInput)
		want   error
	}{
		{"member offline", func(in *RenderInput) { delete(in.HostKeys, "id4") }, ErrConflict},
		{"no address", func(in *RenderInput) { in.Cluster.Members[2].Node.Facts.Address = "" }, ErrConflict},
		{"no control plane", func(in *RenderInput) { in.Cluster.Members = in.Cluster.Members[3:] }, ErrInvalid},
		{"no bastion key", func(in *RenderInput) { in.Bastion.HostKey = nil }, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			in := renderInput(t)
			tc.change(&in)
			_, err := Render(in)
			if err == nil || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}
