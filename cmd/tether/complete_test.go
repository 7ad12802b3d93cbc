package main

import (
	"bytes"
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

// TestNodeCompletionWired: every argument and flag that names nodes is
// completed from the hub, so with no hub to ask the shell is told to offer
// no node and no file names (directive 4, or 6 for a comma list) rather
// than the files of the working directory (0, cobra's default for what has
// no completion).
func TestNodeCompletionWired(t *testing.T) {
	noHub := []string{"--data-dir", filepath.Join(t.TempDir(), "none"), "--wait", "0"}
	for _, tc := range []struct {
		command, rest []string // rest ends with the word being completed
		directive     string
	}{
		{[]string{"nodes", "rm"}, []string{""}, ":4"},
		{[]string{"run"}, []string{"--nodes", "n1,"}, ":6"},
		{[]string{"cluster", "register"}, []string{""}, ":4"},
		{[]string{"cluster", "register"}, []string{"n1", ""}, ":4"},
		{[]string{"cluster", "deregister"}, []string{""}, ":4"},
		{[]string{"service", "connect"}, []string{"db", "--from", ""}, ":4"},
		{[]string{"service", "disconnect"}, []string{"db", "--from", ""}, ":4"},
		{[]string{"upgrade", "confirm"}, []string{"u1", "--node", ""}, ":4"},
		{[]string{"upgrade", "create"}, []string{"u1", "--nodes", ""}, ":6"},
		{[]string{"kubeone", "create"}, []string{"k", "--control-plane", ""}, ":6"},
		{[]string{"kubeone", "create"}, []string{"k", "--workers", "n1,"}, ":6"},
		{[]string{"kubeone", "members"}, []string{"k", "--control-plane", "n1,n"}, ":6"},
		{[]string{"kubeone", "members"}, []string{"k", "--workers", ""}, ":6"},
	} {
		args := append(append(append([]string{"__complete"}, tc.command...), noHub...), tc.rest...)
		t.Run(strings.Join(append(tc.command, tc.rest...), " "), func(t *testing.T) {
			var out bytes.Buffer
			root := newRoot()
			root.SetArgs(args)
			root.SetOut(&out)
			root.SetErr(io.Discard)
			if err := root.ExecuteContext(context.Background()); err != nil {
				t.Fatalf("tether %q: %v", args, err)
			}
			lines := strings.Split(strings.TrimSpace(out.String()), "\n")
			for _, w := range lines[:len(lines)-1] {
				// Cobra offers the required flags not yet given beside a
				// positional argument; anything else is a name.
				if !strings.HasPrefix(w, "-") {
					t.Errorf("tether %q offers %q with no hub to ask", args, w)
				}
			}
			if got := lines[len(lines)-1]; got != tc.directive {
				t.Errorf("tether %q: directive %s, want %s", args, got, tc.directive)
			}
		})
	}
}
