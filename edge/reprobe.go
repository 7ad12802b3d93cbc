package edge

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// The move from a TCP fallback to QUIC. An agent on TransportAuto that
// ended up on TCP (UDP blocked when it connected) keeps trying QUIC in the
// background. When a QUIC session gets through and the hub welcomes it
// (the hello says MovedFrom "tcp"), the agent serves the new session and
// the hub sends new streams over it; the TCP session drains: nothing new
// arrives on it, the streams it carries (an operator's shell, a copy) run
// to their end, and then the agent closes it.

// moved is a welcomed session that replaces the current one.
type moved struct {
	s       *session
	welcome *control.Welcome
}

// drainPoll is how often a draining session looks whether its last stream
// has ended.
const drainPoll = time.Second

// reprobe tries QUIC to the same hub at jittered, growing intervals
// (Config.ReprobeMin up to ReprobeMax) until ctx ends or a QUIC session is
// welcomed, which it hands to out.
func (s *session) reprobe(ctx context.Context, out chan<- *moved) {
	a := s.a
	every := a.cfg.ReprobeMin
	for {
		// Full jitter over the upper half: agents behind one firewall
		// that starts letting UDP through do not all move at once.
		wait := every/2 + time.Duration(rand.Int64N(int64(every/2)+1))
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		every = min(2*every, a.cfg.ReprobeMax)
		dctx, cancel := context.WithTimeout(ctx, uplink.DialTimeout)
		tun, err := a.dialer(tunnel.TransportQUIC).Dial(dctx, s.hub)
		cancel()
		if err != nil {
			s.log.Debug("quic re-probe failed; staying on tcp", "err", err, "next_in", every)
			continue
		}
		ns := a.newSession(tun, s.hub)
		ns.note = "moved from tcp " + time.Now().UTC().Format("15:04")
		w, err := ns.start(ctx, tunnel.TransportTCP.String())
		if err != nil {
			tun.Close()
			s.log.Info("quic re-probe connected but the hub did not take the session; staying on tcp", "err", err)
			continue
		}
		s.log.Info("udp works again: moving to quic; the tcp session drains", "live_streams", s.live.Load())
		out <- &moved{s: ns, welcome: w}
		return
	}
}

// drain waits until the session has no stream left (or it ended, or ctx
// did), then ends it with finish.
func (s *session) drain(ctx context.Context, finish func() error) {
	t := time.NewTicker(drainPoll)
	defer t.Stop()
wait:
	for s.live.Load() > 0 {
		select {
		case <-ctx.Done():
			break wait
		case <-s.tun.Done():
			break wait
		case <-t.C:
		}
	}
	s.log.Info("drained session closed")
	_ = finish()
}
