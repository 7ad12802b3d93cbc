package main

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// TestRunJSONCarriesOutput: `tether run -o json` gives each node's stdout and
// stderr apart, bounded with a truncated flag.
func TestRunJSONCarriesOutput(t *testing.T) {
	big := []byte(strings.Repeat("x", maxRunOutput-3))
	o := runOutputs{}
	for _, ev := range []apitype.JobEvent{
		{Type: "node", Node: "n1", State: "running"},
		{Type: "output", Node: "n1", Stream: "stdout", Data: []byte("hello\n")},
		{Type: "output", Node: "n1", Stream: "stderr", Data: []byte("warn\n")},
		{Type: "output", Node: "n1", Stream: "hub", Data: []byte("uploading\n")},
		{Type: "output", Node: "n2", Stream: "stdout", Data: big},
		{Type: "output", Node: "n2", Stream: "stdout", Data: []byte("abcdef")},
	} {
		o.add(ev)
	}
	d := apitype.JobDetail{
		Job:   apitype.Job{ID: "j1", State: apitype.JobSucceeded},
		Nodes: []apitype.JobNode{{Node: "n1", State: "ok"}, {Node: "n2", State: "ok"}, {Node: "n3", State: "skipped"}},
	}
	b, err := json.Marshal(o.result(d))
	if err != nil {
		t.Fatal(err)
	}
	var got struct {
		ID    string `json:"id"`
		State string `json:"state"`
		Nodes []struct {
			Node            string `json:"node"`
			State           string `json:"state"`
			Stdout          string `json:"stdout"`
			Stderr          string `json:"stderr"`
			StdoutTruncated bool   `json:"stdout_truncated"`
		} `json:"nodes"`
	}
	if err := json.Unmarshal(b, &got); err != nil {
		t.Fatal(err)
	}
	if got.ID != "j1" || got.State != "succeeded" || len(got.Nodes) != 3 {
		t.Fatalf("job record lost: %s", b)
	}
	for _, tc := range []struct {
		i               int
		stdout, stderr  string
		stdoutTruncated bool
	}{
		{0, "hello\n", "warn\n", false},
		{1, string(big) + "abc", "", true},
		{2, "", "", false},
	} {
		n := got.Nodes[tc.i]
		if n.Stdout != tc.stdout || n.Stderr != tc.stderr || n.StdoutTruncated != tc.stdoutTruncated {
			t.Errorf("node %s: stdout %d bytes, stderr %q, truncated %v; want %d bytes, %q, %v",
				n.Node, len(n.Stdout), n.Stderr, n.StdoutTruncated, len(tc.stdout), tc.stderr, tc.stdoutTruncated)
		}
	}
}

// TestParseLabelArgs: `tether nodes label` arguments.
func TestParseLabelArgs(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want string // nodes|set|remove, or "error"
	}{
		{[]string{"n1", "env=prod", "tier-"}, "[n1]|env=prod|[tier]"},
		{[]string{"n1", "n2", "env="}, "[n1 n2]|env=|[]"},
		{[]string{"tier-"}, "[]||[tier]"},
		{[]string{"n1"}, "error"},
		{[]string{"n1", "a=1", "a=2"}, "error"},
	} {
		req, err := parseLabelArgs(tc.args)
		got := "error"
		if err == nil {
			got = strings.Join([]string{
				"[" + strings.Join(req.Nodes, " ") + "]", apitype.FormatLabels(req.Set), "[" + strings.Join(req.Remove, " ") + "]",
			}, "|")
		}
		if got != tc.want {
			t.Errorf("parseLabelArgs(%q) = %s (%v), want %s", tc.args, got, err, tc.want)
		}
	}
}
