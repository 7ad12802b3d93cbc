package kubeone

import (
	"context"
	"fmt"
	"os"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/store"
)

// The cluster's identity and record, as the hub's own KubeOne runs
// (apply, reset) and its own connections to a cluster's nodes (kubeconfig,
// API server health and proxy) use them. A run never uses the files in the cluster's key directory
// directly: it gets copies in a private directory of its own
// (provisioners/kubeone), removed when it ends.

// LoadByID returns the cluster with this ID: a job is bound to the cluster
// it was started for, not to whatever later took its name.
func (s *Clusters) LoadByID(ctx context.Context, id string) (store.KubeOneCluster, error) {
	cs, err := s.cfg.Store.ListKubeOneClusters(ctx)
	if err != nil {
		return store.KubeOneCluster{}, err
	}
	for _, c := range cs {
		if c.ID == id {
			return c, nil
		}
	}
	return store.KubeOneCluster{}, fmt.Errorf("%w: the KubeOne cluster (id %s) was deleted", ErrNotFound, id)
}

// RunSecrets returns the cluster's private key and a fresh user
// certificate of it, for one run.
func (s *Clusters) RunSecrets(c store.KubeOneCluster) (key, cert []byte, err error) {
	key, err = os.ReadFile(PrivateKeyPath(s.cfg.DataDir, c.Name))
	if err != nil {
		return nil, nil, fmt.Errorf("kubeone: %s: private key: %w", c.Name, err)
	}
	crt, err := s.newCert(c)
	if err != nil {
		return nil, nil, err
	}
	return key, gossh.MarshalAuthorizedKey(crt), nil
}

// Signer is the cluster's identity for the hub's own SSH connections to
// its members: its key with a fresh certificate (managed-sshd members
// accept the cluster by certificate only).
func (s *Clusters) Signer(c store.KubeOneCluster) (gossh.Signer, error) {
	key, err := os.ReadFile(PrivateKeyPath(s.cfg.DataDir, c.Name))
	if err != nil {
		return nil, fmt.Errorf("kubeone: %s: private key: %w", c.Name, err)
	}
	base, err := gossh.ParsePrivateKey(key)
	if err != nil {
		return nil, fmt.Errorf("kubeone: %s: private key: %w", c.Name, err)
	}
	crt, err := s.newCert(c)
	if err != nil {
		return nil, err
	}
	return gossh.NewCertSigner(crt, base)
}

// newCert signs the cluster's key as its user certificate, as the
// manifest's certificate is.
func (s *Clusters) newCert(c store.KubeOneCluster) (*gossh.Certificate, error) {
	pub, _, _, _, err := gossh.ParseAuthorizedKey([]byte(c.PublicKey))
	if err != nil {
		return nil, fmt.Errorf("kubeone: %s: stored public key: %w", c.Name, err)
	}
	crt, err := s.cfg.SignUser(
		pub,
		access.KubeOneCertKeyIDPrefix+c.ID,
		[]string{access.KubeOnePrincipal(c.ID, c.Login)},
		s.cfg.CertTTL,
	)
	if err != nil {
		return nil, fmt.Errorf("kubeone: %s: sign certificate: %w", c.Name, err)
	}
	return crt, nil
}

// Record stores the cluster's status and last run (the apply and reset
// jobs call it when they start and end).
func (s *Clusters) Record(ctx context.Context, c store.KubeOneCluster, status string, run store.KubeOneApply) error {
	return s.cfg.Store.SetKubeOneStatus(ctx, c.Name, status, run, s.cfg.Now())
}
