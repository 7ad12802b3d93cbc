package jobs

import (
	"context"
	"io"
	"testing"

	"github.com/tether-dev/tether/hub/store"
)

// TestJobOutcome: a job is failed only when a run failed; offline nodes
// that were skipped while the others succeeded make it partial, not failed.
func TestJobOutcome(t *testing.T) {
	for _, tc := range []struct {
		name    string
		offline []string
		command string
		want    string
	}{
		{"all ok", nil, "true", store.JobSucceeded},
		{"some skipped, none failed", []string{"n001"}, "true", store.JobPartial},
		{"all skipped", []string{"n000", "n001", "n002"}, "true", store.JobPartial},
		{"one failed, one skipped", []string{"n001"}, "false", store.JobFailed},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newEnv(t, func(_ context.Context, _ string, cmd Command, _, _ io.Writer) (int, error) {
				if cmd.Line == "false" {
					return 1, nil
				}
				return 0, nil
			})
			for _, n := range tc.offline {
				e.online.Store("id-"+n, "offline")
			}
			j := e.start(t, store.JobSpec{Command: tc.command}, nodes(3))
			got, _ := e.wait(t, j.ID)
			if got.State != tc.want {
				t.Fatalf("job state %q (%s), want %q", got.State, got.Error, tc.want)
			}
		})
	}
}
