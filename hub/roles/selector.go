package roles

import (
	"fmt"
	"slices"
	"strings"
	"unicode/utf8"

	"github.com/tether-dev/tether/internal/validate"
)

// Bounds on selector text. A selector is written by an operator and stored with
// a role, so these are generous; they exist so that a hostile or broken API
// caller cannot make every jump check parse megabytes.
const (
	MaxSelectorLen = 4096 // bytes of selector text
	MaxTerms       = 64   // comma-separated terms in one selector
	MaxSetValues   = 64   // values inside one "in (...)" or "notin (...)"
)

// op is the operator of one selector term. The order is the canonical order
// of terms on the same key in String.
type op int

const (
	opExists    op = iota // k
	opNotExists           // !k
	opEq                  // k=v, k==v
	opNotEq               // k!=v
	opIn                  // k in (a,b)
	opNotIn               // k notin (a,b)
)

// requirement is one parsed term.
type requirement struct {
	key    string
	op     op
	values []string // one value for opEq/opNotEq; sorted, deduplicated for opIn/opNotIn; nil otherwise
}

func (r requirement) String() string {
	switch r.op {
	case opExists:
		return r.key
	case opNotExists:
		return "!" + r.key
	case opEq:
		return r.key + "=" + r.values[0]
	case opNotEq:
		return r.key + "!=" + r.values[0]
	case opIn:
		return r.key + " in (" + strings.Join(r.values, ",") + ")"
	case opNotIn:
		return r.key + " notin (" + strings.Join(r.values, ",") + ")"
	}
	return fmt.Sprintf("<bad op %d>", int(r.op))
}

// matches follows Kubernetes semantics: the negative operators (!=, notin, !k)
// match a node that lacks the key; the positive ones require it.
func (r requirement) matches(labels map[string]string) bool {
	v, has := labels[r.key]
	switch r.op {
	case opExists:
		return has
	case opNotExists:
		return !has
	case opEq:
		return has && v == r.values[0]
	case opNotEq:
		return !has || v != r.values[0]
	case opIn:
		return has && slices.Contains(r.values, v)
	case opNotIn:
		return !has || !slices.Contains(r.values, v)
	}
	return false
}

func compareRequirements(a, b requirement) int {
	if c := strings.Compare(a.key, b.key); c != 0 {
		return c
	}
	if a.op != b.op {
		return int(a.op) - int(b.op)
	}
	return slices.Compare(a.values, b.values)
}

// Selector is a parsed node label selector, a subset of the Kubernetes syntax:
//
//	k=v  k==v      node has label k with value v
//	k!=v           node lacks k, or its value is not v
//	k in (a,b)     node has k with value a or b
//	k notin (a,b)  node lacks k, or its value is neither a nor b
//	k              node has label k (any value)
//	!k             node lacks label k
//
// Comma-separated terms are ANDed. The empty selector "" and "*" match every
// node. Whitespace around terms, operators, commas and parentheses is ignored.
// Values in a selector are never empty: "k=" is an error (it is almost always
// a typo, and "k!=" would match nearly every node); use "k" or "!k" to test
// for the key.
//
// The zero Selector matches no node: only ParseSelector produces a selector
// that grants anything, so a forgotten field denies rather than allows.
// Selectors are immutable and safe for concurrent use.
type Selector struct {
	parsed bool          // set by ParseSelector; false (the zero value) matches nothing
	reqs   []requirement // canonical order, no duplicates; empty means every node
}

// SelectorError describes a selector that does not parse.
type SelectorError struct {
	Role     string // the role whose Nodes this is; "" when parsed on its own
	Selector string // the selector text, as given
	Term     int    // 1-based index of the bad term; 0 if the error is about the whole selector
	TermText string // the bad term with surrounding whitespace trimmed
	Reason   string // what is wrong, e.g. `missing value after "!="`
}

func (e *SelectorError) Error() string {
	var b strings.Builder
	b.WriteString("roles: ")
	if e.Role != "" {
		fmt.Fprintf(&b, "role %q: ", e.Role)
	}
	fmt.Fprintf(&b, "selector %q: ", clip(e.Selector))
	if e.Term > 0 {
		fmt.Fprintf(&b, "term %d %q: ", e.Term, clip(e.TermText))
	}
	b.WriteString(e.Reason)
	return b.String()
}

// clip shortens s for error messages; selectors may be up to 4 KiB.
func clip(s string) string {
	const max = 80
	if len(s) <= max {
		return s
	}
	cut := max
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + "..."
}

