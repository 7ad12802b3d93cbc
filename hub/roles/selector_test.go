package roles

import (
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
)

func TestParseSelector(t *testing.T) {
	tests := []struct {
		in   string
		want string // canonical String()
	}{
		{"", "*"},
		{"   ", "*"},
		{"*", "*"},
		{" * ", "*"},
		{"site=lab", "site=lab"},
		{"site==lab", "site=lab"},
		{"site = lab", "site=lab"},
		{"env!=prod", "env!=prod"},
		{"env != prod", "env!=prod"},
		{"arch", "arch"},
		{"!gpu", "!gpu"},
		{"! gpu", "!gpu"},
		{"site in (lab,edge)", "site in (edge,lab)"},
		{"site in(lab)", "site in (lab)"},
		{" site  in  ( lab , edge , lab ) ", "site in (edge,lab)"},
		{"site notin (lab)", "site notin (lab)"},
		{"site=lab,env!=prod", "env!=prod,site=lab"},
		{"z,y=1,!x,a in (b)", "a in (b),!x,y=1,z"},
		{"site=lab,site=lab", "site=lab"},
		{"k=v,k!=v", "k=v,k!=v"}, // contradictory is fine: matches nothing
		{"k notin (b),k in (a),k!=c,k=d,!k,k", "k,!k,k=d,k!=c,k in (a),k notin (b)"},
		{"topology.example.com/zone=eu-1", "topology.example.com/zone=eu-1"},
		{"in=in", "in=in"},
		{"in in (in,notin)", "in in (in,notin)"},
		{"notin", "notin"},
		{"ver=V1.2_rc-3", "ver=V1.2_rc-3"},
		{"a=b,\tc=d\n", "a=b,c=d"},
	}
	for _, tt := range tests {
		s, err := ParseSelector(tt.in)
		if err != nil {
			t.Errorf("ParseSelector(%q): %v", tt.in, err)
			continue
		}
		if got := s.String(); got != tt.want {
			t.Errorf("ParseSelector(%q).String() = %q, want %q", tt.in, got, tt.want)
		}
		again, err := ParseSelector(s.String())
		if err != nil {
			t.Errorf("re-parse %q: %v", s.String(), err)
			continue
		}
		if !reflect.DeepEqual(again, s) {
			t.Errorf("re-parse of %q = %#v, want %#v", s.String(), again, s)
		}
	}
}

