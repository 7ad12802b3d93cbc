// Package validate is the one vocabulary of names Tether accepts: node
// and site names, SSH logins, label keys and values, environment variable
// names, and which host names are addresses rather than names (the
// bastion's refusal and the node names' rule are one).
//
// Every part that takes such a name from outside (the hub's API and jobs,
// roles, the provisioning runner, the agent's SSH server and its managed
// sshd) checks it here, so a name one part accepts is never one another
// part refuses later — on a node, when refusing may be too late to be seen.
// The package imports nothing of Tether's, so that edge, hub, pki and
// provisioners may all use it.
//
// Every check returns nil or an *Error that wraps [ErrInvalid] and says
// what was wrong and what is allowed.
package validate

import (
	"errors"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
)

// Bounds.
const (
	MaxLoginLen    = 32 // the common useradd limit
	MaxDNSLabelLen = 63 // node and role names
	MaxLabelLen    = 63 // label keys and values
	MaxLabels      = 64 // labels on one node
	MaxEnvNameLen  = 256
)

// ErrInvalid is wrapped by every error of this package.
var ErrInvalid = errors.New("invalid")

// Error says which kind of name was refused, the value, and the rule.
type Error struct {
	What  string // "login", "node name", "label key", ...
	Value string
	Rule  string // what is allowed, for the person who typed Value
}

func (e *Error) Error() string {
	return fmt.Sprintf("invalid %s %.80q: %s", e.What, e.Value, e.Rule)
}

// Unwrap makes errors.Is(err, ErrInvalid) true.
func (e *Error) Unwrap() error { return ErrInvalid }

func bad(what, value, rule string) error { return &Error{What: what, Value: value, Rule: rule} }

// Rules, as told to the user.
const (
	loginRule = "a user name of 1-32 characters: lowercase letters, digits, '_', '-' and '.', " +
		"starting with a letter or '_'"
	dnsLabelRule = "1-63 lowercase letters, digits and inner dashes (a DNS label), not all digits"
	roleNameRule = "1-63 lowercase letters, digits and inner dashes (a DNS label)"
	labelKeyRule = "1-63 characters: lowercase letters, digits, '.', '_', '/' and '-', " +
		"starting and ending with a letter or digit"
	labelValRule = "empty, or 1-63 characters: letters, digits, '.', '_' and '-', " +
		"starting and ending with a letter or digit"
	envNameRule = "letters, digits and '_', not starting with a digit"
)

// Login checks an SSH login (a user name on a node).
//
// The rule is the POSIX portable user name — the portable file name
// characters [A-Za-z0-9._-], not starting with '-' — narrowed to lowercase,
// a first character that is a letter or '_', and at most 32 characters.
// A login is used as a file name (the managed sshd's AuthorizedPrincipalsFile
// DIR/%u, one file per login) and as the User of an SSH connection, so:
//   - no '/', and no leading '.': never ".", "..", a path outside the
//     directory, or a hidden file (the temporary files written beside it
//     are hidden);
//   - no trailing '$' (Samba machine accounts, which do not log in over
//     SSH): '$' is outside the portable set and a shell expansion character
//     should a login ever reach a command line;
//   - '.' inside is allowed ("first.last"), as the hub's provisioning login
//     always allowed it;
//   - no blank, '#', quote or '%', which sshd_config lines and sshd's
//     %-tokens would read as syntax.
func Login(s string) error {
	if len(s) == 0 || len(s) > MaxLoginLen {
		return bad("login", s, loginRule)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_' || c >= 'a' && c <= 'z':
		case i > 0 && (c >= '0' && c <= '9' || c == '-' || c == '.'):
		default:
			return bad("login", s, loginRule)
		}
	}
	return nil
}

// NodeName checks a node (or operator) name, reported as "invalid name": a DNS label, so that NAME.tether
// is a valid host name for ssh, and not a name that reads as an address or a
// number (see [Address]): the bastion refuses to forward to such a name, so a
// node that took one would be unreachable.
func NodeName(s string) error { return dnsLabel("name", s, false) }