// ParseSelector parses selector text (see Selector for the syntax). Errors are
// *SelectorError values naming the bad term and its 1-based position.
func ParseSelector(s string) (Selector, error) {
	if len(s) > MaxSelectorLen {
		return Selector{}, &SelectorError{
			Selector: s,
			Reason:   fmt.Sprintf("selector is %d bytes, at most %d", len(s), MaxSelectorLen),
		}
	}
	trimmed := strings.TrimSpace(s)
	if trimmed == "" || trimmed == "*" {
		return Selector{parsed: true}, nil
	}
	terms := splitTerms(trimmed)
	if len(terms) > MaxTerms {
		return Selector{}, &SelectorError{Selector: s, Reason: fmt.Sprintf("%d terms, at most %d", len(terms), MaxTerms)}
	}
	reqs := make([]requirement, 0, len(terms))
	for i, t := range terms {
		t = strings.TrimSpace(t)
		r, reason := parseTerm(t)
		if reason != "" {
			return Selector{}, &SelectorError{Selector: s, Term: i + 1, TermText: t, Reason: reason}
		}
		reqs = append(reqs, r)
	}
	slices.SortFunc(reqs, compareRequirements)
	reqs = slices.CompactFunc(reqs, func(a, b requirement) bool { return compareRequirements(a, b) == 0 })
	return Selector{parsed: true, reqs: reqs}, nil
}

// splitTerms splits at commas outside parentheses. It does not judge the
// parentheses: an unbalanced one ends up inside a term, and parseTerm reports
// it there with the term's position.
func splitTerms(s string) []string {
	var terms []string
	depth, start := 0, 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '(':
			depth++
		case ')':
			if depth > 0 {
				depth--
			}
		case ',':
			if depth == 0 {
				terms = append(terms, s[start:i])
				start = i + 1
			}
		}
	}
	return append(terms, s[start:])
}

// Matches reports whether a node with these labels is selected. A nil map is
// a node without labels.
func (s Selector) Matches(labels map[string]string) bool {
	if !s.parsed {
		return false
	}
	for _, r := range s.reqs {
		if !r.matches(labels) {
			return false
		}
	}
	return true
}

// PresenceKeys returns the keys of the selector's bare "k" terms (node has
// label k), in canonical order. A node name typed where a selector is
// expected ("n1", "n1,n2") parses as exactly such terms and then selects
// nothing, so callers that take a selector from a flag named like a list of
// nodes use this to refuse the mix-up instead of storing it.
func (s Selector) PresenceKeys() []string {
	var keys []string
	for _, r := range s.reqs {
		if r.op == opExists {
			keys = append(keys, r.key)
		}
	}
	return keys
}

// String returns the canonical form: terms sorted by key then operator, set
// values sorted and deduplicated, "==" written as "=", duplicate terms dropped,
// and "*" for a selector that matches every node. ParseSelector(s.String())
// returns a selector equal to s. The zero Selector, which matches nothing,
// prints as "<none>", which does not parse.
func (s Selector) String() string {
	if !s.parsed {
		return "<none>"
	}
	if len(s.reqs) == 0 {
		return "*"
	}
	parts := make([]string, len(s.reqs))
	for i, r := range s.reqs {
		parts[i] = r.String()
	}
	return strings.Join(parts, ",")
}

// Tokens of one term.
type tokKind int

const (
	tIdent  tokKind = iota // key, value, or the words in/notin
	tEq                    // = or ==
	tNotEq                 // !=
	tNot                   // !
	tLParen                // (
	tRParen                // )
	tComma                 // , (only inside parentheses; splitTerms took the others)
)

type token struct {
	kind tokKind
	text string // as written
}

// describe names a token (or the end of the term) for error messages.
func describe(toks []token, i int) string {
	if i >= len(toks) {
		return "end of term"
	}
	return fmt.Sprintf("%q", toks[i].text)
}

func isIdentByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' ||
		c == '.' || c == '_' || c == '/' || c == '-'
}

// lexTerm splits one term into tokens. The reason is non-empty on error.
func lexTerm(t string) (toks []token, reason string) {
	for i := 0; i < len(t); {
		c := t[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case isIdentByte(c):
			j := i
			for j < len(t) && isIdentByte(t[j]) {
				j++
			}
			toks = append(toks, token{tIdent, t[i:j]})
			i = j
		case c == '=':
			if strings.HasPrefix(t[i:], "==") {
				toks = append(toks, token{tEq, "=="})
				i += 2
			} else {
				toks = append(toks, token{tEq, "="})
				i++
			}
		case c == '!':
			if strings.HasPrefix(t[i:], "!=") {
				toks = append(toks, token{tNotEq, "!="})
				i += 2
			} else {
				toks = append(toks, token{tNot, "!"})
				i++
			}
		case c == '(':
			toks = append(toks, token{tLParen, "("})
			i++
		case c == ')':
			toks = append(toks, token{tRParen, ")"})
			i++
		case c == ',':
			toks = append(toks, token{tComma, ","})
			i++
		case c == '*':
			return nil, `"*" (all nodes) must be the whole selector`
		default:
			r, _ := utf8.DecodeRuneInString(t[i:])
			return nil, fmt.Sprintf("unexpected character %q", r)
		}
	}
	return toks, ""
}

