package apiclient

import (
	"errors"
	"fmt"
	"net"

	"go.yaml.in/yaml/v3"
)

// KubeAPIServerName is the name every kubeadm API server certificate
// carries; a kubeconfig pointed at a local proxy verifies the server
// against it (tls-server-name), since the proxy's address is not in the
// certificate.
const KubeAPIServerName = "kubernetes"

// MaxKubeconfigBytes bounds a kubeconfig RewriteKubeconfig reads.
const MaxKubeconfigBytes = 1 << 20

// RewriteKubeconfig points every cluster of a kubeconfig at server
// (https://HOST:PORT of a `tether kubeone proxy`), keeping its CA and
// credentials, and names the certificate's server name the API server's
// certificate carries.
func RewriteKubeconfig(b []byte, server string) ([]byte, error) {
	if len(b) > MaxKubeconfigBytes {
		return nil, fmt.Errorf("kubeconfig is %d bytes; the limit is %d", len(b), MaxKubeconfigBytes)
	}
	host, port, err := net.SplitHostPort(server)
	if err != nil || host == "" || port == "" {
		return nil, fmt.Errorf("proxy address %q: want HOST:PORT", server)
	}
	var doc map[string]any
	if err := yaml.Unmarshal(b, &doc); err != nil {
		return nil, fmt.Errorf("kubeconfig: %w", err)
	}
	clusters, _ := doc["clusters"].([]any)
	if len(clusters) == 0 {
		return nil, errors.New("kubeconfig has no clusters")
	}
	for i, e := range clusters {
		entry, ok := e.(map[string]any)
		if !ok {
			return nil, fmt.Errorf("kubeconfig: clusters[%d] is not a mapping", i)
		}
		cl, ok := entry["cluster"].(map[string]any)
		if !ok {
			return nil, fmt.Errorf("kubeconfig: clusters[%d].cluster is not a mapping", i)
		}
		cl["server"] = "https://" + net.JoinHostPort(host, port)
		if _, set := cl["tls-server-name"]; !set {
			cl["tls-server-name"] = KubeAPIServerName
		}
	}
	return yaml.Marshal(doc)
}
