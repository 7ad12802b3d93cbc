package edge

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadJoinFile(t *testing.T) {
	for _, tc := range []struct {
		name, body, want, err string
	}{
		{"plain", "tether://hub:7443?t=x\n", "tether://hub:7443?t=x", ""},
		{"no newline", "tether://a", "tether://a", ""},
		{"comments and blanks first", "# from tether token create\n\n  tether://b  \r\ntether://c\n", "tether://b", ""},
		{"empty", "", "", "holds no join string"},
		{"only comments", "# put it here\n\n", "", "holds no join string"},
		{"overlong line", strings.Repeat("x", 70<<10), "", "token too long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := filepath.Join(t.TempDir(), "join")
			if err := os.WriteFile(p, []byte(tc.body), 0o600); err != nil {
				t.Fatal(err)
			}
			got, err := ReadJoinFile(p)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("ReadJoinFile = %q, %v; want error with %q", got, err, tc.err)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("ReadJoinFile = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
	if _, err := ReadJoinFile(filepath.Join(t.TempDir(), "absent")); !errors.Is(err, fs.ErrNotExist) {
		t.Fatalf("missing file: %v, want fs.ErrNotExist", err)
	}
}

// FuzzParseJoinFile: any file content yields a trimmed, non-comment line or
// an error, never a panic.
func FuzzParseJoinFile(f *testing.F) {
	f.Add([]byte("tether://hub:7443?t=x\n"))       // the usual file
	f.Add([]byte("# comment\n\n tether://x \r\n")) // comments, CRLF
	f.Add([]byte{})                                // empty
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := parseJoinFile("f", b)
		if err == nil && (s == "" || s != strings.TrimSpace(s) || strings.HasPrefix(s, "#")) {
			t.Fatalf("parseJoinFile(%q) = %q", b, s)
		}
	})
}
