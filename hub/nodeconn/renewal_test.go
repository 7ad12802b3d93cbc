package nodeconn

import (
	"testing"
	"time"
)

func TestRenewSweepEvery(t *testing.T) {
	for _, tc := range []struct{ ttl, want time.Duration }{
		{7 * 24 * time.Hour, time.Minute},
		{time.Hour, time.Minute},
		{24 * time.Minute, time.Minute},
		{12 * time.Minute, 30 * time.Second},
		{time.Second, 100 * time.Millisecond},
	} {
		if got := renewSweepEvery(tc.ttl); got != tc.want {
			t.Errorf("renewSweepEvery(%v) = %v, want %v", tc.ttl, got, tc.want)
		}
	}
	if got := RenewRetry(7 * 24 * time.Hour); got != 14*time.Hour {
		t.Errorf("RenewRetry(7 days) = %v, want 14h", got)
	}
}
