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

// TestNoJoinString: the error of an agent with neither identity nor join
// string names the state dir and the places a join string is read from,
// and gives the commands that fix it, ending with the restart of its
// systemd unit when it runs in one.
func TestNoJoinString(t *testing.T) {
	for _, tc := range []struct {
		name, joinFile, unit string
		want                 []string
	}{
		{"systemd", "/etc/tether-edge/join", "tether-edge.service", []string{
			"has not joined a hub yet (no node.json in /srv/st)",
			"(--join, TETHER_JOIN, or a line in /etc/tether-edge/join)",
			"`tether token create`",
			"\n  install -D -m 0600 /dev/null /etc/tether-edge/join\n",
			"\n  echo 'JOIN_STRING' > /etc/tether-edge/join\n",
			"\n  systemctl restart tether-edge.service",
		}},
		{"no service manager", "/tmp/j", "", []string{
			"(--join, TETHER_JOIN, or a line in /tmp/j)",
			"\n  echo 'JOIN_STRING' > /tmp/j\n",
			"\nthen run this command again",
		}},
		{"no join file", "", "", []string{
			"no join string was given (--join, TETHER_JOIN)",
			"`tether token create` and give it with --join or TETHER_JOIN",
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := NoJoinString("/srv/st", tc.joinFile, tc.unit)
			if !errors.Is(err, ErrNotJoined) || !errors.Is(err, ErrNoJoinString) {
				t.Fatalf("%v: does not match ErrNotJoined and ErrNoJoinString", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error lacks %q:\n%s", w, err)
				}
			}
		})
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
