// Package sshdconf makes a node's own OpenSSH server trust Tether's PKI.
//
// With `tether-edge run --manage-sshd` the agent does not serve SSH itself;
// it points the system sshd at material issued by the hub:
//
//   - the node's host certificate, signed by the hub's host CA, so operators'
//     clients can verify the node with a single "@cert-authority" line
//     instead of per-node known_hosts entries (HostCertificate);
//   - the user CA public keys whose certificates may log in
//     (TrustedUserCAKeys; several during a CA rotation overlap);
//   - the keys that must be refused even with a valid certificate
//     (RevokedKeys, as a plain-text list of public keys, one per line);
//   - an sshd_config drop-in that points sshd at those three files.
//
// [Apply] writes all of that atomically and reports whether anything changed,
// so the caller reloads sshd (with a [Reloader]) only when needed.
// [CheckIncluded] verifies that the main sshd_config actually reads the
// drop-in, and [ReadHostPublicKey] returns the host key the hub should
// certify. Every path is configurable so tests can aim the package at a
// loopback sshd.
package sshdconf

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/validate"
)

// File names inside [Paths.Dir]. The host certificate is named after the host
// key, see [Paths.HostCertPath].
const (
	// UserCAsFile lists the trusted user CA public keys, one per line.
	UserCAsFile = "trusted_user_ca_keys.pub"
	// RevokedKeysFile lists the revoked public keys, one per line; it is
	// empty (zero bytes) when nothing is revoked.
	RevokedKeysFile = "revoked_keys"
	// AnyLoginFile lists the certificate principals valid for every login
	// (see [Files.AnyLogin]), one per line.
	AnyLoginFile = "any_login_principals"
	// DefaultPrincipalsCommandUser runs sshd's AuthorizedPrincipalsCommand
	// unless [Paths.PrincipalsCommandUser] names another account.
	DefaultPrincipalsCommandUser = "nobody"
)

// catPaths are where Apply looks for cat(1), the AuthorizedPrincipalsCommand
// that prints [AnyLoginFile]: an absolute, root-owned system binary, as sshd
// requires of the command.
var catPaths = []string{"/usr/bin/cat", "/bin/cat"}

// File modes used by [Apply].
const (
	publicFileMode = 0o644 // certificates, CA keys, revoked keys, the drop-in
	dirMode        = 0o755 // Dir and the drop-in's directory when created
)

var (
	// ErrInvalid is wrapped by every error caused by the arguments rather
	// than by the system: retrying with the same input cannot succeed.
	ErrInvalid = errors.New("sshdconf: invalid input")

	// ErrSkipped is wrapped by Apply's error when it left out the
	// principals file of a login it cannot write, and wrote everything else
	// (revoked keys, CAs, host certificate, drop-in): reload sshd as for
	// success, and report the error.
	ErrSkipped = errors.New("sshdconf: principals of some logins left out")

	// ErrNotIncluded is returned by [CheckIncluded] when no global Include
	// line of the main sshd_config covers the drop-in.
	ErrNotIncluded = errors.New("sshdconf: drop-in not included by sshd_config")

	// ErrShadowed is returned by [CheckIncluded] when the drop-in is
	// included, but a setting read before it wins: for TrustedUserCAKeys and
	// RevokedKeys sshd keeps the first value it reads.
	ErrShadowed = errors.New("sshdconf: drop-in setting shadowed by an earlier one")
)

// invalidf returns an error wrapping [ErrInvalid].
func invalidf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{ErrInvalid}, args...)...)
}

// Paths says where the sshd material lives. All paths must be absolute.
type Paths struct {
	// Dir is the directory that holds the host certificate, the user CA keys
	// and the revoked keys, e.g. /etc/ssh/tether. It is created (mode 0755)
	// when missing.
	Dir string

	// DropIn is the sshd_config fragment Apply writes, e.g.
	// /etc/ssh/sshd_config.d/50-tether.conf. The main sshd_config must
	// Include it; see CheckIncluded.
	DropIn string

	// HostKey is the sshd host private key whose public half (HostKey+".pub")
	// is certified, e.g. /etc/ssh/ssh_host_ed25519_key. sshd must already
	// load it through a HostKey line (or its defaults): the drop-in only adds
	// the certificate, it never adds host keys, since an explicit HostKey
	// line would replace sshd's default key set.
	HostKey string

	// PrincipalsCommandUser is the account sshd runs the
	// AuthorizedPrincipalsCommand as, which only reads a public file;
	// "" means DefaultPrincipalsCommandUser. An sshd that does not run as
	// root can only run it as its own account.
	PrincipalsCommandUser string
}

