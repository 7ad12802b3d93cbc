package uplink

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

// TestHinted: a hub's retry-after hint is honoured within ±20 % (spread, so
// agents handed the same second do not come back together) and never past
// the backoff cap, which bounds a forged hint.
func TestHinted(t *testing.T) {
	for _, tc := range []struct {
		hint, cap, lo, hi time.Duration
	}{
		{10 * time.Second, 30 * time.Second, 8 * time.Second, 12 * time.Second},
		{time.Second, 30 * time.Second, 800 * time.Millisecond, 1200 * time.Millisecond},
		{255 * time.Second, 30 * time.Second, 24 * time.Second, 30 * time.Second},
	} {
		seen := map[time.Duration]bool{}
		for range 200 {
			w := Hinted(tc.hint, tc.cap)
			if w < tc.lo || w > tc.hi {
				t.Fatalf("Hinted(%v, cap %v) = %v, want %v..%v", tc.hint, tc.cap, w, tc.lo, tc.hi)
			}
			seen[w] = true
		}
		if len(seen) < 2 {
			t.Errorf("Hinted(%v) is not jittered", tc.hint)
		}
	}
}

// TestRetry drives the reconnect loop with a scripted attempt: Before and
// Stop end it with their error, the context ends it with nil, a connected
// attempt resets the backoff, and a busy hub's retry-after hint replaces
// the backoff only for a role that honours it.
func TestRetry(t *testing.T) {
	errBefore, errLost, errFatal := errors.New("expired"), errors.New("lost"), errors.New("refused")
	busy := errors.Join(&tunnel.BusyError{RetryAfter: 40 * time.Millisecond})
	for _, tc := range []struct {
		name       string
		retryAfter bool
		before     []error                    // Before's result per attempt (nil past the end)
		attempts   []error                    // once's error per attempt; past the end the test cancels
		connected  map[int]bool               // attempts that got connected
		stop       func(err error) error      // nil: never stops
		want       error                      // Run's result
		wantCalls  int                        // attempts made
		checkWaits func([]time.Duration) bool // the waits Run told Waiting of
	}{
		{name: "before ends it", before: []error{nil, errBefore}, attempts: []error{errLost, errLost},
			want: errBefore, wantCalls: 1},
		{name: "stop ends it", attempts: []error{errLost, errFatal},
			stop: func(err error) error {
				if errors.Is(err, errFatal) {
					return fmt.Errorf("final: %w", err)
				}
				return nil
			}, want: errFatal, wantCalls: 2},
		{name: "context ends it", attempts: []error{errLost, errLost}, wantCalls: 3},
		{name: "connected resets the backoff",
			attempts:  []error{errLost, errLost, errLost, errLost, errLost, errLost, errLost, errLost, errLost},
			connected: map[int]bool{8: true}, wantCalls: 10,
			checkWaits: func(w []time.Duration) bool { return w[8] < 1500*time.Microsecond }},
		{name: "hint honoured", retryAfter: true, attempts: []error{busy}, wantCalls: 2,
			checkWaits: func(w []time.Duration) bool { return w[0] >= 32*time.Millisecond && w[0] <= 48*time.Millisecond }},
		{name: "hint ignored", attempts: []error{busy}, wantCalls: 2,
			checkWaits: func(w []time.Duration) bool { return w[0] < 1500*time.Microsecond }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			var calls, befores int
			var waits []time.Duration
			r := Retry{BackoffMin: time.Millisecond, BackoffMax: time.Second, RetryAfter: tc.retryAfter,
				Before: func() error {
					befores++
					if befores <= len(tc.before) {
						return tc.before[befores-1]
					}
					return nil
				},
				Stop:    tc.stop,
				Waiting: func(_ error, wait time.Duration) { waits = append(waits, wait) },
			}
			err := r.Run(ctx, func(context.Context) (bool, error) {
				calls++
				if calls > len(tc.attempts) {
					cancel()
					return false, context.Canceled
				}
				return tc.connected[calls-1], tc.attempts[calls-1]
			})
			if (tc.want == nil) != (err == nil) || (tc.want != nil && !errors.Is(err, tc.want)) {
				t.Fatalf("Run = %v, want %v", err, tc.want)
			}
			if calls != tc.wantCalls {
				t.Errorf("%d attempts, want %d", calls, tc.wantCalls)
			}
			if tc.checkWaits != nil && !tc.checkWaits(waits) {
				t.Errorf("waits %v", waits)
			}
		})
	}
}

// TestBackoff: full jitter between half the base and the base doubled per
// attempt, never past the cap (plus the floor).
func TestBackoff(t *testing.T) {
	base, cap := 100*time.Millisecond, time.Second
	for attempt, hi := range []time.Duration{150, 250, 450, 850, 1050, 1050} {
		for range 200 {
			if w := Backoff(attempt, base, cap); w < base/2 || w >= hi*time.Millisecond {
				t.Fatalf("Backoff(%d) = %v, want %v..%v", attempt, w, base/2, hi*time.Millisecond)
			}
		}
	}
}