func TestParseSelectorErrors(t *testing.T) {
	tests := []struct {
		in   string
		term int      // expected SelectorError.Term
		want []string // substrings of the error
	}{
		{"site=lab,env!", 2, []string{`selector "site=lab,env!": term 2 "env!": missing value after "!="`}},
		{"env!=", 1, []string{`missing value after "!="`}},
		{"env=", 1, []string{`missing value after "="`}},
		{"env==", 1, []string{`missing value after "=="`}},
		{"env!x", 1, []string{`unexpected "!" after key "env"`}},
		{"env===x", 1, []string{`expected a value after "==", got "="`}},
		{"env=a=b", 1, []string{`unexpected "=" after value "a"`}},
		{"env=a b", 1, []string{`unexpected "b" after value "a"`}},
		{"a b", 1, []string{`unexpected "b" after key "a"`, `"in" or "notin"`}},
		{"k IN (a)", 1, []string{`unexpected "IN" after key "k"`}},
		{"a=b,,c", 2, []string{"empty term"}},
		{"a=b,", 2, []string{"empty term"}},
		{",a=b", 1, []string{"empty term"}},
		{"a=b, ,c", 2, []string{"empty term"}},
		{"*,a=b", 1, []string{`"*" (all nodes) must be the whole selector`}},
		{"a=*", 1, []string{`"*"`}},
		{"a=b;c=d", 1, []string{`unexpected character ';'`}},
		{"a=\"b\"", 1, []string{`unexpected character '"'`}},
		{"a=é", 1, []string{`unexpected character 'é'`}},
		{"Site=lab", 1, []string{`invalid label key "Site"`}},
		{"-site=lab", 1, []string{`invalid label key "-site"`}},
		{"site/=lab", 1, []string{`invalid label key "site/"`}},
		{strings.Repeat("k", 64) + "=v", 1, []string{"invalid label key", "1-63 characters"}},
		{"site=-lab", 1, []string{`invalid label value "-lab"`}},
		{"site=a/b", 1, []string{`invalid label value "a/b"`}},
		{"site=" + strings.Repeat("v", 64), 1, []string{"invalid label value"}},
		{"!", 1, []string{`expected a label key after "!", got end of term`}},
		{"!!k", 1, []string{`expected a label key after "!", got "!"`}},
		{"!k=v", 1, []string{`unexpected "=" after "!k"`}},
		{"!Key", 1, []string{`invalid label key "Key"`}},
		{"=v", 1, []string{`expected a label key, got "="`}},
		{"(a)", 1, []string{`expected a label key, got "("`}},
		{"k in", 1, []string{`expected "(" after "in", got end of term`}},
		{"k notin a", 1, []string{`expected "(" after "notin", got "a"`}},
		{"k in ()", 1, []string{`empty value list after "in"`}},
		{"k in (a,)", 1, []string{`expected a value, got ")"`}},
		{"k in (,a)", 1, []string{`expected a value, got ","`}},
		{"k in (a b)", 1, []string{`expected "," or ")" after value "a", got "b"`}},
		{"k in (a", 1, []string{`missing ")"`}},
		{"k in (a,", 1, []string{`missing ")"`}},
		{"x=y,k in (a,b", 2, []string{`term 2 "k in (a,b"`, `missing ")"`}},
		{"k in (a),x=y,k notin (b", 3, []string{`missing ")"`}},
		{"k in ((a))", 1, []string{`expected a value, got "("`}},
		{"k in (a)(b)", 1, []string{`unexpected "(" after ")"`}},
		{"k in (a) x", 1, []string{`unexpected "x" after ")"`}},
		{"a=b)", 1, []string{`unexpected ")" after value "b"`}},
		{"k in (Bad/v)", 1, []string{`invalid label value "Bad/v"`}},
		{"k=(a)", 1, []string{`expected a value after "=", got "("`}},
	}
	for _, tt := range tests {
		_, err := ParseSelector(tt.in)
		if err == nil {
			t.Errorf("ParseSelector(%q): no error", tt.in)
			continue
		}
		var se *SelectorError
		if !errors.As(err, &se) {
			t.Errorf("ParseSelector(%q): error %T, want *SelectorError", tt.in, err)
			continue
		}
		if se.Term != tt.term {
			t.Errorf("ParseSelector(%q): Term = %d, want %d (%v)", tt.in, se.Term, tt.term, err)
		}
		msg := err.Error()
		if !strings.HasPrefix(msg, "roles: selector ") {
			t.Errorf("ParseSelector(%q): error %q lacks the package prefix", tt.in, msg)
		}
		for _, w := range tt.want {
			if !strings.Contains(msg, w) {
				t.Errorf("ParseSelector(%q): error %q does not contain %q", tt.in, msg, w)
			}
		}
	}
}

func TestParseSelectorBounds(t *testing.T) {
	terms := func(n int) string {
		parts := make([]string, n)
		for i := range parts {
			parts[i] = "k" + strings.Repeat("x", i%10) + "=v"
		}
		return strings.Join(parts, ",")
	}
	if _, err := ParseSelector(terms(MaxTerms)); err != nil {
		t.Errorf("%d terms: %v", MaxTerms, err)
	}
	_, err := ParseSelector(terms(MaxTerms + 1))
	if err == nil || !strings.Contains(err.Error(), "65 terms, at most 64") {
		t.Errorf("%d terms: err = %v", MaxTerms+1, err)
	}

	long := "k=" + strings.Repeat("v", 60) + strings.Repeat(" ", MaxSelectorLen)
	_, err = ParseSelector(long)
	if err == nil || !strings.Contains(err.Error(), "bytes, at most 4096") {
		t.Errorf("long selector: err = %v", err)
	}
	if err != nil && len(err.Error()) > 200 {
		t.Errorf("long selector: error is %d bytes, want the selector clipped: %q", len(err.Error()), err)
	}

	vals := func(n int) string {
		v := make([]string, n)
		for i := range v {
			v[i] = fmt.Sprintf("v%d", i)
		}
		return "k in (" + strings.Join(v, ",") + ")"
	}
	if _, err := ParseSelector(vals(MaxSetValues)); err != nil {
		t.Errorf("%d set values: %v", MaxSetValues, err)
	}
	if _, err := ParseSelector(vals(MaxSetValues + 1)); err == nil ||
		!strings.Contains(err.Error(), "more than 64 values") {
		t.Errorf("%d set values: err = %v", MaxSetValues+1, err)
	}
}

