package sshdconf

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/testenv"
)

// TestApplySkipsBadPrincipals: a login or principal Apply cannot write is
// left out, and everything else — above all the revoked keys and the
// drop-in — is still written.
func TestApplySkipsBadPrincipals(t *testing.T) {
	for _, tc := range []struct {
		name       string
		principals map[string][]string
		skipped    []string // in the error, one per login left out
		files      []string // principals files written
	}{
		{"all valid", map[string][]string{"root": {"tether:ops:root"}, "first.last": {"p"}}, nil,
			[]string{"first.last", "root"}},
		{"trailing dollar", map[string][]string{"root": {"p"}, "machine$": {"p"}}, []string{`"machine$"`}, []string{"root"}},
		{"dot dot", map[string][]string{"..": {"p"}, "root": {"p"}}, []string{`".."`}, []string{"root"}},
		{"slash", map[string][]string{"../../etc/passwd": {"p"}}, []string{`"../../etc/passwd"`}, nil},
		{"blank principal", map[string][]string{"root": {"a b"}, "ubuntu": {"p"}},
			[]string{`login "root" skipped: principal "a b"`}, []string{"ubuntu"}},
		{"empty principal", map[string][]string{"root": {""}}, []string{`login "root" skipped`}, nil},
		{"hash principal", map[string][]string{"root": {"#x"}}, []string{`"#x"`}, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := applyEnv(t)
			f := e.files(testenv.NewKey(t).Pub())
			f.Principals = tc.principals
			changed, err := Apply(e.paths, f)
			if !changed {
				t.Error("first Apply reported no change")
			}
			if tc.skipped == nil && err != nil {
				t.Fatalf("Apply: %v", err)
			}
			if tc.skipped != nil {
				if !errors.Is(err, ErrSkipped) || errors.Is(err, ErrInvalid) {
					t.Fatalf("Apply = %v, want ErrSkipped and not ErrInvalid", err)
				}
				for _, s := range tc.skipped {
					if !strings.Contains(err.Error(), s) {
						t.Errorf("Apply error %q does not say %q", err, s)
					}
				}
			}
			if got := readString(t, e.paths.RevokedKeysPath()); got == "" {
				t.Error("revoked keys not written")
			}
			if got := readString(t, e.paths.DropIn); !strings.Contains(
				got, "AuthorizedPrincipalsFile "+filepath.Join(e.paths.PrincipalsDir(), "%u"),
			) {
				t.Errorf("drop-in without AuthorizedPrincipalsFile:\n%s", got)
			}
			entries, err := os.ReadDir(e.paths.PrincipalsDir())
			if err != nil {
				t.Fatal(err)
			}
			var names []string
			for _, en := range entries {
				names = append(names, en.Name())
			}
			if !slices.Equal(names, tc.files) {
				t.Errorf("principals files %q, want %q", names, tc.files)
			}
			if _, err := os.Stat(filepath.Join(e.dir, "etc", "passwd")); !errors.Is(err, os.ErrNotExist) {
				t.Errorf("a login wrote outside the principals directory: %v", err)
			}
		})
	}
}
