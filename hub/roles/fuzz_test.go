package roles

import (
	"reflect"
	"testing"
)

// FuzzParseSelector checks that ParseSelector never panics, that whatever
// parses has a canonical String() that parses back to an equal selector (and
// so prints the same again), and that both select the same sample nodes.
func FuzzParseSelector(f *testing.F) {
	seeds := []string{
		"",                               // every node
		"*",                              // every node, spelled out
		"site=lab",                       // equality
		"site==lab",                      // equality, doubled
		"env!=prod",                      // inequality; matches nodes without env
		"arch in (arm64, armv7)",         // set, with spaces
		"arch notin (amd64)",             // negated set
		"gpu",                            // exists
		"!gpu",                           // does not exist
		"z=1,a=2,a in (c,b,c),!m",        // needs sorting and deduplication
		"topology.example.com/zone=eu-1", // key with dots and a slash
		"in in (in,notin)",               // keywords as key and values
		"site=lab,env!",                  // "!=" cut short
		"k in (a",                        // unclosed set
		"k in ((a))",                     // nested parentheses
		"a=b,,c",                         // empty term
		"*,a=b",                          // "*" not alone
		"a=\xff",                         // invalid UTF-8
		" \t site \n = \r lab , ! gpu ",  // assorted whitespace
		"k in (a)(b)",                    // two sets
		"!k=v",                           // "!" with a value
		"A=b",                            // uppercase key
		"a=B.c_d-E",                      // value with every allowed punctuation
		"k in (a,),x",                    // trailing comma in a set
		")(,)(",                          // stray parentheses
		"a/b/c=d",                        // many slashes
		"-a=b",                           // key starting with a dash
	}
	for _, s := range seeds {
		f.Add(s)
	}
	samples := []map[string]string{
		nil,
		{"site": "lab"},
		{"site": "lab", "env": "prod", "gpu": ""},
		{"a": "b", "k": "a", "in": "in", "arch": "arm64", "z": "1"},
	}
	f.Fuzz(func(t *testing.T, in string) {
		s, err := ParseSelector(in)
		if err != nil {
			if err.Error() == "" {
				t.Fatalf("ParseSelector(%q): empty error", in)
			}
			return
		}
		str := s.String()
		s2, err := ParseSelector(str)
		if err != nil {
			t.Fatalf("ParseSelector(%q) ok, but its String() %q does not parse: %v", in, str, err)
		}
		if !reflect.DeepEqual(s, s2) {
			t.Fatalf("ParseSelector(%q): %#v; re-parsed from %q: %#v", in, s, str, s2)
		}
		if str2 := s2.String(); str2 != str {
			t.Fatalf("ParseSelector(%q): String() %q, then %q", in, str, str2)
		}
		for _, l := range samples {
			if s.Matches(l) != s2.Matches(l) {
				t.Fatalf("ParseSelector(%q) and %q disagree on %v", in, str, l)
			}
		}
	})
}
