// Package validate is the one vocabulary of names Tether accepts: node
// names, SSH logins, label keys and values, environment variable names.
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
	"slices"
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
	loginRule    = "a user name of 1-32 characters: lowercase letters, digits, '_', '-' and '.', starting with a letter or '_'"
	dnsLabelRule = "1-63 lowercase letters, digits and inner dashes (a DNS label), not all digits"
	roleNameRule = "1-63 lowercase letters, digits and inner dashes (a DNS label)"
	labelKeyRule = "1-63 characters: lowercase letters, digits, '.', '_', '/' and '-', starting and ending with a letter or digit"
	labelValRule = "empty, or 1-63 characters: letters, digits, '.', '_' and '-', starting and ending with a letter or digit"
	envNameRule  = "letters, digits and '_', not starting with a digit"
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
// is a valid host name for ssh, and not all digits, so that a name can never
// be mistaken for an IP address or a numeric ID.
func NodeName(s string) error { return dnsLabel("name", s, false) }

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
