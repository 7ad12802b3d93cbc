package main

import (
	"errors"
	"fmt"
	"testing"

	"github.com/tether-dev/tether/edge"
)

func TestExitStatus(t *testing.T) {
	for _, tc := range []struct {
		name string
		err  error
		want int
	}{
		{"revoked or removed", fmt.Errorf("%w: this node was revoked on the hub; to bring this node back: …", edge.ErrRefused), exitRefused},
		{"certificate expired offline", fmt.Errorf("%w: it expired", edge.ErrRejoinNeeded), exitRefused},
		{"not joined", fmt.Errorf("load: %w", edge.ErrNotJoined), 1},
		{"bad flag", errors.New("--transport: unknown"), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := exitStatus(tc.err); got != tc.want {
				t.Errorf("exitStatus(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
}