// DefaultPaths returns the paths used on a Debian-like node.
func DefaultPaths() Paths {
	return Paths{
		Dir:     "/etc/ssh/tether",
		DropIn:  "/etc/ssh/sshd_config.d/50-tether.conf",
		HostKey: "/etc/ssh/ssh_host_ed25519_key",
	}
}

// HostCertPath is where the host certificate goes:
// Dir/<base of HostKey>-cert.pub.
func (p Paths) HostCertPath() string {
	return filepath.Join(p.Dir, filepath.Base(p.HostKey)+"-cert.pub")
}

// UserCAsPath is the TrustedUserCAKeys file.
func (p Paths) UserCAsPath() string { return filepath.Join(p.Dir, UserCAsFile) }

// PrincipalsDir holds one AuthorizedPrincipalsFile per login.
func (p Paths) PrincipalsDir() string { return filepath.Join(p.Dir, "principals") }

// AnyLoginPath is the file the AuthorizedPrincipalsCommand prints.
func (p Paths) AnyLoginPath() string { return filepath.Join(p.Dir, AnyLoginFile) }

// RevokedKeysPath is the RevokedKeys file.
func (p Paths) RevokedKeysPath() string { return filepath.Join(p.Dir, RevokedKeysFile) }

// HostPublicKeyPath is HostKey+".pub", the key the hub certifies.
func (p Paths) HostPublicKeyPath() string { return p.HostKey + ".pub" }

// Check reports whether every path is set, absolute, and writable into an
// sshd_config line.
func (p Paths) Check() error {
	for _, f := range []struct{ name, path string }{
		{"Dir", p.Dir},
		{"DropIn", p.DropIn},
		{"HostKey", p.HostKey},
	} {
		if err := checkPath(f.path); err != nil {
			return invalidf("Paths.%s: %v", f.name, err)
		}
	}
	if base := filepath.Base(p.HostKey); base == "." || base == string(filepath.Separator) {
		return invalidf("Paths.HostKey %q does not name a file", p.HostKey)
	}
	if u := p.PrincipalsCommandUser; u != "" {
		if err := validate.Login(u); err != nil {
			return invalidf("Paths.PrincipalsCommandUser: %v", err)
		}
	}
	return nil
}

// checkPath rejects empty and relative paths, and characters that an
// sshd_config line cannot carry even quoted (sshd has no escape for quotes
// inside quotes, and '%' starts a token in some keywords).
func checkPath(path string) error {
	if path == "" {
		return errors.New("empty path")
	}
	if !filepath.IsAbs(path) {
		return fmt.Errorf("path %q is not absolute", path)
	}
	if i := strings.IndexFunc(path, func(r rune) bool {
		return r < 0x20 || r == 0x7f || r == '"' || r == '\'' || r == '\\' || r == '%'
	}); i >= 0 {
		return fmt.Errorf("path %q contains %q, which sshd_config cannot carry", path, path[i])
	}
	return nil
}