func TestSelectorMatches(t *testing.T) {
	node := map[string]string{"site": "lab", "env": "prod", "arch": "arm64", "empty": ""}
	tests := []struct {
		sel    string
		labels map[string]string
		want   bool
	}{
		{"", node, true},
		{"", nil, true},
		{"*", nil, true},
		{"site=lab", node, true},
		{"site==lab", node, true},
		{"site=edge", node, false},
		{"site=lab", nil, false},
		{"env!=dev", node, true},
		{"env!=prod", node, false},
		{"zone!=eu", node, true}, // missing key: != matches, as in Kubernetes
		{"zone!=eu", nil, true},
		{"site in (lab,edge)", node, true},
		{"site in (edge,dc)", node, false},
		{"zone in (eu)", node, false}, // missing key: in does not match
		{"site notin (edge)", node, true},
		{"site notin (lab,edge)", node, false},
		{"zone notin (eu)", node, true}, // missing key: notin matches
		{"arch", node, true},
		{"gpu", node, false},
		{"empty", node, true}, // exists with an empty value
		{"!gpu", node, true},
		{"!arch", node, false},
		{"!empty", node, false},
		{"empty!=x", node, true},
		{"empty notin (x)", node, true},
		{"empty in (x)", node, false},
		{"site=lab,env=prod,arch", node, true},
		{"site=lab,env=dev", node, false},
		{"site=lab,!gpu,zone!=eu,arch in (arm64,amd64)", node, true},
		{"site=lab,arch notin (arm64)", node, false},
		{"k=v,k!=v", map[string]string{"k": "v"}, false},
		{"site=Lab", node, false}, // values are case-sensitive
	}
	for _, tt := range tests {
		s, err := ParseSelector(tt.sel)
		if err != nil {
			t.Errorf("ParseSelector(%q): %v", tt.sel, err)
			continue
		}
		if got := s.Matches(tt.labels); got != tt.want {
			t.Errorf("ParseSelector(%q).Matches(%v) = %v, want %v", tt.sel, tt.labels, got, tt.want)
		}
		// The canonical form selects the same nodes.
		c, err := ParseSelector(s.String())
		if err != nil {
			t.Fatalf("re-parse %q: %v", s.String(), err)
		}
		if got := c.Matches(tt.labels); got != tt.want {
			t.Errorf("canonical %q .Matches(%v) = %v, want %v", c.String(), tt.labels, got, tt.want)
		}
	}
}

func TestZeroSelectorMatchesNothing(t *testing.T) {
	var s Selector
	if s.Matches(nil) || s.Matches(map[string]string{"a": "b"}) {
		t.Error("zero Selector matched a node")
	}
	if got := s.String(); got != "<none>" {
		t.Errorf("zero Selector String() = %q, want <none>", got)
	}
	if _, err := ParseSelector(s.String()); err == nil {
		t.Error(`ParseSelector("<none>") succeeded`)
	}
}

func TestSelectorPresenceKeys(t *testing.T) {
	tests := []struct {
		sel  string
		want []string
	}{
		{"*", nil},
		{"", nil},
		{"site=lab", nil},
		{"!gpu", nil},
		{"env!=prod,site in (lab)", nil},
		{"n1", []string{"n1"}},
		{"n2,n1", []string{"n1", "n2"}},
		{"site=lab,gpu", []string{"gpu"}},
		{"n1,n1", []string{"n1"}},
	}
	for _, tt := range tests {
		s, err := ParseSelector(tt.sel)
		if err != nil {
			t.Fatalf("ParseSelector(%q): %v", tt.sel, err)
		}
		if got := s.PresenceKeys(); !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParseSelector(%q).PresenceKeys() = %q, want %q", tt.sel, got, tt.want)
		}
	}
}
