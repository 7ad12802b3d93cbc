package nodeconn

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

// markSession is a session whose Heard mark the test moves.
type markSession struct {
	tunnel.Session
	mark atomic.Uint64
}

func (s *markSession) Heard() uint64 { return s.mark.Load() }

// TestPresenceSweep: a transport-liveness session is shown heard at the
// sweep after its mark moved and not after a sweep that found it still; its
// last_seen falls due once per seenStoreInterval from its connect; sessions
// that heartbeat are left to their heartbeats; gone sessions are forgotten.
func TestPresenceSweep(t *testing.T) {
	t0 := time.Unix(1_800_000_000, 0)
	liveSess, beatSess := &markSession{}, &markSession{}
	live := NewConn("id-live", "live", liveSess, nil)
	live.TransportLive, live.Connected = true, t0
	live.Heard.Store(t0.UnixNano())
	beats := NewConn("id-beats", "beats", beatSess, nil)
	beats.Connected = t0
	conns := []*Conn{live, beats}
	p := &presence{marks: map[*Conn]*presenceMark{}}

	step := 10 * time.Second
	for i, tc := range []struct {
		at        time.Duration
		move      bool          // the live session's mark moves before the sweep
		wantHeard time.Duration // the live session's Heard after the sweep
		wantDue   bool          // its last_seen is due
	}{
		{step, false, 0, false}, // first sweep: tracked from here
		{2 * step, true, 2 * step, false},
		{3 * step, false, 2 * step, false},
		{4 * step, true, 4 * step, false},
		{seenStoreInterval, false, 4 * step, true},
		{seenStoreInterval + step, true, seenStoreInterval + step, false},
		{2 * seenStoreInterval, false, seenStoreInterval + step, true},
	} {
		if tc.move {
			liveSess.mark.Add(1)
			beatSess.mark.Add(1)
		}
		due := p.sweepOnce(conns, t0.Add(tc.at))
		if got := time.Unix(0, live.Heard.Load()).Sub(t0); got != tc.wantHeard {
			t.Errorf("sweep %d at +%v: heard at +%v, want +%v", i, tc.at, got, tc.wantHeard)
		}
		if gotDue := len(due) == 1 && due[0] == live; gotDue != tc.wantDue || len(due) > 1 {
			t.Errorf(
				"sweep %d at +%v: due %d sessions (live among them: %v), want live due %v",
				i,
				tc.at,
				len(due),
				gotDue,
				tc.wantDue,
			)
		}
		if beats.Heard.Load() != 0 {
			t.Fatalf("sweep %d touched a heartbeating session's Heard", i)
		}
	}
	p.sweepOnce([]*Conn{beats}, t0.Add(3*seenStoreInterval))
	if len(p.marks) != 0 {
		t.Errorf("%d marks kept after the session left", len(p.marks))
	}
}
