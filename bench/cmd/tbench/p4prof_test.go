package main

import (
	"os"
	"path/filepath"
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

// TestSharedPerSocket: QUIC agents share sockets only beyond the open-files
// limit, as few to a socket as the sockets left allow.
func TestSharedPerSocket(t *testing.T) {
	for _, tc := range []struct {
		sizes []int
		limit int
		want  int
	}{
		{[]int{10000}, 18000, 0},
		{[]int{10000, 50000, 100000}, 18000, 12}, // 90,000 over 8,000 sockets
		{[]int{10000, 50000}, 18000, 5},
		{[]int{50000}, 18000, 3},
		{[]int{10000, 10500}, 10499, 2},
		{[]int{18000, 20000}, 18000, 1000},
	} {
		if got := sharedPerSocket(tc.sizes, tc.limit); got != tc.want {
			t.Errorf("sharedPerSocket(%v, %d) = %d, want %d", tc.sizes, tc.limit, got, tc.want)
		}
	}
}
