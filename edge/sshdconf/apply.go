package sshdconf

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/validate"
)

// dropInHeader starts every drop-in Apply writes.
const dropInHeader = `# Managed by tether-edge (--manage-sshd); do not edit.
# Every change is overwritten the next time the hub's PKI is applied.
`

// Apply installs f for the sshd described by p and reports whether any file
// changed, so the caller reloads sshd only then.
//
// Everything is checked before anything is written. Invalid paths, host
// certificate, CA keys or revoked keys yield an error wrapping [ErrInvalid]
// and leave every file alone. A login in f.Principals that cannot name a
// principals file (see [validate.Login]), or whose principals cannot be
// written into one, is left out — with no file, that login accepts no
// certificate — and everything else is still written: a bad login must
// never keep a revocation from reaching sshd. Apply then returns changed
// and an error wrapping [ErrSkipped] that names each login left out; the
// caller should reload sshd as for a nil error and report the skipped
// logins.
//
// It writes, in this order, the RevokedKeys file (first: it is what locks
// a removed operator out), the TrustedUserCAKeys file, the host
// certificate (unless f.HostCert is nil), the principals files and finally
// the drop-in that points at them, so sshd never reads a drop-in naming a
// missing file (a missing or unreadable RevokedKeys file makes sshd refuse
// every public key). Each file is replaced atomically: a temp file in the
// same directory, fsync, rename, fsync of the directory. A file whose bytes
// are already right is left alone (its mode is still fixed to 0644). Dir
// and the drop-in's directory are created with mode 0755 when missing.
//
// With OpenSSH 9.2 only a change to the drop-in strictly needs a reload:
// sshd reads the drop-in when it starts, but the files it names on every
// connection, so new certificates, CAs and revocations apply to the next
// connection even before the reload. Reloading on every change is harmless
// and does not depend on that.
//
// On an error writing a file, changed still reports the files already
// replaced.
func Apply(p Paths, f Files) (changed bool, err error) {
	if err := p.Check(); err != nil {
		return false, err
	}
	var hostPub ssh.PublicKey
	if f.HostCert != nil {
		if hostPub, err = ReadHostPublicKey(p); err != nil {
			return false, err
		}
	}
	if err := f.check(hostPub); err != nil {
		return false, err
	}
	principals, skipped := checkPrincipals(f.Principals)
	var anyLogin []string
	var cat string
	if principals != nil {
		if anyLogin, cat, err = checkAnyLogin(f.AnyLogin); err != nil {
			skipped = append(skipped, err)
		}
	}

	for _, dir := range []string{p.Dir, filepath.Dir(p.DropIn)} {
		if err := ensureDir(dir); err != nil {
			return false, err
		}
	}
	for _, w := range []struct {
		what, path string
		data       []byte
	}{
		{"revoked keys", p.RevokedKeysPath(), marshalKeys(f.RevokedKeys, true)},
		{"user CA keys", p.UserCAsPath(), marshalKeys(f.UserCAs, false)},
	} {
		c, err := writeFileAtomic(w.path, w.data)
		changed = changed || c
		if err != nil {
			return changed, fmt.Errorf("sshdconf: write %s: %w", w.what, err)
		}
	}

	hostCert := p.HostCertPath()
	if f.HostCert != nil {
		c, err := writeFileAtomic(hostCert, ssh.MarshalAuthorizedKey(f.HostCert))
		changed = changed || c
		if err != nil {
			return changed, fmt.Errorf("sshdconf: write host certificate: %w", err)
		}
	} else if _, err := os.Stat(hostCert); errors.Is(err, fs.ErrNotExist) {
		hostCert = "" // nothing to keep: leave HostCertificate out
	} else if err != nil {
		return changed, fmt.Errorf("sshdconf: keep host certificate: %w", err)
	}

	d := dropIn{hostCert: hostCert, userCAs: p.UserCAsPath(), revoked: p.RevokedKeysPath()}
	if principals != nil {
		c, err := writePrincipals(p.PrincipalsDir(), principals)
		changed = changed || c
		if err != nil {
			return changed, err
		}
		d.principals = filepath.Join(p.PrincipalsDir(), "%u")
		c, err = writeFileAtomic(p.AnyLoginPath(), linesOf(anyLogin))
		changed = changed || c
		if err != nil {
			return changed, fmt.Errorf("sshdconf: write any-login principals: %w", err)
		}
		if len(anyLogin) > 0 {
			d.anyLoginCommand = cat + " " + quoteArg(p.AnyLoginPath())
			d.commandUser = cmp.Or(p.PrincipalsCommandUser, DefaultPrincipalsCommandUser)
		}
	}
	scopedKeys, anyKeys, scopedSkipped := scopedLines(f.ScopedCAs)
	skipped = append(skipped, scopedSkipped...)
	if len(f.ScopedCAs) == 0 {
		scopedKeys, anyKeys = map[string][]byte{}, nil
	}
	if _, err := os.Stat(p.AuthorizedKeysDir()); len(f.ScopedCAs) > 0 || err == nil {
		c, err := writeAuthorizedKeys(p.AuthorizedKeysDir(), scopedKeys)
		changed = changed || c
		if err != nil {
			return changed, err
		}
	}
	if len(f.ScopedCAs) > 0 {
		d.authorizedKeys = defaultAuthorizedKeys + " " + quoteArg(filepath.Join(p.AuthorizedKeysDir(), "%u"))
		c, err := writeFileAtomic(p.AnyLoginKeysPath(), anyKeys)
		changed = changed || c
		if err != nil {
			return changed, fmt.Errorf("sshdconf: write any-login authorized keys: %w", err)
		}
		if len(anyKeys) > 0 {
			if _, cat, err := checkAnyLogin([]string{"x"}); err != nil {
				skipped = append(skipped, fmt.Errorf("scoped CAs for any login skipped: %w", err))
			} else {
				d.anyKeysCommand = cat + " " + quoteArg(p.AnyLoginKeysPath())
				d.commandUser = cmp.Or(p.PrincipalsCommandUser, DefaultPrincipalsCommandUser)
			}
		}
	}
	c, err := writeFileAtomic(p.DropIn, d.render())
	changed = changed || c
	if err != nil {
		return changed, fmt.Errorf("sshdconf: write drop-in: %w", err)
	}
	if len(skipped) > 0 {
		return changed, fmt.Errorf(
			"%w (each accepts no certificate until fixed on the hub): %w",
			ErrSkipped, errors.Join(skipped...),
		)
	}
	return changed, nil
}