// Files is the PKI material Apply installs.
type Files struct {
	// HostCert is the node's host certificate. It must be a host
	// certificate (ssh.HostCert) for the public key in HostKey+".pub". If
	// nil, the certificate already at Paths.HostCertPath is kept; when there
	// is none, the drop-in has no HostCertificate line.
	HostCert *ssh.Certificate

	// UserCAs are the CA public keys trusted to sign user certificates, in
	// the order they are written. At least one is required; several are
	// normal during a CA rotation overlap. Duplicates are dropped.
	UserCAs []ssh.PublicKey

	// RevokedKeys are refused for public key authentication. For a
	// certificate, its underlying key (Certificate.Key) is written, which
	// refuses the key with any certificate; a CA key listed here refuses
	// every certificate it signed. The file is written sorted and without
	// duplicates, so the order of this slice never causes a reload.
	RevokedKeys []ssh.PublicKey

	// Principals, if not nil, maps each login to the certificate principals
	// allowed to use it on this node; Apply writes them as
	// AuthorizedPrincipalsFile Dir/principals/%u. Nil leaves sshd's default
	// (the certificate must name the login itself). A login that fails
	// validate.Login, or a principal that is empty or has blanks or '#',
	// leaves that login out (see Apply).
	Principals map[string][]string

	// AnyLogin are the certificate principals valid for every login on this
	// node (roles that allow login "*"). With Principals not nil, Apply
	// writes them to Dir/any_login_principals and, when there are any,
	// has sshd consult that file for every account through an
	// AuthorizedPrincipalsCommand (cat, run as Paths.PrincipalsCommandUser)
	// after the login's own principals file. So "*" reaches exactly the
	// accounts sshd itself lets log in (PermitRootLogin, AllowUsers,
	// DenyUsers and a valid shell still apply), as on the embedded server,
	// including accounts created after the push. A principal that is empty
	// or has blanks or '#' leaves AnyLogin out (see Apply).
	AnyLogin []string

	// ScopedCAs are the user CAs of hubs above this node's site hub, each
	// accepted only for its own principals (see ScopedCA). With any, the
	// drop-in sets AuthorizedKeysFile to sshd's default files followed by
	// Dir/authorized_keys/%u; without, it leaves AuthorizedKeysFile alone
	// and the managed files are removed.
	ScopedCAs []ScopedCA
}

// check validates f against the host public key hostPub, which is only
// needed (and may be nil) when f.HostCert is nil.
func (f Files) check(hostPub ssh.PublicKey) error {
	if c := f.HostCert; c != nil {
		if c.CertType != ssh.HostCert {
			return invalidf("HostCert is a user certificate (type %d), not a host certificate", c.CertType)
		}
		if c.Key == nil {
			return invalidf("HostCert has no public key")
		}
		if _, ok := c.Key.(*ssh.Certificate); ok {
			return invalidf("HostCert certifies a certificate, not a key")
		}
		if c.SignatureKey == nil || c.Signature == nil {
			return invalidf("HostCert is not signed")
		}
		if !sameKey(c.Key, hostPub) {
			return invalidf("HostCert certifies %s %s, not the host key %s %s",
				c.Key.Type(), ssh.FingerprintSHA256(c.Key), hostPub.Type(), ssh.FingerprintSHA256(hostPub))
		}
	}
	if len(f.UserCAs) == 0 {
		return invalidf("no UserCAs: sshd would accept no user certificate")
	}
	if err := checkScoped(f.ScopedCAs); err != nil {
		return err
	}
	for i, k := range f.UserCAs {
		if isNil(k) {
			return invalidf("UserCAs[%d] is nil", i)
		}
		if _, ok := k.(*ssh.Certificate); ok {
			return invalidf("UserCAs[%d] is a certificate, not a CA public key", i)
		}
	}
	for i, k := range f.RevokedKeys {
		if isNil(k) {
			return invalidf("RevokedKeys[%d] is nil", i)
		}
		if c, ok := k.(*ssh.Certificate); ok && isNil(c.Key) {
			return invalidf("RevokedKeys[%d] is a certificate without a key", i)
		}
	}
	return nil
}

// isNil reports whether k is nil, including a typed nil certificate.
func isNil(k ssh.PublicKey) bool {
	if k == nil {
		return true
	}
	c, ok := k.(*ssh.Certificate)
	return ok && c == nil
}

// sameKey compares two public keys by their wire encoding.
func sameKey(a, b ssh.PublicKey) bool {
	return string(a.Marshal()) == string(b.Marshal())
}

// ReadHostPublicKey reads HostKey+".pub", the public key the agent sends the
// hub to be certified.
func ReadHostPublicKey(p Paths) (ssh.PublicKey, error) {
	if err := checkPath(p.HostKey); err != nil {
		return nil, invalidf("Paths.HostKey: %v", err)
	}
	return readHostPublicKey(p.HostPublicKeyPath())
}

func readHostPublicKey(path string) (ssh.PublicKey, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("sshdconf: read host public key: %w", err)
	}
	k, _, _, _, err := ssh.ParseAuthorizedKey(b)
	if err != nil {
		return nil, fmt.Errorf("sshdconf: parse host public key %s: %w", path, err)
	}
	if _, ok := k.(*ssh.Certificate); ok {
		return nil, fmt.Errorf("sshdconf: %s holds a certificate, not a host public key", path)
	}
	return k, nil
}
