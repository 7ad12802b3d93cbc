package artifacts

import (
	"errors"
	"fmt"
	"net"
	"regexp"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/tunnel/upgradeproto"
	"oras.land/oras-go/v2/registry"
)

// Scheme prefixes every artifact reference Tether takes.
const Scheme = "oci://"

// ErrBadReference is returned for a reference that does not parse.
var ErrBadReference = errors.New("artifacts: bad reference")

// Reference is a parsed oci://HOST[:PORT]/REPO(:TAG|@sha256:HEX).
// Exactly one of Tag and Digest is set: a reference naming both is taken by
// its digest (the tag is only a label then).
type Reference struct {
	Registry   string // HOST[:PORT]
	Repository string // path inside the registry
	Tag        string
	Digest     string // sha256:HEX
}

// The OCI distribution grammar for repository path components and tags.
var (
	repoComponent = regexp.MustCompile(`^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$`)
	tagPattern    = regexp.MustCompile(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
	hostLabel     = regexp.MustCompile(`^[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?$`)
)

const maxReference = 1024

// ParseReference parses an artifact reference. It must say where (HOST,
// optional PORT), what (REPO) and which (a :TAG or an @sha256: digest);
// there is no default registry and no implied "latest".
func ParseReference(s string) (Reference, error) {
	bad := func(format string, a ...any) (Reference, error) {
		return Reference{}, fmt.Errorf("%w %.200q: %s (want oci://HOST[:PORT]/REPO:TAG or oci://HOST[:PORT]/REPO@sha256:HEX)",
			ErrBadReference, s, fmt.Sprintf(format, a...))
	}
	if len(s) > maxReference {
		return bad("longer than %d characters", maxReference)
	}
	rest, ok := strings.CutPrefix(s, Scheme)
	if !ok {
		return bad("does not start with %s", Scheme)
	}
	host, path, ok := strings.Cut(rest, "/")
	if !ok || path == "" {
		return bad("no repository after the registry host")
	}
	if err := checkHost(host); err != nil {
		return bad("registry %.100q: %v", host, err)
	}
	var r Reference
	r.Registry = host
	if p, d, ok := strings.Cut(path, "@"); ok {
		if !upgradeproto.ValidDigest(d) {
			return bad("digest %.80q is not sha256: and 64 lowercase hex digits", d)
		}
		r.Digest, path = d, p
	}
	if i := strings.LastIndexByte(path, ':'); i >= 0 {
		tag := path[i+1:]
		if !tagPattern.MatchString(tag) {
			return bad("tag %.130q: letters, digits, '_', '.', '-' (at most 128, not starting with '.' or '-')", tag)
		}
		path = path[:i]
		if r.Digest == "" {
			r.Tag = tag
		}
	}
	if r.Tag == "" && r.Digest == "" {
		return bad("no :TAG or @sha256: digest (an upgrade pins an exact artifact; there is no implied latest)")
	}
	if len(path) > 255 {
		return bad("repository longer than 255 characters")
	}
	for _, c := range strings.Split(path, "/") {
		if !repoComponent.MatchString(c) {
			return bad("repository component %.80q: lowercase letters and digits, separated by '.', '_', '__' or '-'", c)
		}
	}
	r.Repository = path
	// The library that talks to the registry must read it the same way.
	if _, err := registry.ParseReference(r.oras()); err != nil {
		return bad("%v", err)
	}
	return r, nil
}

func checkHost(host string) error {
	h, port, hasPort := host, "", false
	if rest, ok := strings.CutPrefix(host, "["); ok {
		ip, after, ok := strings.Cut(rest, "]")
		if !ok {
			return errors.New("unclosed [")
		}
		if a := net.ParseIP(ip); a == nil || a.To4() != nil {
			return errors.New("not an IPv6 address in brackets")
		}
		if after != "" {
			if port, hasPort = strings.CutPrefix(after, ":"); !hasPort {
				return errors.New("junk after ]")
			}
		}
		h = ""
	} else if i := strings.LastIndexByte(host, ':'); i >= 0 {
		h, port, hasPort = host[:i], host[i+1:], true
	}
	if hasPort {
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || strconv.Itoa(p) != port {
			return fmt.Errorf("port %.10q is not 1..65535", port)
		}
	}
	if strings.HasPrefix(host, "[") {
		return nil
	}
	if h == "" || len(h) > 253 {
		return errors.New("empty or too long host name")
	}
	for _, l := range strings.Split(h, ".") {
		if !hostLabel.MatchString(l) {
			return fmt.Errorf("host label %.64q: letters, digits and inner '-'", l)
		}
	}
	return nil
}

// String is the reference as Tether writes it.
func (r Reference) String() string { return Scheme + r.oras() }

// oras is the reference without the scheme, as oras-go reads it.
func (r Reference) oras() string {
	s := r.Registry + "/" + r.Repository
	if r.Digest != "" {
		return s + "@" + r.Digest
	}
	return s + ":" + r.Tag
}

// Pinned is r fixed to digest d.
func (r Reference) Pinned(d string) Reference {
	r.Tag, r.Digest = "", d
	return r
}
