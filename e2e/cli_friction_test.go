package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

// TestCLIUsageExitStatus: both binaries end a command-line mistake (unknown
// command or flag, a flag value that does not parse, a missing or extra
// argument) with status 2, apart from a command that ran and failed (1).
func TestCLIUsageExitStatus(t *testing.T) {
	tether, edge := filepath.Join(binDir, "tether"), filepath.Join(binDir, "tether-edge")
	noHub := filepath.Join(t.TempDir(), "no-hub")
	for _, tc := range []struct {
		bin  string
		args []string
		want int
	}{
		{tether, []string{"run", "--bogus", "-l", "*", "--", "true"}, 2},
		{tether, []string{"run", "--parallel", "many", "-l", "*", "--", "true"}, 2},
		{tether, []string{"nodes", "rm"}, 2},
		{tether, []string{"role", "crate"}, 2},
		{tether, []string{"bogus"}, 2},
		{tether, []string{"role", "create", "r", "--logins", "root"}, 2},
		{tether, []string{"nodes", "--data-dir", noHub, "--wait", "0"}, 1},
		{tether, []string{"role"}, 0},
		{edge, []string{"run", "--bogus"}, 2},
		{edge, []string{"run", "--backoff-max", "soon"}, 2},
		{edge, []string{"bogus"}, 2},
		{edge, []string{"status", "extra"}, 2},
		{edge, []string{"--version"}, 0},
	} {
		_, errOut, code := runCmd(t, 30*time.Second, tc.bin, tc.args...)
		if code != tc.want {
			t.Errorf("%s %s: exit %d, want %d (stderr %q)",
				filepath.Base(tc.bin), strings.Join(tc.args, " "), code, tc.want, errOut)
		}
	}
}

