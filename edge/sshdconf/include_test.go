package sshdconf

import (
	"io/fs"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/testenv"
)

func TestCheckIncluded(t *testing.T) {
	// Each case gets its own directory D; "@" in file names and contents
	// stands for D. The drop-in is @/sshd_config.d/50-tether.conf unless
	// dropIn says otherwise, and the main config is @/sshd_config.
	for _, tc := range []struct {
		name   string
		files  map[string]string // name under D -> content
		dropIn string            // default @/sshd_config.d/50-tether.conf
		want   error             // nil, ErrNotIncluded, ErrShadowed, ErrInvalid, fs.ErrNotExist
		errHas string            // and in the message
	}{
		{
			name:  "debian default glob",
			files: map[string]string{"sshd_config": "Include @/sshd_config.d/*.conf\nUsePAM yes\n"},
		},
		{
			name:  "exact path",
			files: map[string]string{"sshd_config": "Include @/sshd_config.d/50-tether.conf\n"},
		},
		{
			name:  "glob after other settings, lower-case keyword",
			files: map[string]string{"sshd_config": "Port 22\n  include\t@/sshd_config.d/5?-*.conf\n"},
		},
		{
			name:  "keyword=value",
			files: map[string]string{"sshd_config": "Include=@/sshd_config.d/*.conf\n"},
		},
		{
			name:  "second argument covers it",
			files: map[string]string{"sshd_config": "Include @/other/*.conf @/sshd_config.d/*.conf # trailing comment\n"},
		},
		{
			name:   "quoted path with a blank",
			files:  map[string]string{"sshd_config": `Include "@/conf d/*.conf"` + "\n"},
			dropIn: "@/conf d/50-tether.conf",
		},
		{
			name:   "relative include is under /etc/ssh",
			files:  map[string]string{"sshd_config": "Include sshd_config.d/99-tether-test-*.conf\n"},
			dropIn: "/etc/ssh/sshd_config.d/99-tether-test-x.conf",
		},
		{
			name: "nested include",
			files: map[string]string{
				"sshd_config":   "Include @/main.d/*.conf\n",
				"main.d/a.conf": "Include @/sshd_config.d/*.conf\n",
			},
		},
		{
			name: "shadowing setting after the drop-in is harmless",
			files: map[string]string{
				"sshd_config":                 "Include @/sshd_config.d/*.conf\nTrustedUserCAKeys /etc/ssh/ca.pub\n",
				"sshd_config.d/90-later.conf": "RevokedKeys /etc/ssh/krl\n",
			},
		},
		{
			name:  "no include",
			files: map[string]string{"sshd_config": "Port 22\nUsePAM yes\n"},
			want:  ErrNotIncluded, errHas: "add `Include @/sshd_config.d/*.conf`",
		},
		{
			name:  "empty config",
			files: map[string]string{"sshd_config": ""},
			want:  ErrNotIncluded,
		},
		{
			name:  "commented include",
			files: map[string]string{"sshd_config": "#Include @/sshd_config.d/*.conf\n  # Include @/sshd_config.d/*.conf\n"},
			want:  ErrNotIncluded,
		},
		{
			name:  "other directory",
			files: map[string]string{"sshd_config": "Include @/other.d/*.conf\n"},
			want:  ErrNotIncluded,
		},
		{
			name:   "glob does not match the extension",
			files:  map[string]string{"sshd_config": "Include @/sshd_config.d/*.conf\n"},
			dropIn: "@/sshd_config.d/50-tether.cfg",
			want:   ErrNotIncluded,
		},
		{
			name:  "glob does not cross directories",
			files: map[string]string{"sshd_config": "Include @/*.conf\n"},
			want:  ErrNotIncluded,
		},
		{
			name:  "include inside a Match block",
			files: map[string]string{"sshd_config": "Match User admin\n  Include @/sshd_config.d/*.conf\n"},
			want:  ErrNotIncluded,
		},
		{
			name:  "include after Match all",
			files: map[string]string{"sshd_config": "Match all\nInclude @/sshd_config.d/*.conf\n"},
			want:  ErrNotIncluded,
		},
		{
			name:  "TrustedUserCAKeys before the include",
			files: map[string]string{"sshd_config": "TrustedUserCAKeys /etc/ssh/ca.pub\nInclude @/sshd_config.d/*.conf\n"},
			want:  ErrShadowed, errHas: "@/sshd_config:1 TrustedUserCAKeys",
		},
		{
			name: "RevokedKeys in an earlier drop-in",
			files: map[string]string{
				"sshd_config":                 "Include @/sshd_config.d/*.conf\n",
				"sshd_config.d/10-site.conf":  "revokedkeys=/etc/ssh/krl\n",
				"sshd_config.d/90-later.conf": "TrustedUserCAKeys /x\n",
			},
			want: ErrShadowed, errHas: "10-site.conf:1 revokedkeys",
		},
		{
			name:   "include loop",
			files:  map[string]string{"sshd_config": "Include @/sshd_config\n"},
			errHas: "nested deeper than 16",
		},
		{
			name:   "unterminated quote",
			files:  map[string]string{"sshd_config": `Include "@/sshd_config.d/*.conf` + "\n"},
			errHas: "sshd_config:1: unterminated quote",
		},
		{
			name:   "bad glob",
			files:  map[string]string{"sshd_config": "Include @/[\n"},
			errHas: "syntax error in pattern",
		},
		{
			name:  "missing main config",
			files: map[string]string{},
			want:  fs.ErrNotExist,
		},
		{
			name:   "relative drop-in",
			files:  map[string]string{"sshd_config": "Include @/sshd_config.d/*.conf\n"},
			dropIn: "sshd_config.d/50-tether.conf",
			want:   ErrInvalid,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			at := func(s string) string { return strings.ReplaceAll(s, "@", dir) }
			for name, content := range tc.files {
				testenv.WriteFile(t, filepath.Join(dir, name), []byte(at(content)), 0o644)
			}
			dropIn := at(cmpOr(tc.dropIn, "@/sshd_config.d/50-tether.conf"))

			err := CheckIncluded(filepath.Join(dir, "sshd_config"), dropIn)
			switch {
			case tc.want == nil && tc.errHas == "":
				if err != nil {
					t.Fatalf("CheckIncluded: %v", err)
				}
				return
			case tc.want != nil:
				errorsIs(t, err, tc.want)
			case err == nil:
				t.Fatalf("CheckIncluded: no error, want %q", tc.errHas)
			}
			if !strings.Contains(err.Error(), at(tc.errHas)) {
				t.Errorf("error %q does not say %q", err, at(tc.errHas))
			}
		})
	}
}

