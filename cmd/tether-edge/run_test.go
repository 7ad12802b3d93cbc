package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tether-dev/tether/edge"
)

// TestExitStatus: what edge.Refused calls refused for good exits
// exitRefused, the status the systemd unit does not restart; anything else
// exits 1.
func TestExitStatus(t *testing.T) {
	if got := exitStatus(fmt.Errorf("run: %w", edge.ErrRefused)); got != exitRefused {
		t.Errorf("exit status for a refused node = %d, want %d", got, exitRefused)
	}
	if got := exitStatus(errors.New("--transport: unknown")); got != 1 {
		t.Errorf("exit status for a flag error = %d, want 1", got)
	}
}
