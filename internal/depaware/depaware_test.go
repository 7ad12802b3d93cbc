package depaware

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestRenderParseDiff: a rendered list reads back as the same packages, and
// diff names exactly what was added and removed.
func TestRenderParseDiff(t *testing.T) {
	pkgs := []string{"example.com/a", "example.com/b", "example.org/c/d"}
	if got := parse(render("tether", "", pkgs)); !slices.Equal(got, pkgs) {
		t.Fatalf("round trip: %q, want %q", got, pkgs)
	}
	for _, tc := range []struct {
		listed, got, added, removed []string
	}{
		{pkgs, pkgs, nil, nil},
		{pkgs, append(slices.Clone(pkgs), "example.net/new"), []string{"example.net/new"}, nil},
		{pkgs, pkgs[1:], nil, []string{"example.com/a"}},
		{nil, []string{"x/y"}, []string{"x/y"}, nil},
	} {
		added, removed := diff(tc.listed, tc.got)
		if !slices.Equal(added, tc.added) || !slices.Equal(removed, tc.removed) {
			t.Errorf("diff(%q, %q) = +%q -%q, want +%q -%q", tc.listed, tc.got, added, removed, tc.added, tc.removed)
		}
	}
}

// TestMakefileVar: the tags come from the Makefile's `NAME ?= value` line
// at the module root, from any directory below it.
func TestMakefileVar(t *testing.T) {
	root := t.TempDir()
	sub := filepath.Join(root, "cmd", "x")
	if err := os.MkdirAll(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(root, "go.mod"), []byte("module m\n"), 0o644)
	os.WriteFile(filepath.Join(root, "Makefile"),
		[]byte("EDGE_TAGS_X ?= no\nEDGE_TAGS ?= nethttpomithttp2 noform\nFORM_TAGS ?=\n"), 0o644)
	for name, want := range map[string]string{"EDGE_TAGS": "nethttpomithttp2 noform", "FORM_TAGS": ""} {
		if got, err := makefileVar(sub, name); err != nil || got != want {
			t.Errorf("makefileVar(%s) = %q, %v; want %q", name, got, err, want)
		}
	}
	if _, err := makefileVar(sub, "MISSING"); err == nil {
		t.Error("a variable the Makefile does not set: no error")
	}
}
