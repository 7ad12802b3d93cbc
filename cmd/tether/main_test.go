package main

import (
	"context"
	"io"
	"path/filepath"
	"strings"
	"testing"
)

// TestUsageErrorsExit2: every mistake in the command line (unknown command
// or flag, a flag value that does not parse or is out of range, a missing or
// extra argument, a required flag left out) ends with exitUsage; a command
// that ran and failed (no hub) ends with 1, and help with 0.
func TestUsageErrorsExit2(t *testing.T) {
	noHub := []string{"--data-dir", filepath.Join(t.TempDir(), "none"), "--wait", "0"}
	for _, tc := range []struct {
		args []string
		want int
	}{
		{[]string{"bogus"}, exitUsage},
		{[]string{"rol"}, exitUsage},
		{[]string{"--bogus"}, exitUsage},
		{[]string{"role", "crate"}, exitUsage},
		{[]string{"nodes", "bogus"}, exitUsage},
		{[]string{"completion", "bogus"}, exitUsage},
		{[]string{"run", "--bogus", "-l", "*", "--", "true"}, exitUsage},
		{[]string{"run", "--parallel", "abc", "-l", "*", "--", "true"}, exitUsage},
		{[]string{"run", "--nodes"}, exitUsage},
		{[]string{"token", "create", "--ttl", "soon"}, exitUsage},
		{[]string{"nodes", "rm"}, exitUsage},
		{[]string{"nodes", "label", "n1"}, exitUsage},
		{[]string{"jobs", "show"}, exitUsage},
		{[]string{"jobs", "cancel", "j1", "j2"}, exitUsage},
		{[]string{"nodes", "-o", "yaml"}, exitUsage},
		{[]string{"role", "create", "r", "-l", "*"}, exitUsage},
		{[]string{"role", "create", "r", "--logins", "root"}, exitUsage},
		{[]string{"role", "create", "r", "--logins", "root", "--nodes", "n1"}, exitUsage},
		{append([]string{"nodes"}, noHub...), 1},
		{append([]string{"nodes", "rm", "n1", "n2"}, noHub...), 1},
		{append([]string{"role", "create", "r", "--logins", "root", "-l", "site=lab"}, noHub...), 1},
		{[]string{}, 0},
		{[]string{"role"}, 0},
		{[]string{"nodes", "rm", "--help"}, 0},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			root := newRoot()
			root.SetArgs(tc.args)
			root.SetOut(io.Discard)
			root.SetErr(io.Discard)
			code := 0
			err := root.ExecuteContext(context.Background())
			if err != nil {
				code = exitCode(err)
			}
			if code != tc.want {
				t.Errorf("tether %s: exit %d (%v), want %d", strings.Join(tc.args, " "), code, err, tc.want)
			}
		})
	}
}

// TestRoleSelector: role create takes its nodes as a label selector from
// -l/--selector; --nodes, its old name, is refused when it holds a bare name,
// which would select nodes carrying a label of that name.
func TestRoleSelector(t *testing.T) {
	for _, tc := range []struct {
		name                  string
		selector, nodes       string
		selectorSet, nodesSet bool
		want                  string
		err                   string // substring of the error; "" for none
	}{
		{"selector", "site=lab,env!=prod", "", true, false, "site=lab,env!=prod", ""},
		{"every node", "*", "", true, false, "*", ""},
		{"label presence through -l", "gpu", "", true, false, "gpu", ""},
		{"old name with a selector", "", "site=lab", false, true, "site=lab", ""},
		{"old name with every node", "", "*", false, true, "*", ""},
		{"old name with a node name", "", "n1", false, true, "", `--nodes "n1": a role selects nodes by label, not by name`},
		{"old name with node names", "", "n1,n2", false, true, "", "use -l/--selector"},
		{"old name mixing", "", "site=lab,n1", false, true, "", "label named n1"},
		{"both", "site=lab", "site=lab", true, true, "", "-l/--selector only"},
		{"neither", "", "", false, false, "", "no nodes given"},
		{"empty", "", "", true, false, "", "-l/--selector is empty"},
		{"blank old name", "", " ", false, true, "", "--nodes is empty"},
		{"not a selector", "site=lab env=dev", "", true, false, "", "-l/--selector: roles: selector"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := roleSelector(tc.selector, tc.nodes, tc.selectorSet, tc.nodesSet)
			switch {
			case tc.err == "" && err != nil:
				t.Fatalf("error %v, want selector %q", err, tc.want)
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("got %q, %v; want an error saying %q", got, err, tc.err)
			case tc.err != "" && exitCode(err) != exitUsage:
				t.Fatalf("error %v exits %d, want %d", err, exitCode(err), exitUsage)
			case got != tc.want:
				t.Fatalf("selector %q, want %q", got, tc.want)
			}
		})
	}
}
