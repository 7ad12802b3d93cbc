package edge

import (
	"context"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// nudge runs beside a QUIC session whose liveness is the transport's: it
// sends the probes the session's dead-peer rule asks for (tunnel.Prober)
// once the hub has acknowledged nothing past its keepalive's answer
// (pingAfter, and a little more), one every half sample interval of the
// rule until the hub is heard again or the session closes. The probe is a heartbeat:
// a live hub acknowledges it (and takes it as a sign of life), and a hub
// that was restarted on the same address answers it with a stateless
// reset (a PING is too small for one). So a lost keepalive gets several
// more tries within the dead-peer timeout, not one. While the hub answers
// the keepalives nothing is sent.
//
// The status says hub-silent from the first probe until the hub is heard
// again, so that `tether-edge status` does not say connected on the word
// of a hub that has stopped answering.
func (s *session) nudge(ctx context.Context, pingAfter time.Duration) {
	p, ok := s.tun.(tunnel.Prober)
	if !ok {
		return
	}
	probes := p.Probes(pingAfter)
	// While silent, the Heard mark is sampled for the hub's return (for the
	// status only: the probes stop by themselves).
	every := min(max(pingAfter/5, 10*time.Millisecond), time.Second)
	var (
		back    *time.Ticker
		backC   <-chan time.Time
		silentM uint64 // the mark the silence is counted on
	)
	defer func() {
		if back != nil {
			back.Stop()
		}
	}()
	connected := transition{hub: s.hub, transport: s.tun.Transport().String(), note: s.note}
	for {
		select {
		case <-ctx.Done():
			return
		case pr := <-probes:
			s.log.Debug("hub silent past its keepalive; sending a heartbeat", "silent_for",
				pr.Silent.Round(100*time.Millisecond))
			if back == nil {
				silentM = pr.Heard
				s.a.hubSilence(true, time.Now().Add(-pr.Silent), connected)
				back = time.NewTicker(every)
				backC = back.C
			}
			if err := s.write(control.WriteHeartbeat); err != nil {
				s.tun.Close()
				return
			}
		case <-backC:
			if s.tun.Heard() != silentM {
				s.log.Debug("hub heard again")
				s.a.hubSilence(false, time.Time{}, connected)
				back.Stop()
				back, backC = nil, nil
			}
		}
	}
}
