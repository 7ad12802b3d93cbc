package edge

import (
	"testing"
	"time"
)

// TestNudger drives the nudger on its own schedule (next) against a hub
// whose acknowledgements move the Heard mark at given times: a hub that
// answers the keepalives is never nudged and costs a few samples per
// keepalive, not one a second; a silent one gets a heartbeat once it has
// been silent for quietAfter (within one sample), then one per beat while
// the silence lasts; traffic in a skipped stretch never makes a heartbeat
// late.
func TestNudger(t *testing.T) {
	const (
		s          = time.Second
		pingAfter  = 20 * s
		quietAfter = 22 * s
		beat       = 20 * s
		every      = s
		rtt        = 50 * time.Millisecond
		end        = 10 * time.Minute
	)
	// answered is the hub answering each keepalive (sent pingAfter after
	// the last thing heard) after rtt, from 0 until stop.
	answered := func(from, stop time.Duration) []time.Duration {
		var out []time.Duration
		for at := from + pingAfter + rtt; at < stop; at += pingAfter + rtt {
			out = append(out, at)
		}
		return out
	}
	for _, tc := range []struct {
		name      string
		heard     []time.Duration // when the mark moves, ascending
		silentAt  time.Duration   // the last time it moves (the hub goes silent); <0: never silent
		maxPerLap int             // most samples between two keepalive answers
	}{
		{"keepalives answered", answered(0, end), -1, 3},
		{"silent from the start", nil, 0, 0},
		{"silent after 5 keepalives", answered(0, 5*(pingAfter+rtt)+1), 5 * (pingAfter + rtt), 3},
		{"traffic in a skipped stretch, then silence",
			append(answered(0, 2*(pingAfter+rtt)+1), 2*(pingAfter+rtt)+7*s), 2*(pingAfter+rtt) + 7*s, 3},
		{"traffic just before the answer, then silence",
			append(answered(0, pingAfter+rtt+1), pingAfter+rtt+19*s+500*time.Millisecond),
			pingAfter + rtt + 19*s + 500*time.Millisecond, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t0 := time.Unix(1_000_000, 0)
			mark := func(at time.Duration) uint64 {
				n := uint64(0)
				for _, h := range tc.heard {
					if h <= at {
						n++
					}
				}
				return n
			}
			n := newNudger(pingAfter, quietAfter, beat, every, 0, t0)
			var beats []time.Duration
			samples, lap, lastMark := 0, 0, uint64(0)
			for at := n.next(t0); at < end; {
				now := t0.Add(at)
				m := mark(at)
				if m != lastMark {
					if lap > tc.maxPerLap && tc.maxPerLap > 0 {
						t.Errorf("%d samples before the answer at %v, want at most %d", lap, at, tc.maxPerLap)
					}
					lastMark, lap = m, 0
				}
				samples++
				lap++
				if n.due(m, now) {
					beats = append(beats, at)
				}
				d := n.next(now)
				if d < every {
					t.Fatalf("next %v after the sample at %v, want at least %v", d, at, every)
				}
				at += d
			}
			if tc.silentAt < 0 {
				if len(beats) > 0 {
					t.Fatalf("heartbeats at %v to a hub answering every keepalive", beats)
				}
				if max := int(end/(pingAfter+rtt)+1) * tc.maxPerLap; samples > max {
					t.Errorf("%d samples in %v, want at most %d", samples, end, max)
				}
				return
			}
			if len(beats) == 0 {
				t.Fatalf("no heartbeat to a hub silent from %v", tc.silentAt)
			}
			if first := beats[0]; first > tc.silentAt+quietAfter+2*every || first < tc.silentAt+quietAfter-pingAfter {
				t.Errorf("first heartbeat at %v, hub silent from %v: want by %v", first, tc.silentAt,
					tc.silentAt+quietAfter+2*every)
			}
			for i := 1; i < len(beats); i++ {
				if gap := beats[i] - beats[i-1]; gap < beat || gap > beat+every {
					t.Errorf("heartbeats %v apart (%v), want every %v", gap, beats, beat)
				}
			}
		})
	}
}