func cmpOr(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func TestSplitConfigLine(t *testing.T) {
	for _, tc := range []struct {
		line string
		want []string
	}{
		{"", nil},
		{"   ", nil},
		{"# comment", nil},
		{"\t# indented comment", nil},
		{"UsePAM", []string{"UsePAM"}},
		{"UsePAM yes", []string{"UsePAM", "yes"}},
		{"  Include\t/a/*.conf   /b ", []string{"Include", "/a/*.conf", "/b"}},
		{"Include=/a", []string{"Include", "/a"}},
		{"Include = /a", []string{"Include", "/a"}},
		{`Include "/a b/*.conf" '/c d'`, []string{"Include", "/a b/*.conf", "/c d"}},
		{`Include /a\ b "/c\"d" /e\f`, []string{"Include", "/a b", `/c"d`, `/e\f`}},
		{"Include /a #/b", []string{"Include", "/a"}},
		{"Include /a#b", []string{"Include", "/a#b"}},
		{`Include "#x"`, []string{"Include", "#x"}},
		{`Include ""`, []string{"Include", ""}},
	} {
		got, err := splitConfigLine(tc.line)
		if err != nil {
			t.Errorf("%q: %v", tc.line, err)
			continue
		}
		if !slices.Equal(got, tc.want) {
			t.Errorf("%q: got %q, want %q", tc.line, got, tc.want)
		}
	}
	for _, line := range []string{`Include "/a`, `Include '/a`, `Include "/a\"`} {
		if got, err := splitConfigLine(line); err == nil {
			t.Errorf("%q: got %q, want an unterminated quote error", line, got)
		}
	}
}

// FuzzSplitConfigLine checks that the sshd_config line splitter never
// panics and that what it returns is well formed.
func FuzzSplitConfigLine(f *testing.F) {
	for _, seed := range []string{
		"Include /etc/ssh/sshd_config.d/*.conf", // Debian's default
		`Include "/a b/*.conf" '/c'`,            // both quote kinds
		`Include /a\ b "\"" \\`,                 // escapes
		"Include=/a #comment",                   // keyword=value, trailing comment
		"=",                                     // empty keyword
		`"`,                                     // lone quote
		"\t \t",                                 // blanks only
		"Match User x",                          // a block opener
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, line string) {
		args, err := splitConfigLine(line)
		if err != nil {
			return
		}
		if len(args) > 0 && strings.ContainsAny(args[0], " \t=") {
			t.Errorf("%q: keyword %q holds a separator", line, args[0])
		}
		if len(args) == 0 && strings.TrimSpace(line) != "" && strings.TrimSpace(line)[0] != '#' {
			t.Errorf("%q: no words from a non-comment line", line)
		}
	})
}
