package kubeone

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/pki"
)

// File names inside a cluster's key directory.
const (
	privateKeyFile = "id_ed25519"
	certFile       = "id_ed25519-cert.pub"
)

// Dir is the directory of cluster's key files: DATA/kubeone/NAME (0700).
func Dir(dataDir, cluster string) string { return filepath.Join(dataDir, "kubeone", cluster) }

// PrivateKeyPath is the cluster's private key (OpenSSH format, 0600): what
// the manifest's sshPrivateKeyFile names.
func PrivateKeyPath(dataDir, cluster string) string {
	return filepath.Join(Dir(dataDir, cluster), privateKeyFile)
}

// CertPath is the cluster's user certificate (what sshCertFile names),
// re-issued by every Clusters.Manifest.
func CertPath(dataDir, cluster string) string { return filepath.Join(Dir(dataDir, cluster), certFile) }

// createKey makes a new key pair for cluster, replacing any left by a
// cluster of the same name that is gone, and returns its public key.
func createKey(dataDir, cluster string) (gossh.PublicKey, error) {
	if err := os.MkdirAll(filepath.Dir(Dir(dataDir, cluster)), 0o700); err != nil {
		return nil, fmt.Errorf("kubeone: key dir: %w", err)
	}
	dir := Dir(dataDir, cluster)
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("kubeone: key dir: %w", err)
	}
	if err := os.Mkdir(dir, 0o700); err != nil {
		return nil, fmt.Errorf("kubeone: key dir: %w", err)
	}
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("kubeone: generate key: %w", err)
	}
	block, err := gossh.MarshalPrivateKey(priv, "tether kubeone "+cluster)
	if err != nil {
		return nil, fmt.Errorf("kubeone: encode key: %w", err)
	}
	if err := pki.WriteFileAtomic(PrivateKeyPath(dataDir, cluster), pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, fmt.Errorf("kubeone: write key: %w", err)
	}
	return gossh.NewPublicKey(pub)
}

// removeKey deletes the cluster's key files.
func removeKey(dataDir, cluster string) error {
	if err := os.RemoveAll(Dir(dataDir, cluster)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("kubeone: remove key of %s: %w", cluster, err)
	}
	return nil
}

// writeCert stores the cluster's user certificate beside its key.
func writeCert(dataDir, cluster string, cert *gossh.Certificate) error {
	if err := pki.WriteFileAtomic(CertPath(dataDir, cluster), gossh.MarshalAuthorizedKey(cert), 0o600); err != nil {
		return fmt.Errorf("kubeone: write certificate: %w", err)
	}
	return nil
}
