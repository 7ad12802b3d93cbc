package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tether-dev/tether/edge"
)

// TestExitStatus: what edge.Refused calls refused for good exits
// exitRefused and a node with no identity and no join string exits
// exitNotJoined, the statuses the systemd unit does not restart; anything
// else exits 1.
func TestExitStatus(t *testing.T) {
	if got := exitStatus(fmt.Errorf("run: %w", edge.ErrRefused)); got != exitRefused {
		t.Errorf("exit status for a refused node = %d, want %d", got, exitRefused)
	}
	if got := exitStatus(edge.NoJoinString("/var/lib/tether-edge", edge.DefaultJoinFile, "")); got != exitNotJoined {
		t.Errorf("exit status for a node without identity or join string = %d, want %d", got, exitNotJoined)
	}
	if got := exitStatus(fmt.Errorf("load: %w", edge.ErrNotJoined)); got != 1 {
		t.Errorf("exit status for a state dir that is not joined = %d, want 1", got)
	}
	if got := exitStatus(errors.New("--transport: unknown")); got != 1 {
		t.Errorf("exit status for a flag error = %d, want 1", got)
	}
}