// checkPrincipals returns the entries of principals that can be written
// (nil for nil), and one error per login left out, sorted by login.
func checkPrincipals(principals map[string][]string) (ok map[string][]string, skipped []error) {
	if principals == nil {
		return nil, nil
	}
	ok = make(map[string][]string, len(principals))
	for _, login := range slices.Sorted(maps.Keys(principals)) {
		if err := validate.Login(login); err != nil {
			skipped = append(skipped, fmt.Errorf("login skipped: %w", err))
			continue
		}
		if i := slices.IndexFunc(principals[login], func(pr string) bool {
			return pr == "" || strings.ContainsAny(pr, " \t\r\n#")
		}); i >= 0 {
			skipped = append(
				skipped,
				fmt.Errorf("login %q skipped: principal %q is empty or has blanks or '#'", login, principals[login][i]),
			)
			continue
		}
		ok[login] = principals[login]
	}
	return ok, skipped
}

// checkAnyLogin returns the any-login principals that can be written
// (none, with an error, if one cannot) and the cat(1) that prints them.
func checkAnyLogin(anyLogin []string) (ok []string, cat string, err error) {
	if len(anyLogin) == 0 {
		return nil, "", nil
	}
	if i := slices.IndexFunc(anyLogin, func(pr string) bool {
		return pr == "" || strings.ContainsAny(pr, " \t\r\n#")
	}); i >= 0 {
		return nil, "", fmt.Errorf(
			"principals for any login skipped: principal %q is empty or has blanks or '#'",
			anyLogin[i],
		)
	}
	for _, c := range catPaths {
		if fi, err := os.Stat(c); err == nil && fi.Mode().IsRegular() {
			return anyLogin, c, nil
		}
	}
	return nil, "", fmt.Errorf(
		"principals for any login skipped: no cat(1) at %s to serve them to sshd",
		strings.Join(catPaths, " or "),
	)
}

