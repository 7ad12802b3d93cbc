package edge

import (
	"crypto"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// KeyPath is where the node key of state dir dir is kept.
func KeyPath(dir string) string { return filepath.Join(dir, keyFile) }

// PendingKey returns the node key kept in dir, making and persisting one
// first when there is none. Onboarding keeps its key in the state dir before
// it asks the hub for anything: a retry after a timeout or a crash sends a
// CSR for the same key, which is how the hub tells the same machine asking
// again from a second machine with the same UUID. The file has the layout
// and mode Join gives it (dir 0700, key 0600, written atomically).
func PendingKey(dir string) (key crypto.Signer, reused bool, err error) {
	path := KeyPath(dir)
	b, err := os.ReadFile(path)
	switch {
	case err == nil:
		key, err := pki.ParseKey(b)
		if err != nil {
			return nil, false, fmt.Errorf("node key %s: %w (move it away to start over with a new key)", path, err)
		}
		return key, true, nil
	case !errors.Is(err, os.ErrNotExist):
		return nil, false, fmt.Errorf("node key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("state dir: %w", err)
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return nil, false, fmt.Errorf("state dir: %w", err)
	}
	if key, err = pki.GenerateKey(); err != nil {
		return nil, false, err
	}
	pemKey, err := pki.EncodeKey(key)
	if err != nil {
		return nil, false, err
	}
	if err := pki.WriteFileAtomic(path, pemKey, 0o600); err != nil {
		return nil, false, err
	}
	return key, false, nil
}

// AdoptIdentity stores an identity the hub issued for key (by onboarding,
// not by a join string) in dir, with Join's layout. The certificate must be
// for key and chain to the node CA (nodeCAPEM, or ca when empty) exactly as
// Join requires; ca is the hub CA the caller verified by its fingerprint.
func AdoptIdentity(
	dir string, cfg NodeConfig, key crypto.Signer, certPEM, nodeCAPEM []byte, ca *x509.Certificate) (*Identity, error) {
	certs, nodeCA, err := uplink.VerifyIssued(certPEM, nodeCAPEM, ca, key)
	if err != nil {
		return nil, err
	}
	if cfg.JoinedAt.IsZero() {
		cfg.JoinedAt = time.Now().UTC()
	}
	if err := saveIdentity(dir, cfg, key, certs, ca, nodeCA); err != nil {
		return nil, fmt.Errorf("save identity: %w", err)
	}
	return LoadIdentity(dir)
}
