package roles

import (
	"slices"
)

// Compiled is a validated role with its selector parsed once, for deciders
// that ask "does this role select that node?" many times per change (every
// jump, every key push to every node). The zero Compiled selects nothing.
type Compiled struct {
	Role
	sel Selector
}

// Compile validates r and parses its selector. A role that fails Validate
// cannot be compiled: a broken role grants nothing.
func Compile(r Role) (Compiled, error) {
	sel, err := r.check()
	if err != nil {
		return Compiled{}, err
	}
	return Compiled{Role: r, sel: sel}, nil
}

// Selects reports whether the role selects a node with these labels.
func (c Compiled) Selects(labels map[string]string) bool { return c.sel.Matches(labels) }

// AllowsLogin reports whether the role allows login (or any login).
func (c Compiled) AllowsLogin(login string) bool {
	return slices.Contains(c.Logins, login) || slices.Contains(c.Logins, AnyLogin)
}

// AllowedCompiled is Allowed over compiled roles: whether any of them selects
// a node with these labels, and the union of their logins, sorted and
// deduplicated.
func AllowedCompiled(rs []Compiled, labels map[string]string) (ok bool, logins []string) {
	for _, r := range rs {
		if !r.Selects(labels) {
			continue
		}
		ok = true
		logins = append(logins, r.Logins...)
	}
	slices.Sort(logins)
	return ok, slices.Compact(logins)
}
