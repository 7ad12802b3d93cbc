package validate

import (
	"path/filepath"
	"strings"
	"testing"
)

// FuzzNames checks the promises the callers rely on, for every input any
// check accepts: a login is a plain file name inside the principals
// directory and carries nothing sshd_config or a shell would read as syntax;
// node names are DNS labels that no tool reads as an address; label parts and env names carry no separator a
// selector or env(1) would split on.
func FuzzNames(f *testing.F) {
	for _, seed := range []string{
		"root", "first.last", "machine$", ".", "..", "../x", "-x", "a b", "a#b", "%u",
		"node-1", "123", "localhost", "0x7f000001", "1e3", "127-0-0-1", "tether.dev/role", "Edge_1", "", "PATH", "1A",
		"a=b", "a,b", "ü",
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if Login(s) == nil {
			if filepath.Base(s) != s || s == "." || s == ".." || strings.HasPrefix(s, ".") || strings.HasPrefix(s, "-") {
				t.Fatalf("login %q is not a plain file name", s)
			}
			if strings.ContainsAny(s, " \t\r\n#%$\"'\\`;&|<>(){}*?![]~=,:@") || len(s) > MaxLoginLen {
				t.Fatalf("login %q carries syntax", s)
			}
		}
		if NodeName(s) == nil {
			if len(s) > MaxDNSLabelLen || strings.Trim(s, "abcdefghijklmnopqrstuvwxyz0123456789-") != "" ||
				strings.HasPrefix(s, "-") || strings.HasSuffix(s, "-") || strings.Trim(s, "0123456789") == "" {
				t.Fatalf("node name %q is not a DNS label that could not be a number", s)
			}
			if is, ok := Address(s); ok {
				t.Fatalf("node name %q reads as %s", s, is)
			}
		}
		for _, ok := range []bool{LabelKey(s) == nil, LabelValue(s) == nil && s != "", EnvName(s) == nil} {
			if ok && strings.ContainsAny(s, " \t\r\n,=!()\"'\\$`;&|") {
				t.Fatalf("%q accepted with a separator", s)
			}
		}
		if err := Labels(map[string]string{s: s}); err == nil && (LabelKey(s) != nil || LabelValue(s) != nil) {
			t.Fatalf("Labels accepted %q that LabelKey or LabelValue refuse", s)
		}
	})
}
