package apiclient

import (
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

const adminConf = `apiVersion: v1
kind: Config
clusters:
- name: kubernetes
  cluster:
    certificate-authority-data: Q0E=
    server: https://10.0.0.1:6443
contexts:
- name: kubernetes-admin@kubernetes
  context: {cluster: kubernetes, user: kubernetes-admin}
current-context: kubernetes-admin@kubernetes
users:
- name: kubernetes-admin
  user: {client-certificate-data: Y2VydA==, client-key-data: a2V5}
`

func TestRewriteKubeconfig(t *testing.T) {
	cases := []struct {
		name, in, proxy string
		wantErr         string
		wantServerName  string
	}{
		{name: "admin.conf", in: adminConf, proxy: "127.0.0.1:6443", wantServerName: "kubernetes"},
		{
			name:           "keeps a server name",
			in:             strings.Replace(adminConf, "server:", "tls-server-name: api.example\n    server:", 1),
			proxy:          "127.0.0.1:16443",
			wantServerName: "api.example",
		},
		{name: "ipv6 proxy", in: adminConf, proxy: "[::1]:6443", wantServerName: "kubernetes"},
		{name: "bad proxy", in: adminConf, proxy: "localhost", wantErr: "want HOST:PORT"},
		{name: "no clusters", in: "apiVersion: v1\nkind: Config\n", proxy: "127.0.0.1:6443", wantErr: "no clusters"},
		{name: "cluster not a mapping", in: "clusters:\n- 3\n", proxy: "127.0.0.1:6443", wantErr: "not a mapping"},
		{name: "not yaml", in: "clusters: [", proxy: "127.0.0.1:6443", wantErr: "kubeconfig"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			out, err := RewriteKubeconfig([]byte(tc.in), tc.proxy)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			var kc struct {
				Clusters []struct {
					Cluster map[string]string `yaml:"cluster"`
				} `yaml:"clusters"`
				Users []struct {
					User map[string]string `yaml:"user"`
				} `yaml:"users"`
			}
			if err := yaml.Unmarshal(out, &kc); err != nil {
				t.Fatal(err)
			}
			c := kc.Clusters[0].Cluster
			host := tc.proxy
			if c["server"] != "https://"+host || c["tls-server-name"] != tc.wantServerName ||
				c["certificate-authority-data"] != "Q0E=" {
				t.Fatalf("cluster after rewrite: %v", c)
			}
			if kc.Users[0].User["client-key-data"] != "a2V5" {
				t.Fatalf("credentials lost: %v", kc.Users)
			}
		})
	}
}

// FuzzRewriteKubeconfig: a kubeconfig is read from a node (untrusted);
// whatever it holds, the rewrite errs or yields YAML pointing at the proxy.
func FuzzRewriteKubeconfig(f *testing.F) {
	f.Add([]byte(adminConf))                                            // kubeadm's admin.conf
	f.Add([]byte("clusters:\n- cluster: {server: x}\n"))                // minimal
	f.Add([]byte("clusters: [{cluster: [1, 2]}]"))                      // wrong types
	f.Add([]byte("&a [*a, *a]"))                                        // aliases
	f.Add([]byte("clusters:\n- cluster:\n    server: !!binary AAAA\n")) // tags
	f.Fuzz(func(t *testing.T, b []byte) {
		out, err := RewriteKubeconfig(b, "127.0.0.1:6443")
		if err != nil {
			return
		}
		if !strings.Contains(string(out), "https://127.0.0.1:6443") {
			t.Fatalf("rewritten kubeconfig does not name the proxy:\n%s", out)
		}
	})
}
