package main

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestFindSibling: the onboarding form is found beside the agent, else in
// PATH; a missing one is an error that says how to get it and names
// --non-interactive.
func TestFindSibling(t *testing.T) {
	beside, inPath, empty := t.TempDir(), t.TempDir(), t.TempDir()
	for _, d := range []string{beside, inPath} {
		if err := os.WriteFile(filepath.Join(d, siblingName), []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, self, path, want string
	}{
		{"beside wins", filepath.Join(beside, "tether-edge"), inPath, filepath.Join(beside, siblingName)},
		{"from PATH", filepath.Join(empty, "tether-edge"), inPath, filepath.Join(inPath, siblingName)},
		{"missing", filepath.Join(empty, "tether-edge"), empty, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("PATH", tc.path)
			got, err := findSibling(tc.self)
			if tc.want == "" {
				if !errors.Is(err, errNoSibling) {
					t.Fatalf("findSibling = %q, %v; want errNoSibling", got, err)
				}
				for _, w := range []string{"install the tether-edge package", "make build", "--non-interactive"} {
					if !strings.Contains(err.Error(), w) {
						t.Errorf("error does not say %q: %v", w, err)
					}
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("findSibling = %q, %v; want %q", got, err, tc.want)
			}
		})
	}
}
