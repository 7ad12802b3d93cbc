package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
)

func TestRendererPrefixesLinesAndDrawsProgress(t *testing.T) {
	var out, errOut bytes.Buffer
	r := newRenderer(&out, &errOut, apitype.Job{ID: "j", Total: 2}, true, true)
	r.setNodes([]apitype.JobNode{{Node: "a"}, {Node: "node-b"}})
	zero := 0
	events := []apitype.JobEvent{
		{Type: "node", Node: "a", State: apitype.RunRunning},
		{Type: "output", Node: "a", Stream: "stdout", Data: []byte("hel")},
		{Type: "output", Node: "node-b", Stream: "stdout", Data: []byte("one\ntwo\npart")},
		{Type: "output", Node: "a", Stream: "stdout", Data: []byte("lo\n")},
		{Type: "output", Node: "a", Stream: "stderr", Data: []byte("oops\n")},
		{Type: "node", Node: "a", State: apitype.RunOK, ExitCode: &zero},
		{Type: "node", Node: "node-b", State: apitype.RunFailed},
		{Type: "job", Job: &apitype.Job{ID: "j", State: apitype.JobFailed}},
	}
	for _, ev := range events {
		if err := r.event(ev); err != nil {
			t.Fatal(err)
		}
	}
	r.flush()
	wantOut := "node-b | one\nnode-b | two\na      | hello\nnode-b | part\n"
	if got := stripProgress(out.String()); got != wantOut {
		t.Errorf("stdout:\n%q\nwant\n%q", got, wantOut)
	}
	if !strings.Contains(errOut.String(), "a      | oops\n") {
		t.Errorf("stderr lacks the stderr line: %q", errOut.String())
	}
	if !strings.Contains(errOut.String(), "2/2  ok 1  failed 1") {
		t.Errorf("no final progress line: %q", errOut.String())
	}
	if !strings.HasSuffix(errOut.String(), "\r\x1b[K") {
		t.Errorf("progress line not cleared at the end: %q", errOut.String())
	}
}

func TestRendererWithoutTerminalPrintsNoEscapes(t *testing.T) {
	var out, errOut bytes.Buffer
	r := newRenderer(&out, &errOut, apitype.Job{Total: 1}, true, false)
	r.event(apitype.JobEvent{Type: "output", Node: "a", Stream: "stdout", Data: []byte("x\n")})
	r.event(apitype.JobEvent{Type: "node", Node: "a", State: apitype.RunOK})
	r.flush()
	if strings.Contains(out.String()+errOut.String(), "\x1b") {
		t.Fatalf("escape codes without a terminal: %q %q", out.String(), errOut.String())
	}
}

func stripProgress(s string) string { return strings.ReplaceAll(s, "\r\x1b[K", "") }

func TestLastSeenText(t *testing.T) {
	now := time.Date(2026, 11, 23, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name string
		node apitype.Node
		want string
	}{
		{"online, stored sighting old", apitype.Node{Online: true, LastSeen: now.Add(-4 * time.Minute)}, "now"},
		{"online, never stored", apitype.Node{Online: true}, "now"},
		{"never connected", apitype.Node{}, "never"},
		{"seconds", apitype.Node{LastSeen: now.Add(-42*time.Second - 300*time.Millisecond)}, "42s ago"},
		{"minutes", apitype.Node{LastSeen: now.Add(-12*time.Minute - 59*time.Second)}, "12m ago"},
		{"hours", apitype.Node{LastSeen: now.Add(-5*time.Hour - 3*time.Minute)}, "5h3m ago"},
		{"days", apitype.Node{LastSeen: now.Add(-75 * time.Hour)}, "3d3h ago"},
		{"ahead of this clock", apitype.Node{LastSeen: now.Add(time.Minute)}, "just now"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := lastSeenText(tc.node, now); got != tc.want {
				t.Errorf("lastSeenText = %q, want %q", got, tc.want)
			}
		})
	}
}
