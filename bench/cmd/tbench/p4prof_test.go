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