// SiteName checks the name a site hub takes below a hub whose nodes are
// NAME.suffix: a node name, and not suffix itself. A site's nodes are
// NODE.SITE.suffix, and `tether config ssh` trusts the site's host CA for
// *.SITE; a site named suffix would be trusted for *.suffix, every node of
// the hub above it.
func SiteName(s, suffix string) error {
	if err := dnsLabel("site name", s, false); err != nil {
		return err
	}
	if s == suffix {
		return bad("site name", s, "it is this hub's node suffix (nodes are NAME."+suffix+"): "+
			"the site's host CA would be trusted for every node of this hub; choose another --site")
	}
	return nil
}

// loopbackNames are the host names that /etc/hosts of the common
// distributions (Debian, Red Hat, macOS) map to loopback, link-local or
// multicast addresses.
var loopbackNames = []string{
	"localhost", "localhost4", "localhost6", "ip6-localhost", "ip6-loopback", "ip6-localnet",
	"ip6-mcastprefix", "ip6-allnodes", "ip6-allrouters", "ip6-allhosts", "broadcasthost",
}

// Address reports whether host reads as an address rather than a name to
// the resolver, ssh, a browser or a YAML/JSON tool, and what it reads as:
//   - an IP address, IPv6 (in brackets or not) or IPv4 in any form
//     inet_aton(3) and URL parsers take: 127.0.0.1, 127.1, 2130706433,
//     0x7f000001, 017700000001;
//   - a name the hosts file or RFC 6761 gives an address: localhost (and
//     any name below it), localhost.localdomain, ip6-localhost, ip6-loopback, …;
//   - an IPv4 address written with dashes (127-0-0-1), which wildcard DNS
//     services resolve to that address;
//   - a number: all digits (an address to inet_aton, a numeric ID to
//     people), hexadecimal (0x1f), octal or binary with 0o/0b, or a
//     decimal with an exponent (1e3, a float to YAML and JSON).
//
// The bastion refuses to forward to such a host ("is an address"), and
// node names are refused by the same rule, so a node that could not be
// reached never joins.
func Address(host string) (what string, ok bool) {
	h := strings.ToLower(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	if _, err := netip.ParseAddr(h); err == nil {
		return "an IP address", true
	}
	h = strings.TrimSuffix(h, ".")
	if h == "" {
		return "", false
	}
	if inetAton(h) {
		return "an IPv4 address or a number", true
	}
	bare := h
	for _, dom := range []string{".localdomain", ".localdomain4", ".localdomain6"} {
		bare = strings.TrimSuffix(bare, dom)
	}
	if slices.Contains(loopbackNames, bare) || strings.HasSuffix(h, ".localhost") {
		return "a loopback or local host name", true
	}
	if dashedIPv4(h) {
		return "an IPv4 address written with dashes", true
	}
	if number(h) {
		return "a number", true
	}
	return "", false
}

// inetAton reports whether s is 1-4 dot-separated numbers, each decimal,
// octal (leading 0) or hexadecimal (0x, digits optional), as glibc's
// inet_aton and the WHATWG URL parser read IPv4 addresses.
func inetAton(s string) bool {
	parts := strings.Split(s, ".")
	if len(parts) > 4 {
		return false
	}
	for _, p := range parts {
		if hex, ok := strings.CutPrefix(p, "0x"); ok {
			if strings.Trim(hex, "0123456789abcdef") != "" {
				return false
			}
			continue
		}
		if p == "" || strings.Trim(p, "0123456789") != "" {
			return false
		}
	}
	return true
}

// dashedIPv4 reports whether s is four decimal numbers 0-255 joined by '-'.
func dashedIPv4(s string) bool {
	parts := strings.Split(s, "-")
	if len(parts) != 4 {
		return false
	}
	for _, p := range parts {
		if len(p) == 0 || len(p) > 3 || strings.Trim(p, "0123456789") != "" {
			return false
		}
		if v, _ := strconv.Atoi(p); v > 255 {
			return false
		}
	}
	return true
}

// number reports whether s is an integer with a 0o or 0b prefix, or a
// decimal with an exponent (1e3, 1e-3, 2e+5); all digits and 0x are
// inetAton's.
func number(s string) bool {
	for prefix, digits := range map[string]string{"0o": "01234567", "0b": "01"} {
		if rest, ok := strings.CutPrefix(s, prefix); ok && rest != "" && strings.Trim(rest, digits) == "" {
			return true
		}
	}
	mant, exp, ok := strings.Cut(s, "e")
	exp = strings.TrimLeft(exp, "+-")
	return ok && mant != "" && exp != "" && strings.Trim(mant, "0123456789") == "" && strings.Trim(exp, "0123456789") == ""
}

// ClusterName checks a KubeOne cluster's name: a DNS label, as a node
// name (KubeOne wants a DNS name; the hub makes a bastion user and a
// directory of it).
func ClusterName(s string) error { return dnsLabel("cluster name", s, false) }

// RoleName checks a role name: a DNS label; unlike a node name it may be
// all digits, since it is never a host name.
func RoleName(s string) error { return dnsLabel("role name", s, true) }

func dnsLabel(what, s string, digitsOK bool) error {
	rule := dnsLabelRule
	if digitsOK {
		rule = roleNameRule
	} else if is, ok := Address(s); ok {
		return bad(what, s, "it reads as "+is+", and the bastion forwards only to names that are not addresses "+
			"or numbers; choose another ("+rule+")")
	}
	if len(s) == 0 || len(s) > MaxDNSLabelLen || s[0] == '-' || s[len(s)-1] == '-' {
		return bad(what, s, rule)
	}
	digits := true
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= '0' && c <= '9':
		case c >= 'a' && c <= 'z', c == '-':
			digits = false
		default:
			return bad(what, s, rule)
		}
	}
	if digits && !digitsOK {
		return bad(what, s, rule)
	}
	return nil
}