func checkKey(k string) string {
	if err := validate.LabelKey(k); err != nil {
		return err.Error()
	}
	return ""
}

// checkValue: a value in a selector is never empty (see Selector), unlike a
// node's label value.
func checkValue(v string) string {
	if v == "" {
		return "empty label value: use \"k\" or \"!k\" to test for the key"
	}
	if err := validate.LabelValue(v); err != nil {
		return err.Error()
	}
	return ""
}

// parseTerm parses one trimmed term. The reason is non-empty on error.
func parseTerm(t string) (requirement, string) {
	if t == "" {
		return requirement{}, "empty term (stray comma?)"
	}
	toks, reason := lexTerm(t)
	if reason != "" {
		return requirement{}, reason
	}

	// !k
	if toks[0].kind == tNot {
		if len(toks) < 2 || toks[1].kind != tIdent {
			return requirement{}, fmt.Sprintf(`expected a label key after "!", got %s`, describe(toks, 1))
		}
		if len(toks) > 2 {
			return requirement{}, fmt.Sprintf(
				`unexpected %s after "!%s" ("!" takes only a key)`, describe(toks, 2), toks[1].text,
			)
		}
		if reason := checkKey(toks[1].text); reason != "" {
			return requirement{}, reason
		}
		return requirement{key: toks[1].text, op: opNotExists}, ""
	}

	if toks[0].kind != tIdent {
		return requirement{}, fmt.Sprintf("expected a label key, got %s", describe(toks, 0))
	}
	key := toks[0].text
	if reason := checkKey(key); reason != "" {
		return requirement{}, reason
	}
	if len(toks) == 1 {
		return requirement{key: key, op: opExists}, ""
	}

	switch next := toks[1]; {
	case next.kind == tEq || next.kind == tNotEq:
		o := opEq
		if next.kind == tNotEq {
			o = opNotEq
		}
		if len(toks) < 3 {
			return requirement{}, fmt.Sprintf("missing value after %q", next.text)
		}
		if toks[2].kind != tIdent {
			return requirement{}, fmt.Sprintf("expected a value after %q, got %s", next.text, describe(toks, 2))
		}
		if len(toks) > 3 {
			return requirement{}, fmt.Sprintf("unexpected %s after value %q", describe(toks, 3), toks[2].text)
		}
		if reason := checkValue(toks[2].text); reason != "" {
			return requirement{}, reason
		}
		return requirement{key: key, op: o, values: []string{toks[2].text}}, ""

	case next.kind == tNot:
		// "k!" is a "!=" cut short; "k!x" is a typo for it.
		if len(toks) == 2 {
			return requirement{}, `missing value after "!="`
		}
		return requirement{}, fmt.Sprintf(`unexpected "!" after key %q (want "!=")`, key)

	case next.kind == tIdent && (next.text == "in" || next.text == "notin"):
		o := opIn
		if next.text == "notin" {
			o = opNotIn
		}
		values, reason := parseSet(toks[2:], next.text)
		if reason != "" {
			return requirement{}, reason
		}
		return requirement{key: key, op: o, values: values}, ""

	default:
		return requirement{}, fmt.Sprintf(
			`unexpected %s after key %q (want "=", "!=", "in" or "notin")`, describe(toks, 1), key,
		)
	}
}

// parseSet parses "( v {, v} )" as the rest of a term after in/notin.
func parseSet(toks []token, opText string) ([]string, string) {
	if len(toks) == 0 || toks[0].kind != tLParen {
		return nil, fmt.Sprintf(`expected "(" after %q, got %s`, opText, describe(toks, 0))
	}
	var values []string
	i := 1
	for {
		if i >= len(toks) {
			return nil, `missing ")"`
		}
		if toks[i].kind != tIdent {
			if toks[i].kind == tRParen && len(values) == 0 {
				return nil, fmt.Sprintf("empty value list after %q", opText)
			}
			return nil, fmt.Sprintf("expected a value, got %s", describe(toks, i))
		}
		if reason := checkValue(toks[i].text); reason != "" {
			return nil, reason
		}
		values = append(values, toks[i].text)
		if len(values) > MaxSetValues {
			return nil, fmt.Sprintf("more than %d values in parentheses", MaxSetValues)
		}
		i++
		if i >= len(toks) {
			return nil, `missing ")"`
		}
		switch toks[i].kind {
		case tComma:
			i++
		case tRParen:
			if i+1 < len(toks) {
				return nil, fmt.Sprintf(`unexpected %s after ")"`, describe(toks, i+1))
			}
			slices.Sort(values)
			return slices.Compact(values), ""
		default:
			return nil, fmt.Sprintf(`expected "," or ")" after value %q, got %s`, toks[i-1].text, describe(toks, i))
		}
	}
}
