package main

import (
	"testing"
	"time"
)

func TestDayDuration(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"7d", 7 * 24 * time.Hour, true},
		{"1d", 24 * time.Hour, true},
		{"12h", 12 * time.Hour, true},
		{"90m", 90 * time.Minute, true},
		{"0d", 0, false},
		{"1.5d", 0, false},
		{"d", 0, false},
		{"7days", 0, false},
		{"", 0, false},
	} {
		var d dayDuration
		err := d.Set(tc.in)
		if (err == nil) != tc.ok || (tc.ok && time.Duration(d) != tc.want) {
			t.Errorf("Set(%q) = %v, %v; want %v ok=%v", tc.in, time.Duration(d), err, tc.want, tc.ok)
		}
	}
}
