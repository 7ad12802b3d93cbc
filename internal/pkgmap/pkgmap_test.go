package main

import (
	"bytes"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"unicode"
)

// root is the module root, seen from this package's folder.
const root = "../.."

// TestPackageMap fails when docs/design/packages.md is not what `make pkgmap`
// writes for the tree as it is, or when a package has no package comment.
func TestPackageMap(t *testing.T) {
	pkgs, err := list(root)
	if err != nil {
		t.Fatal(err)
	}
	want, missing := render(pkgs)
	if len(missing) > 0 {
		t.Errorf("packages without a package comment (say in a sentence what lives there): %s",
			strings.Join(missing, ", "))
	}
	path := filepath.Join(root, "docs", "design", "packages.md")
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v: run `make pkgmap`", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("docs/design/packages.md is out of date (first difference: %s): run `make pkgmap`",
			firstDiff(string(got), string(want)))
	}
}

// firstDiff names the first line where got and want differ.
func firstDiff(got, want string) string {
	g, w := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := 0; i < len(g) || i < len(w); i++ {
		var gl, wl string
		if i < len(g) {
			gl = g[i]
		}
		if i < len(w) {
			wl = w[i]
		}
		if gl != wl {
			return fmt.Sprintf("line %d is %q, the tree gives %q", i+1, gl, wl)
		}
	}
	return "none"
}

var (
	linkRE    = regexp.MustCompile(`\]\(([^)\s]+)\)`)
	codeRE    = regexp.MustCompile("`[^`]*`")
	headingRE = regexp.MustCompile(`^#{1,6} (.*)$`)
	schemeRE  = regexp.MustCompile(`^[a-z][a-z0-9+.-]*:`) // https:, mailto: are not checked
)

// TestDocLinks: every relative link in README.md and docs/**/*.md names a
// file or folder that exists and, with a #fragment, a heading of that file.
func TestDocLinks(t *testing.T) {
	files := []string{filepath.Join(root, "README.md")}
	err := filepath.WalkDir(filepath.Join(root, "docs"), func(p string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() && strings.HasSuffix(p, ".md") {
			files = append(files, p)
		}
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	anchors := map[string]map[string]bool{}
	for _, f := range files {
		for _, link := range links(t, f) {
			target, frag, _ := strings.Cut(link, "#")
			name := filepath.Clean(filepath.Join(filepath.Dir(f), target))
			if target == "" {
				name = f
			}
			show := strings.TrimPrefix(f, root+"/")
			if _, err := os.Stat(name); err != nil {
				t.Errorf("%s: link %q: no such file", show, link)
				continue
			}
			if frag == "" || !strings.HasSuffix(name, ".md") {
				continue
			}
			if anchors[name] == nil {
				anchors[name] = headings(t, name)
			}
			if !anchors[name][frag] {
				t.Errorf("%s: link %q: no such heading", show, link)
			}
		}
	}
}

// links are the relative link targets of a markdown file, outside code.
func links(t *testing.T, path string) []string {
	var out []string
	fence := false
	for _, line := range lines(t, path) {
		if strings.HasPrefix(line, "```") {
			fence = !fence
			continue
		}
		if fence {
			continue
		}
		for _, m := range linkRE.FindAllStringSubmatch(codeRE.ReplaceAllString(line, ""), -1) {
			if !schemeRE.MatchString(m[1]) {
				out = append(out, m[1])
			}
		}
	}
	return out
}

// headings are the anchors GitHub gives a markdown file's headings.
func headings(t *testing.T, path string) map[string]bool {
	seen := map[string]bool{}
	count := map[string]int{}
	fence := false
	for _, line := range lines(t, path) {
		if strings.HasPrefix(line, "```") {
			fence = !fence
		}
		m := headingRE.FindStringSubmatch(line)
		if fence || m == nil {
			continue
		}
		a := anchor(m[1])
		if n := count[a]; n > 0 {
			seen[fmt.Sprintf("%s-%d", a, n)] = true
		} else {
			seen[a] = true
		}
		count[a]++
	}
	return seen
}

// anchor is GitHub's anchor of a heading: lower case, punctuation dropped
// (but - and _), spaces as dashes.
func anchor(h string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(strings.TrimSpace(h)) {
		switch {
		case r == ' ':
			b.WriteRune('-')
		case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
			b.WriteRune(r)
		}
	}
	return b.String()
}

func lines(t *testing.T, path string) []string {
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(string(b), "\n")
}
