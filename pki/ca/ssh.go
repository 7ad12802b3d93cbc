package ca

import (
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"go.step.sm/crypto/sshutil"
	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/pki"
)

// SSH CA key files inside the CA directory. A CA's previous keys (kept during
// a rotation overlap) are KIND.prev-N files next to it.
const (
	SSHHostCAFile = "ssh_host_ca"
	SSHUserCAFile = "ssh_user_ca"
)

// sshClockSkew backdates ValidAfter like clockSkew does for x509.
const sshClockSkew = 5 * time.Minute

// SSHCA signs SSH certificates of one kind (host or user). Besides its
// signing key it trusts the public keys of previous CAs still inside their
// rotation overlap, so rotating never locks out a node or operator.
type SSHCA struct {
	signer   ssh.Signer
	previous []ssh.PublicKey
}

// LoadOrCreateSSH loads the SSH CA in dir/file (ed25519, 0600), creating it
// the first time, plus any dir/file.prev-* public keys.
func LoadOrCreateSSH(dir, file string) (*SSHCA, error) {
	path := filepath.Join(dir, file)
	b, err := os.ReadFile(path)
	var signer ssh.Signer
	switch {
	case errors.Is(err, os.ErrNotExist):
		if signer, err = newSSHKey(path); err != nil {
			return nil, err
		}
	case err != nil:
		return nil, fmt.Errorf("ca: %w", err)
	default:
		if signer, err = ssh.ParsePrivateKey(b); err != nil {
			return nil, fmt.Errorf("ca: %s: %w", path, err)
		}
	}
	prevFiles, _ := filepath.Glob(path + ".prev-*.pub")
	sort.Strings(prevFiles)
	c := &SSHCA{signer: signer}
	for _, f := range prevFiles {
		pb, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("ca: %w", err)
		}
		k, _, _, _, err := ssh.ParseAuthorizedKey(pb)
		if err != nil {
			return nil, fmt.Errorf("ca: %s: %w", f, err)
		}
		c.previous = append(c.previous, k)
	}
	return c, nil
}

func newSSHKey(path string) (ssh.Signer, error) {
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "tether "+filepath.Base(path))
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	if err := pki.WriteFileAtomic(path, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, err
	}
	if err := pki.WriteFileAtomic(path+".pub", ssh.MarshalAuthorizedKey(signer.PublicKey()), 0o644); err != nil {
		return nil, fmt.Errorf("ca: %w", err)
	}
	return signer, nil
}

// RotateSSH makes a new signing key for the SSH CA in dir/file. The old
// public key is kept as trusted (file.prev-<unix time>.pub) until
// FinishSSHRotation, so certificates it signed stay valid during the overlap.
func RotateSSH(dir, file string) error {
	path := filepath.Join(dir, file)
	old, err := LoadOrCreateSSH(dir, file)
	if err != nil {
		return err
	}
	prev := fmt.Sprintf("%s.prev-%d.pub", path, time.Now().Unix())
	if err := pki.WriteFileAtomic(prev, ssh.MarshalAuthorizedKey(old.signer.PublicKey()), 0o644); err != nil {
		return fmt.Errorf("ca: %w", err)
	}
	_, err = newSSHKey(path)
	return err
}

// FinishSSHRotation stops trusting previous keys of the SSH CA in dir/file.
func FinishSSHRotation(dir, file string) error {
	prevFiles, _ := filepath.Glob(filepath.Join(dir, file) + ".prev-*.pub")
	for _, f := range prevFiles {
		if err := os.Remove(f); err != nil {
			return fmt.Errorf("ca: %w", err)
		}
	}
	return nil
}

// PublicKey is the current signing key's public half.
func (c *SSHCA) PublicKey() ssh.PublicKey { return c.signer.PublicKey() }

// TrustedKeys are the keys verifiers must trust: the current one first, then
// previous ones still in their rotation overlap.
func (c *SSHCA) TrustedKeys() []ssh.PublicKey {
	return append([]ssh.PublicKey{c.signer.PublicKey()}, c.previous...)
}

// Signer is the CA's signing key (the hub uses the user CA to certify its own
// provisioning client key).
func (c *SSHCA) Signer() ssh.Signer { return c.signer }

// sign certifies pub. Type, key id and principals come from the caller and
// the extensions are smallstep's defaults for the type (none for hosts):
// nothing a requester says is copied into a certificate. The certificate is
// built as sshutil's own template would build it (type, key id,
// principals, extensions; TestSSHCertMatchesTemplate) without rendering and
// decoding that template on every call: a hub restart has every node's host
// certificate signed at once, and the template was most of each signature.
func (c *SSHCA) sign(
	ct sshutil.CertType, pub ssh.PublicKey, keyID string, principals []string, ttl time.Duration,
) (*ssh.Certificate, error) {
	if pub == nil {
		return nil, errors.New("ca: ssh certificate: no public key")
	}
	if _, isCert := pub.(*ssh.Certificate); isCert {
		return nil, errors.New("ca: ssh certificate: the key is itself a certificate")
	}
	if len(principals) == 0 {
		return nil, errors.New("ca: ssh certificate: no principals")
	}
	tmpl := sshutil.Certificate{
		Key:        pub,
		Type:       ct,
		KeyID:      keyID,
		Principals: principals,
		Extensions: defaultExtensions(ct),
	}
	cert := tmpl.GetCertificate()
	now := time.Now()
	cert.ValidAfter = uint64(now.Add(-sshClockSkew).Unix())
	cert.ValidBefore = uint64(now.Add(ttl).Unix())
	signed, err := sshutil.CreateCertificate(cert, c.signer)
	if err != nil {
		return nil, fmt.Errorf("ca: sign ssh certificate for %q: %w", keyID, err)
	}
	return signed, nil
}

// defaultExtensions are sshutil.DefaultExtensions(ct) as certificate
// extensions (all of them flags: empty values).
func defaultExtensions(ct sshutil.CertType) map[string]string {
	ext := sshutil.DefaultExtensions(ct)
	if len(ext) == 0 {
		return nil
	}
	out := make(map[string]string, len(ext))
	for k, v := range ext {
		s, _ := v.(string)
		out[k] = s
	}
	return out
}

// SignHost certifies a host key for the given host names.
func (c *SSHCA) SignHost(
	pub ssh.PublicKey, keyID string, hostnames []string, ttl time.Duration,
) (*ssh.Certificate, error) {
	return c.sign(sshutil.HostCert, pub, keyID, hostnames, ttl)
}

// SignUser certifies a user key for the given login names.
func (c *SSHCA) SignUser(
	pub ssh.PublicKey, keyID string, logins []string, ttl time.Duration,
) (*ssh.Certificate, error) {
	return c.sign(sshutil.UserCert, pub, keyID, logins, ttl)
}

// KnownHostsLine is the @cert-authority line that makes OpenSSH trust hosts
// certified by key for the given host patterns.
func KnownHostsLine(patterns []string, key ssh.PublicKey) string {
	return "@cert-authority " + strings.Join(patterns, ",") + " " +
		strings.TrimSpace(string(ssh.MarshalAuthorizedKey(key)))
}
