package main

import (
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// The progress line: a bar of the nodes that ended (on a terminal), then
// the counts by step.
func TestProgressLine(t *testing.T) {
	u := apitype.Upgrade{Name: "edge-1.4", State: apitype.UpgradeRunning, Total: 10, Counts: map[apitype.UpgradeStep]int{
		apitype.StepSucceeded: 4, apitype.StepFailed: 1, apitype.StepAwaitingConfirmation: 2, apitype.StepPending: 3}}
	for _, tc := range []struct {
		bar  bool
		want string
	}{
		{false, "edge-1.4 running 5/10: 4 succeeded, 1 failed, 2 awaiting_confirmation, 3 pending"},
		{
			true,
			"[###############...............] edge-1.4 running 5/10: 4 succeeded, 1 failed, 2 awaiting_confirmation, 3 pending",
		},
	} {
		if got := progressLine(u, tc.bar); got != tc.want {
			t.Errorf("progressLine(bar=%t) = %q, want %q", tc.bar, got, tc.want)
		}
	}
}

func TestParseDeadline(t *testing.T) {
	now := time.Date(2026, 11, 24, 5, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		in   string
		want time.Time
		err  bool
	}{
		{"24h", now.Add(24 * time.Hour), false},
		{"2026-12-01T06:00:00Z", time.Date(2026, 12, 1, 6, 0, 0, 0, time.UTC), false},
		{"-1h", time.Time{}, true},
		{"tomorrow", time.Time{}, true},
	} {
		got, err := parseDeadline(tc.in, now)
		if (err != nil) != tc.err || !got.Equal(tc.want) {
			t.Errorf("parseDeadline(%q) = %v, %v", tc.in, got, err)
		}
	}
}