// linesOf renders principals one per line, sorted, without duplicates.
func linesOf(principals []string) []byte {
	if len(principals) == 0 {
		return []byte{}
	}
	sorted := slices.Clone(principals)
	slices.Sort(sorted)
	return []byte(strings.Join(slices.Compact(sorted), "\n") + "\n")
}

// marshalKeys renders keys one per line in authorized_keys format, without
// duplicates. A certificate is reduced to its key when revoked is set.
// Revoked keys are sorted; CA keys keep their order. No keys yield an empty
// slice: sshd accepts an empty RevokedKeys file as "nothing revoked".
func marshalKeys(keys []ssh.PublicKey, revoked bool) []byte {
	seen := make(map[string]bool, len(keys))
	lines := make([]string, 0, len(keys))
	for _, k := range keys {
		if c, ok := k.(*ssh.Certificate); ok && revoked {
			k = c.Key
		}
		if seen[string(k.Marshal())] {
			continue
		}
		seen[string(k.Marshal())] = true
		lines = append(lines, string(ssh.MarshalAuthorizedKey(k)))
	}
	if revoked {
		slices.Sort(lines)
	}
	return []byte(strings.Join(lines, ""))
}

// dropIn is what the drop-in says; hostCert, principals and
// anyLoginCommand may be empty.
type dropIn struct {
	hostCert, userCAs, revoked string
	principals                 string // AuthorizedPrincipalsFile pattern
	anyLoginCommand            string // AuthorizedPrincipalsCommand, quoted
	commandUser                string // AuthorizedPrincipalsCommandUser (and AuthorizedKeysCommandUser)
	authorizedKeys             string // AuthorizedKeysFile, with the scoped CAs' files
	anyKeysCommand             string // AuthorizedKeysCommand, quoted
}

func (d dropIn) render() []byte {
	var b bytes.Buffer
	b.WriteString(dropInHeader)
	if d.hostCert != "" {
		fmt.Fprintf(&b, "HostCertificate %s\n", quoteArg(d.hostCert))
	}
	fmt.Fprintf(&b, "TrustedUserCAKeys %s\n", quoteArg(d.userCAs))
	fmt.Fprintf(&b, "RevokedKeys %s\n", quoteArg(d.revoked))
	if d.principals != "" {
		fmt.Fprintf(&b, "AuthorizedPrincipalsFile %s\n", quoteArg(d.principals))
	}
	if d.anyLoginCommand != "" {
		// sshd consults the command after the login's own file, for
		// every account: roles allowing any login reach exactly the
		// accounts sshd lets log in.
		fmt.Fprintf(&b, "AuthorizedPrincipalsCommand %s\n", d.anyLoginCommand)
		fmt.Fprintf(&b, "AuthorizedPrincipalsCommandUser %s\n", d.commandUser)
	}
	if d.authorizedKeys != "" {
		// The users' own files first: they keep working. The managed
		// file holds the scoped CAs' cert-authority lines.
		fmt.Fprintf(&b, "AuthorizedKeysFile %s\n", d.authorizedKeys)
	}
	if d.anyKeysCommand != "" {
		fmt.Fprintf(&b, "AuthorizedKeysCommand %s\n", d.anyKeysCommand)
		fmt.Fprintf(&b, "AuthorizedKeysCommandUser %s\n", d.commandUser)
	}
	return b.Bytes()
}

