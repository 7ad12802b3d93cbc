// Command pkgmap writes docs/design/packages.md, the map of every package in
// the module with the first sentence of its package comment, from `go list`:
// `go run ./internal/pkgmap -o docs/design/packages.md` (make pkgmap). Its test
// fails when the checked-in map drifts from the tree or a package has no
// comment, so the map is never a hand-kept list.
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"sort"
	"strings"
)

const module = "github.com/tether-dev/tether"

// pkg is the part of `go list -json` the map uses.
type pkg struct {
	ImportPath string
	Doc        string
	GoFiles    []string
	CgoFiles   []string
}

// list runs `go list` over the module rooted at dir and returns its packages
// that have non-test Go files, sorted by import path. A package that does not
// build is listed all the same (-e): the map is about where things live.
func list(dir string) ([]pkg, error) {
	cmd := exec.Command("go", "list", "-e", "-json=ImportPath,Doc,GoFiles,CgoFiles", "./...")
	cmd.Dir = dir
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, fmt.Errorf("go list: %v: %s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p pkg
		if err := dec.Decode(&p); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			return nil, fmt.Errorf("go list output: %v", err)
		}
		if len(p.GoFiles)+len(p.CgoFiles) == 0 {
			continue // test-only (e2e): no package comment to show
		}
		pkgs = append(pkgs, p)
	}
	sort.Slice(pkgs, func(i, j int) bool { return pkgs[i].ImportPath < pkgs[j].ImportPath })
	return pkgs, nil
}

// rel is the package's folder relative to the module root ("." for the root).
func rel(importPath string) string {
	if importPath == module {
		return "."
	}
	return strings.TrimPrefix(importPath, module+"/")
}

// render is the markdown map of pkgs, grouped by top-level folder; it also
// returns the packages that have no package comment.
func render(pkgs []pkg) ([]byte, []string) {
	var b bytes.Buffer
	var missing []string
	b.WriteString("# Package map\n\n")
	b.WriteString("Every package of the module with the first sentence of its package comment. Generated from\n")
	b.WriteString("`go list` by `make pkgmap` (internal/pkgmap); do not edit: change the package comment and run\n")
	b.WriteString("`make pkgmap`. What each folder may import is in [layout.md](layout.md).\n")
	top := ""
	for _, p := range pkgs {
		r := rel(p.ImportPath)
		t, _, _ := strings.Cut(r, "/")
		if t != top {
			top = t
			fmt.Fprintf(&b, "\n## %s\n\n", t)
		}
		doc := strings.Join(strings.Fields(p.Doc), " ")
		if doc == "" {
			missing = append(missing, r)
			doc = "(no package comment)"
		}
		writeItem(&b, fmt.Sprintf("- [`%s`](../../%s): %s", r, r, doc))
	}
	return b.Bytes(), missing
}

// writeItem writes one list item wrapped at 100 columns, continuation lines
// indented so markdown keeps them in the item.
func writeItem(b *bytes.Buffer, item string) {
	const width = 100
	line := ""
	for _, w := range strings.Fields(item) {
		switch {
		case line == "":
			line = w
		case len(line)+1+len(w) > width:
			b.WriteString(line + "\n")
			line = "  " + w
		default:
			line += " " + w
		}
	}
	b.WriteString(line + "\n")
}

func main() {
	outFile := flag.String("o", "", "write the map to this file (default: standard output)")
	flag.Parse()
	pkgs, err := list(".")
	if err != nil {
		fmt.Fprintln(os.Stderr, "pkgmap:", err)
		os.Exit(1)
	}
	out, missing := render(pkgs)
	if *outFile == "" {
		_, err = os.Stdout.Write(out)
	} else {
		err = os.WriteFile(*outFile, out, 0o644)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "pkgmap:", err)
		os.Exit(1)
	}
	// The map is written all the same, so the missing ones show in it.
	if len(missing) > 0 {
		fmt.Fprintf(os.Stderr, "pkgmap: no package comment in: %s\n", strings.Join(missing, ", "))
		os.Exit(1)
	}
}