// TestCLIFriction: role create takes a label selector with -l and refuses
// node names given to its old flag; nodes rm takes many names and reports
// each; SITE shows a node's site label; and shell completion offers node
// names and job ids from the hub, quietly nothing when the hub is away.
func TestCLIFriction(t *testing.T) {
	h := startHub(t)
	tether := filepath.Join(binDir, "tether")
	join := h.token("--ttl", "10m", "--uses", "4", "--label", "env=lab")
	for _, name := range []string{"n1", "n2", "n3", "n4"} {
		if _, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether-edge"), "join", join,
			"--name", name, "--state-dir", filepath.Join(t.TempDir(), name)); code != 0 {
			t.Fatalf("join %s: exit %d: %s", name, code, errOut)
		}
	}
	roles := func() map[string]string {
		var list []struct{ Name, Nodes string }
		if err := json.Unmarshal([]byte(h.cli("role", "list", "-o", "json")), &list); err != nil {
			t.Fatal(err)
		}
		m := map[string]string{}
		for _, r := range list {
			m[r.Name] = r.Nodes
		}
		return m
	}

	t.Run("role create selects by label", func(t *testing.T) {
		_, errOut, code := runCmd(t, 30*time.Second, tether, "role", "create", "justn1", "--nodes", "n1", "--logins", "root",
			"--data-dir", h.dataDir)
		if code != 2 || !strings.Contains(errOut, "not by name") || !strings.Contains(errOut, "-l/--selector") {
			t.Errorf("role create --nodes n1: exit %d, stderr %q; want 2 and a pointer to -l", code, errOut)
		}
		h.cli("role", "create", "lab", "-l", "env=lab", "--logins", "root")
		h.cli("role", "create", "old", "--nodes", "env=lab", "--logins", "root") // the old name, with a selector
		got := roles()
		if _, ok := got["justn1"]; ok || got["lab"] != "env=lab" || got["old"] != "env=lab" {
			t.Errorf("roles %v: want lab and old selecting env=lab, no justn1", got)
		}
	})

	t.Run("SITE is the site label", func(t *testing.T) {
		h.cli("nodes", "label", "n1", "site=berlin")
		sites := map[string]string{}
		for _, line := range strings.Split(h.cli("nodes"), "\n")[1:] {
			if f := strings.Fields(line); len(f) > 1 {
				sites[f[0]] = f[1]
			}
		}
		if sites["n1"] != "berlin" || sites["n2"] != "-" {
			t.Errorf("SITE column %v: want n1 berlin, n2 -", sites)
		}
	})

	complete := func(args ...string) (words []string, directive string) {
		t.Helper()
		out, errOut, code := runCmd(t, 30*time.Second, tether, append([]string{"__complete"}, args...)...)
		if code != 0 {
			t.Fatalf("tether __complete %q: exit %d: %s", args, code, errOut)
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			if strings.HasPrefix(line, ":") {
				directive = line
				continue
			}
			word, _, _ := strings.Cut(line, "\t")
			words = append(words, word)
		}
		return words, directive
	}
	out, errOut, code := runCmd(t, 30*time.Second, tether, "run", "--nodes", "n2", "--detach", "--data-dir", h.dataDir,
		"--", "true")
	if code != 0 {
		t.Fatalf("run --detach: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	waitFor(t, "job "+id+" to end (its node is offline)", 30*time.Second, func() bool {
		var j struct{ State string }
		return json.Unmarshal([]byte(h.cli("jobs", "show", id, "-o", "json")), &j) == nil && j.State != "running"
	})

	t.Run("completion", func(t *testing.T) {
		dd := []string{"--data-dir", h.dataDir}
		for _, tc := range []struct {
			args []string
			want []string
		}{
			{append([]string{"nodes", "rm"}, append(dd, "")...), []string{"n1", "n2", "n3", "n4"}},
			{append([]string{"nodes", "rm"}, append(dd, "n1", "n")...), []string{"n2", "n3", "n4"}},
			{append([]string{"nodes", "revoke"}, append(dd, "n3")...), []string{"n3"}},
			{append([]string{"nodes", "label"}, append(dd, "")...), []string{"n1", "n2", "n3", "n4"}},
			{append([]string{"run"}, append(dd, "--nodes", "n1,")...), []string{"n1,n2", "n1,n3", "n1,n4"}},
			{append([]string{"jobs", "show"}, append(dd, "")...), []string{id}},
			{append([]string{"jobs", "logs"}, append(dd, id, "--node", "")...), []string{"n2"}},
			{append([]string{"jobs", "rerun"}, append(dd, id[:1])...), []string{id}},
			{append([]string{"cluster", "deregister"}, append(dd, "")...), []string{"n1", "n2", "n3", "n4"}},
			{append([]string{"service", "connect"}, append(dd, "db", "--from", "n")...), []string{"n1", "n2", "n3", "n4"}},
			{append([]string{"upgrade", "confirm"}, append(dd, "u1", "--node", "n2")...), []string{"n2"}},
			{append([]string{"kubeone", "create"}, append(dd, "k", "--control-plane", "n1,")...),
				[]string{"n1,n2", "n1,n3", "n1,n4"}},
			{append([]string{"kubeone", "members"}, append(dd, "k", "--workers", "n1,n2,")...),
				[]string{"n1,n2,n3", "n1,n2,n4"}},
		} {
			words, directive := complete(tc.args...)
			slices.Sort(words)
			if !slices.Equal(words, tc.want) || directive == "" {
				t.Errorf("tether __complete %q: %q %s, want %q", tc.args, words, directive, tc.want)
			}
		}
	})

	t.Run("completion without a hub", func(t *testing.T) {
		for _, args := range [][]string{
			{"nodes", "rm", "--data-dir", filepath.Join(t.TempDir(), "none"), ""},
			{"jobs", "show", "--hub", fmt.Sprintf("127.0.0.1:%d", freePort(t)),
				"--identity", filepath.Join(h.dataDir, "admin"), ""},
		} {
			start := time.Now()
			words, directive := complete(args...)
			if len(words) != 0 || directive != ":4" || time.Since(start) > 10*time.Second {
				t.Errorf("tether __complete %q: %q %s after %s, want nothing, :4 (no files), at once",
					args, words, directive, time.Since(start))
			}
		}
	})

	t.Run("nodes rm takes many", func(t *testing.T) {
		_, errOut, code := runCmd(t, 30*time.Second, tether, "nodes", "rm", "n3", "nosuch", "n4", "--data-dir", h.dataDir)
		if code != 1 || !strings.Contains(errOut, "node n3 (") || !strings.Contains(errOut, "node n4 (") ||
			!strings.Contains(errOut, "node nosuch:") || !strings.Contains(errOut, "1 of 3 nodes not removed") {
			t.Errorf("nodes rm n3 nosuch n4: exit %d, stderr %q; want 1, each node's outcome and the count", code, errOut)
		}
		ns := h.nodes()
		if _, ok := ns["n3"]; ok || len(ns) != 2 {
			t.Errorf("after nodes rm n3 n4: %d nodes listed, want n1 and n2", len(ns))
		}
	})
}