// writePrincipals makes dir hold exactly one file per login listing the
// certificate principals that may log in as it (sshd's
// AuthorizedPrincipalsFile DIR/%u); files of logins no longer listed are
// removed, so a login without a file accepts no certificate. principals has
// passed checkPrincipals.
func writePrincipals(dir string, principals map[string][]string) (changed bool, err error) {
	files := make(map[string][]byte, len(principals))
	for login, ps := range principals {
		sorted := slices.Clone(ps)
		slices.Sort(sorted)
		files[login] = []byte(strings.Join(slices.Compact(sorted), "\n") + "\n")
	}
	return writePerLogin(dir, files, "principals")
}

// writePerLogin makes dir hold exactly one file per login of files (what
// sshd reads as DIR/%u), removing the files of logins no longer listed.
func writePerLogin(dir string, files map[string][]byte, what string) (changed bool, err error) {
	if err := ensureDir(dir); err != nil {
		return false, err
	}
	for login, data := range files {
		c, err := writeFileAtomic(filepath.Join(dir, login), data)
		changed = changed || c
		if err != nil {
			return changed, fmt.Errorf("sshdconf: write %s for %s: %w", what, login, err)
		}
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return changed, fmt.Errorf("sshdconf: %w", err)
	}
	for _, e := range entries {
		if _, keep := files[e.Name()]; !keep && !strings.HasPrefix(e.Name(), ".") {
			if err := os.Remove(filepath.Join(dir, e.Name())); err != nil {
				return changed, fmt.Errorf("sshdconf: %w", err)
			}
			changed = true
		}
	}
	return changed, nil
}

// quoteArg double-quotes an sshd_config argument when it has blanks or '#'.
// checkPath has already rejected what quoting cannot carry.
func quoteArg(s string) string {
	if strings.ContainsAny(s, " \t#") {
		return `"` + s + `"`
	}
	return s
}

// ensureDir creates dir with mode 0755 (regardless of the umask) when it is
// missing; an existing directory keeps its mode.
func ensureDir(dir string) error {
	if fi, err := os.Stat(dir); err == nil {
		if !fi.IsDir() {
			return fmt.Errorf("sshdconf: %s is not a directory", dir)
		}
		return nil
	}
	if err := ensureDir(filepath.Dir(dir)); err != nil {
		return err
	}
	if err := os.Mkdir(dir, dirMode); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("sshdconf: create directory: %w", err)
	}
	if err := os.Chmod(dir, dirMode); err != nil {
		return fmt.Errorf("sshdconf: create directory: %w", err)
	}
	return nil
}

// writeFileAtomic replaces path with data (mode 0644) unless it already
// holds exactly data, and reports whether it replaced it.
func writeFileAtomic(path string, data []byte) (changed bool, err error) {
	old, err := os.ReadFile(path)
	switch {
	case err == nil && bytes.Equal(old, data):
		// Same bytes: no reload needed, but still repair the mode.
		fi, err := os.Stat(path)
		if err != nil {
			return false, err
		}
		if fi.Mode().Perm() != publicFileMode {
			return false, os.Chmod(path, publicFileMode)
		}
		return false, nil
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return false, err
	}

	dir, base := filepath.Split(path)
	tmp, err := os.CreateTemp(dir, "."+base+".tmp-*")
	if err != nil {
		return false, err
	}
	defer func() {
		if err != nil {
			tmp.Close()
			os.Remove(tmp.Name())
		}
	}()
	if _, err = tmp.Write(data); err != nil {
		return false, err
	}
	if err = tmp.Chmod(publicFileMode); err != nil {
		return false, err
	}
	if err = tmp.Sync(); err != nil {
		return false, err
	}
	if err = tmp.Close(); err != nil {
		return false, err
	}
	if err = os.Rename(tmp.Name(), path); err != nil {
		return false, err
	}
	// The rename happened: from here on the file has changed.
	return true, syncDir(dir)
}

// syncDir fsyncs a directory so a rename inside it is durable.
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}
