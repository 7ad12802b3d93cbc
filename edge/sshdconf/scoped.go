package sshdconf

import (
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/validate"
)

// Scoped user CAs: the user CAs of hubs above this node's site hub. sshd
// must accept their certificates only for the principals those hubs grant
// on this node, so they are never written to TrustedUserCAKeys (whose
// certificates the node's own principals files decide). Each is a
// `cert-authority,principals="…"` line in a tether-managed
// AuthorizedKeysFile per login (Dir/authorized_keys/%u), listed after the
// users' own ~/.ssh/authorized_keys, which keep working.

// ScopedCA is one ancestor hub's user CA with what its certificates may
// do on this node.
type ScopedCA struct {
	Keys []ssh.PublicKey
	// Principals maps a login to the principals that may use it.
	Principals map[string][]string
	// AnyLogin are principals valid for every login sshd lets log in
	// (written to Dir/any_login_authorized_keys and served to sshd by an
	// AuthorizedKeysCommand, as AnyLoginFile is).
	AnyLogin []string
	// NoForwarding lists the principals that may not forward ports: their
	// lines carry no-port-forwarding.
	NoForwarding []string
}

// AnyLoginKeysFile holds the cert-authority lines valid for every login.
const AnyLoginKeysFile = "any_login_authorized_keys"

// AuthorizedKeysDir holds one AuthorizedKeysFile per login with the scoped
// CAs' cert-authority lines.
func (p Paths) AuthorizedKeysDir() string { return filepath.Join(p.Dir, "authorized_keys") }

// AnyLoginKeysPath is the file the AuthorizedKeysCommand prints.
func (p Paths) AnyLoginKeysPath() string { return filepath.Join(p.Dir, AnyLoginKeysFile) }

// defaultAuthorizedKeys is sshd's own AuthorizedKeysFile default, kept in
// front of the managed file so users' keys keep working.
const defaultAuthorizedKeys = ".ssh/authorized_keys .ssh/authorized_keys2"

func checkScoped(cas []ScopedCA) error {
	for i, c := range cas {
		if len(c.Keys) == 0 {
			return invalidf("ScopedCAs[%d] has no key", i)
		}
		for _, k := range c.Keys {
			if isNil(k) {
				return invalidf("ScopedCAs[%d] has a nil key", i)
			}
			if _, ok := k.(*ssh.Certificate); ok {
				return invalidf("ScopedCAs[%d] holds a certificate, not a CA public key", i)
			}
		}
	}
	return nil
}

// scopedLines renders the cert-authority lines of cas per login, and those
// valid for any login. A principal that cannot be written into the
// principals="…" option (empty, blanks, quotes, commas, '#') is left out
// and reported; a login that cannot name a file is left out and reported.
func scopedLines(cas []ScopedCA) (perLogin map[string][]byte, anyLogin []byte, skipped []error) {
	perLogin = map[string][]byte{}
	bad := func(p string) bool { return p == "" || strings.ContainsAny(p, " \t\r\n#\",\\") }
	line := func(keys []ssh.PublicKey, principals []string, noForward bool) string {
		opts := `cert-authority,principals="` + strings.Join(principals, ",") + `"`
		if noForward {
			opts += ",no-port-forwarding"
		}
		var b strings.Builder
		for _, k := range keys {
			b.WriteString(opts + " " + string(ssh.MarshalAuthorizedKey(k)))
		}
		return b.String()
	}
	// lines splits principals into those that may forward and those that
	// may not: sshd tries each line of a file in turn.
	lines := func(c ScopedCA, principals []string) string {
		var fwd, noFwd []string
		for _, p := range principals {
			if bad(p) {
				skipped = append(skipped, fmt.Errorf("scoped principal %q skipped: empty or has blanks, quotes, commas or '#'", p))
				continue
			}
			if slices.Contains(c.NoForwarding, p) {
				noFwd = append(noFwd, p)
			} else {
				fwd = append(fwd, p)
			}
		}
		out := ""
		for _, g := range []struct {
			ps []string
			nf bool
		}{{fwd, false}, {noFwd, true}} {
			if len(g.ps) == 0 {
				continue
			}
			slices.Sort(g.ps)
			out += line(c.Keys, slices.Compact(g.ps), g.nf)
		}
		return out
	}
	text := map[string]string{}
	anyText := ""
	for _, c := range cas {
		for _, login := range slices.Sorted(maps.Keys(c.Principals)) {
			if err := validate.Login(login); err != nil {
				skipped = append(skipped, fmt.Errorf("scoped login skipped: %w", err))
				continue
			}
			text[login] += lines(c, c.Principals[login])
		}
		anyText += lines(c, c.AnyLogin)
	}
	for login, t := range text {
		if t != "" {
			perLogin[login] = []byte(t)
		}
	}
	return perLogin, []byte(anyText), skipped
}

// writeAuthorizedKeys makes dir hold exactly one file per login of
// perLogin; files of logins no longer listed are removed.
func writeAuthorizedKeys(dir string, perLogin map[string][]byte) (changed bool, err error) {
	return writePerLogin(dir, perLogin, "authorized keys")
}
