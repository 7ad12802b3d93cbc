package main

import (
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// TestGoroutinesByStart: goroutines are counted by the last frame of their
// stack, the profile's header line included in the first record.
func TestGoroutinesByStart(t *testing.T) {
	const prof = `goroutine profile: total 5
3 @ 0x1 0x2
#	0x1	internal/poll.runtime_pollWait+0x84	netpoll.go:351
#	0x2	github.com/hashicorp/yamux.(*Session).recv+0x17	session.go:1

2 @ 0x1 0x3
#	0x1	runtime.gopark+0x1	proc.go:1
#	0x3	github.com/tether-dev/tether/hub.(*Server).refuseAgentStreams+0xa9	session.go:2
`
	f := filepath.Join(t.TempDir(), "g.txt")
	if err := os.WriteFile(f, []byte(prof), 0o600); err != nil {
		t.Fatal(err)
	}
	got := goroutinesByStart(f, 5)
	if len(got) != 2 || got[0].fn != "`yamux.(*Session).recv`" || got[0].value != 3 || got[1].value != 2 {
		t.Fatalf("goroutinesByStart = %+v", got)
	}
}

// TestChildShares: members beyond the in-process agents are split into
// consecutive shares of at most the limit, none empty, none overlapping.
func TestChildShares(t *testing.T) {
	for _, tc := range []struct {
		from, to, per int
		want          [][2]int
	}{
		{10000, 50000, 18000, [][2]int{{10000, 18000}, {28000, 18000}, {46000, 4000}}},
		{0, 18000, 18000, [][2]int{{0, 18000}}},
		{50000, 50000, 18000, nil},
		{0, 3, 1, [][2]int{{0, 1}, {1, 1}, {2, 1}}},
	} {
		if got := childShares(tc.from, tc.to, tc.per); !slices.Equal(got, tc.want) {
			t.Errorf("childShares(%d, %d, %d) = %v, want %v", tc.from, tc.to, tc.per, got, tc.want)
		}
	}
}

// TestConnectedCount reads agentsim's progress lines, and nothing else.
func TestConnectedCount(t *testing.T) {
	for _, tc := range []struct {
		line string
		want int
		ok   bool
	}{
		{"    90s connected 17000/17000, failed attempts 0, sessions ended 0", 17000, true},
		{"     1s connected 0/16000, failed attempts 3, sessions ended 0; stopping", 0, true},
		{"agentsim: open fleet.gob: no such file or directory", 0, false},
		{"", 0, false},
	} {
		got, ok := connectedCount(tc.line)
		if got != tc.want || ok != tc.ok {
			t.Errorf("connectedCount(%q) = %d, %v; want %d, %v", tc.line, got, ok, tc.want, tc.ok)
		}
	}
}