// LabelKey checks a node label key (Kubernetes-like, without the prefix
// length rules): every key a node carries can be named in a role selector
// without quoting.
func LabelKey(s string) error {
	if !edgesAlnum(s, false) {
		return bad("label key", s, labelKeyRule)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '/' || c == '-') {
			return bad("label key", s, labelKeyRule)
		}
	}
	return nil
}

// LabelValue checks a node label value; the empty value is allowed (a label
// that only marks).
func LabelValue(s string) error {
	if s == "" {
		return nil
	}
	if !edgesAlnum(s, true) {
		return bad("label value", s, labelValRule)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(isAlnum(c, true) || c == '.' || c == '_' || c == '-') {
			return bad("label value", s, labelValRule)
		}
	}
	return nil
}

// Labels checks a node's label set: at most MaxLabels, each key and value
// valid. Keys are checked in sorted order so the error is stable.
func Labels(l map[string]string) error {
	if len(l) > MaxLabels {
		return fmt.Errorf("%w labels: %d labels, at most %d", ErrInvalid, len(l), MaxLabels)
	}
	keys := make([]string, 0, len(l))
	for k := range l {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		if err := LabelKey(k); err != nil {
			return err
		}
		if err := LabelValue(l[k]); err != nil {
			return fmt.Errorf("label %q: %w", k, err)
		}
	}
	return nil
}

// EnvName checks an environment variable name as POSIX shells accept it in
// an assignment (NAME=value), so that env(1) on a node's command line
// never reads it as the command.
func EnvName(s string) error {
	if len(s) == 0 || len(s) > MaxEnvNameLen {
		return bad("environment variable name", s, envNameRule)
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z':
		case i > 0 && c >= '0' && c <= '9':
		default:
			return bad("environment variable name", s, envNameRule)
		}
	}
	return nil
}

// edgesAlnum reports whether s has 1..MaxLabelLen bytes and starts and ends
// with a letter (lowercase only unless upper) or digit.
func edgesAlnum(s string, upper bool) bool {
	return len(s) > 0 && len(s) <= MaxLabelLen && isAlnum(s[0], upper) && isAlnum(s[len(s)-1], upper)
}

func isAlnum(c byte, upper bool) bool {
	return c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || upper && c >= 'A' && c <= 'Z'
}
