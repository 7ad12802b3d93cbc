package edge

import (
	"testing"
	"time"
)

// TestNudger: a hub that answers the keepalives is never nudged; a silent
// one gets a heartbeat once it has been silent for quietAfter, then one per
// beat while the silence lasts (a hub restarted after the first one must
// still be told), and hearing it again starts over.
func TestNudger(t *testing.T) {
	s := time.Second
	t0 := time.Unix(1_000_000, 0)
	type sample struct {
		at    time.Duration // since t0
		heard uint64
		want  bool
	}
	for _, tc := range []struct {
		name    string
		samples []sample
	}{
		{"keepalives answered", []sample{{5 * s, 1, false}, {10 * s, 1, false}, {25 * s, 2, false}, {30 * s, 2, false}, {50 * s, 3, false}, {55 * s, 3, false}}},
		{"silent: once past quietAfter, then every beat", []sample{
			{5 * s, 0, false}, {25 * s, 0, false}, {30 * s, 0, true}, {35 * s, 0, false}, {45 * s, 0, false}, {50 * s, 0, true}, {55 * s, 0, false}, {70 * s, 0, true}}},
		{"heard again: starts over", []sample{
			{30 * s, 0, true}, {31 * s, 1, false}, {50 * s, 1, false}, {61 * s, 1, true}, {62 * s, 1, false}}},
	} {
		n := newNudger(30*s, 20*s, 0, t0)
		for _, sm := range tc.samples {
			if got := n.due(sm.heard, t0.Add(sm.at)); got != sm.want {
				t.Errorf("%s: at %v with %d packets heard: due = %v, want %v", tc.name, sm.at, sm.heard, got, sm.want)
			}
		}
	}
}
