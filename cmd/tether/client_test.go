package main

import (
	"strings"
	"testing"

	"github.com/spf13/cobra"
)

// TestConnectionFlagsOnEveryCommand: every command that talks to the hub
// API takes the same connection flags, and no help names a flag that does
// not exist.
func TestConnectionFlagsOnEveryCommand(t *testing.T) {
	// hub serves rather than connects; login has its own (--ca-pin) trust;
	// ca rotate-ssh edits and ca pin reads the data dir's files offline.
	skip := map[string]bool{"tether hub": true, "tether login": true, "tether ca rotate-ssh": true, "tether ca pin": true}
	var walk func(c *cobra.Command)
	n := 0
	walk = func(c *cobra.Command) {
		for _, sub := range c.Commands() {
			walk(sub)
		}
		if c.Flags().Lookup("data-dir") == nil || skip[c.CommandPath()] {
			return
		}
		n++
		for _, name := range []string{"data-dir", "hub", "identity", "ca", "wait"} {
			if c.Flags().Lookup(name) == nil {
				t.Errorf("%s has --data-dir but no --%s", c.CommandPath(), name)
			}
		}
		if u := c.Flags().FlagUsages(); strings.Contains(u, "--api-token") {
			t.Errorf("%s help names --api-token, which does not exist:\n%s", c.CommandPath(), u)
		}
	}
	walk(newRoot())
	if n < 10 {
		t.Fatalf("only %d commands with connection flags found", n)
	}
}
