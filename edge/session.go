package edge

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/siteproto"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// hubPeer is the agent's side of the shared uplink client: the hub above,
// whose fatal notice is ErrRefused.
var hubPeer = uplink.Peer{Name: "hub", Refused: ErrRefused}

// session is one connection to the hub: the tunnel, its control stream
// (see control's protocol: hello, welcome, then heartbeats, renewals,
// trust and notices), and the streams the hub opens, served until any of
// them ends.
type session struct {
	a    *Agent
	conn *uplink.Conn // the tunnel and its control stream
	tun  tunnel.Session
	hub  string // the address dialed
	log  *slog.Logger

	// trusted is closed once the hub's first SSH trust (host certificate,
	// user CAs, principals) is applied: the hub may route a jump here
	// before that message has been read, and an ssh stream served earlier
	// would present no host certificate (see serveStream).
	trusted   chan struct{}
	trustOnce sync.Once

	// binds runs the service tunnels' local listeners (servicebind.go);
	// set in serve.
	binds *serviceBinder
	// note says why the session is on its transport ("udp blocked,
	// re-probing", "moved from tcp 12:03"), for the status.
	note string
	// live counts the hub's streams being served, for the drain after a
	// transport move.
	live atomic.Int64
}

// runOnce makes one connection and serves it until it ends. connected
// reports whether the hub accepted the session. A session on TCP that
// moves to QUIC (see reprobe) hands over to the new session here, the old
// one draining on its own.
func (a *Agent) runOnce(ctx context.Context) (connected bool, err error) {
	a.setState(StateConnecting, transition{})
	s, err := a.dial(ctx)
	if err != nil {
		return false, err
	}
	a.setState(StateHandshaking, transition{})
	welcome, err := s.start(ctx, "")
	if err != nil {
		s.tun.Close()
		return false, err
	}
	for {
		next, err := s.run(ctx, welcome)
		if next == nil {
			return true, err
		}
		s, welcome = next.s, next.welcome
	}
}

// start opens the control stream and runs the hello/welcome handshake;
// movedFrom is set when this session replaces a live one (Hello.MovedFrom).
// A fatal notice instead of the welcome is ErrRefused.
func (s *session) start(ctx context.Context, movedFrom string) (*control.Welcome, error) {
	hello := s.hello()
	hello.Hello.MovedFrom = movedFrom
	hello.Hello.TransportWhy = s.note
	return s.conn.Start(ctx, hello)
}

// run serves a welcomed session until it ends (its error), or until it has
// moved to another transport: then it returns the new session, and this
// one drains (its live streams go on) on a goroutine Run waits for.
func (s *session) run(ctx context.Context, welcome *control.Welcome) (*moved, error) {
	a := s.a
	// Stop everything of this session when ctx ends.
	stop := context.AfterFunc(ctx, func() { s.tun.Close() })
	s.log.Info("connected to hub")
	clearHub := a.hubSession(s, welcome)
	clearUpgrade := a.upgradeSession(s, welcome)
	a.setState(StateConnected, transition{hub: s.hub, transport: s.tun.Transport().String(), note: s.note})
	next, finish, err := s.serve(ctx, control.AgentLiveness(a.cfg.Tunnel, welcome))
	clearUpgrade()
	clearHub()
	if next == nil {
		stop()
		s.conn.Control().Close()
		s.tun.Close()
		return nil, err
	}
	a.drains.Go(func() {
		defer stop()
		s.drain(ctx, finish)
		s.conn.Control().Close()
		s.tun.Close()
	})
	return next, nil
}

// dial opens a tunnel to the first of the node's hubs that answers.
func (a *Agent) dial(ctx context.Context) (*session, error) {
	tun, addr, err := uplink.Dial(ctx, a.dialer(a.cfg.Transport), a.id.Config.Hubs)
	if err != nil {
		return nil, err
	}
	s := a.newSession(tun, addr)
	if a.cfg.Transport == tunnel.TransportAuto && tun.Transport() == tunnel.TransportTCP {
		s.note = "udp blocked, re-probing"
	}
	return s, nil
}

// dialer is the tunnel dialer for transport t.
func (a *Agent) dialer(t tunnel.Transport) *tunnel.Dialer {
	tc := pki.ClientTLSConfig(a.cert(), a.id.CA)
	// Resume the last session's TLS state when the hub allows it: after a
	// hub restart the whole fleet reconnects at once, and a resumed
	// handshake costs both sides far less than a full one.
	tc.ClientSessionCache = a.sessionCache()
	// AckLiveness: the agent sends something the hub acknowledges whenever
	// the hub has acknowledged nothing for a keepalive interval (its
	// heartbeats, or session.nudge's).
	return &tunnel.Dialer{TLSConfig: tc, Config: a.cfg.Tunnel, Transport: t, Logger: a.log,
		LocalIP: a.cfg.SourceIP, UDP: a.cfg.UDP, AckLiveness: true}
}

func (a *Agent) newSession(tun tunnel.Session, addr string) *session {
	log := a.log.With("hub", addr, "transport", tun.Transport().String())
	return &session{a: a, conn: uplink.NewConn(tun, hubPeer, log), tun: tun, hub: addr, log: log,
		trusted: make(chan struct{})}
}

// hello is what the agent announces on a new session.
func (s *session) hello() *control.Message {
	a := s.a
	caps := []string{control.CapTCP, control.CapHeartbeat, siteproto.CapServiceConnect, control.CapTransportLiveness}
	up := a.upgradeSupport()
	if up != nil {
		caps = append(caps, upgradeproto.CapUpgrade)
	}
	if a.sshd != nil {
		caps = append(caps, control.CapSSHEmbedded, control.CapSSHLoginEvents)
	} else {
		caps = append(caps, control.CapSSHLocal)
	}
	return &control.Message{Type: control.TypeHello, Hello: &control.Hello{
		ProtocolVersion: control.ProtocolVersion,
		Name:            a.id.Config.Name,
		AgentVersion:    Version,
		Facts:           GatherFacts(),
		Capabilities:    caps,
		HostKey:         a.hostKeyLine(s.log),
		StateDir:        absStateDir(a.cfg.StateDir),
		Labels:          a.reportedLabels(s.log),
		Upgrade:         up,
	}}
}

// reportedLabels are the labels file's, read anew at every connect; a
// file that cannot be read or breaks the label rules reports none (said in
// the log).
func (a *Agent) reportedLabels(log *slog.Logger) map[string]string {
	if a.cfg.LabelsFile == "" {
		return nil
	}
	l, err := ReadLabels(a.cfg.LabelsFile)
	if err != nil {
		log.Warn("no labels reported", "err", err)
		return nil
	}
	return l
}

// send writes one control message; safe for concurrent use.
func (s *session) send(m *control.Message) error { return s.conn.Send(m) }

func (s *session) write(f func(io.Writer) error) error { return s.conn.Write(f) }

// serve runs the welcomed session: the hub's streams, certificate renewal
// and heartbeats beside the control stream's reader, until one ends. It
// returns why the session ended, and only once everything it started has.
// A TCP session an auto-transport agent fell back to also re-probes QUIC
// (reprobe); when that gets through, serve returns the new session at once
// and finish, which ends this one once drain has waited for its streams.
func (s *session) serve(ctx context.Context, live control.Liveness) (next *moved, finish func() error, err error) {
	var wg sync.WaitGroup
	sctx, cancel := context.WithCancel(ctx)
	rctx, stopRenew := context.WithCancel(sctx)

	renewed := make(chan struct{}, 1)
	s.binds = newServiceBinder(sctx, s.tun.OpenStream, s.log)
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.a.acceptStreams(sctx, s.tun, s.trusted, s.log, &wg, &s.live)
		cancel()
	}()
	waitRenewals := s.a.renewals(rctx, s.send, renewed, s.log)
	pingAfter := s.a.cfg.Tunnel.PingAfter(s.tun.Transport(), live.HubIdle)
	switch {
	case live.AgentHeartbeats(pingAfter):
		// A hub without transport liveness, or one that expects to hear
		// this agent sooner than its own keepalive would speak.
		if live.Transport {
			s.log.Debug(
				"heartbeating at the hub's keepalive interval, shorter than this agent's", "every", live.Every,
				"own_keepalive_after", pingAfter)
		}
		wg.Go(func() { s.conn.Heartbeat(sctx, live.Every) })
	case s.tun.Transport() == tunnel.TransportQUIC: // else the transport's keepalives carry liveness
		wg.Go(func() { s.nudge(sctx, pingAfter, min(pingAfter, live.Every)) })
	}
	ctlErr := make(chan error, 1)
	wg.Go(func() {
		ctlErr <- s.readControl(live.Deadline, renewed)
		cancel()
		s.tun.Close()
	})
	var movedTo chan *moved
	if s.tun.Transport() == tunnel.TransportTCP && s.a.cfg.Transport == tunnel.TransportAuto {
		movedTo = make(chan *moved, 1)
		wg.Go(func() { s.reprobe(sctx, movedTo) })
	}
	finish = func() error {
		stopRenew()
		cancel()
		s.tun.Close()
		wg.Wait()
		waitRenewals()
		s.binds.Wait() // its listeners close with sctx
		return <-ctlErr
	}
	select {
	case err := <-ctlErr:
		ctlErr <- err // for finish
		err = finish()
		// A QUIC session welcomed just as this one ended has nobody to
		// serve it: close it, and the next connect starts afresh.
		select {
		case m := <-movedTo:
			m.s.conn.Control().Close()
			m.s.tun.Close()
		default:
		}
		return nil, nil, err
	case m := <-movedTo:
		stopRenew() // the new session renews from now on
		return m, finish, nil
	}
}

// nudge runs beside a QUIC session whose liveness is the transport's. The
// agent's keepalive is a QUIC PING, which a hub that was killed and
// restarted on the same address drops without a word: the packet is too
// small for a stateless reset (quic-go answers none below 43 bytes, so that
// resets cannot be looped). A heartbeat is large enough. So once the hub
// has acknowledged nothing for pingAfter (when the agent's keepalive goes
// out) and a tenth more for the keepalive's answer, the agent sends a heartbeat, and another
// every beat for as long as the hub stays silent: a live hub takes it as a
// sign of life, a restarted hub answers with a stateless reset, and the
// agent reconnects then instead of at its dead-peer timeout. beat is the
// hub's keepalive interval, the cadence at which agents heartbeated before
// transport liveness, or pingAfter if that is shorter. While the hub answers
// the keepalives this sends nothing. It samples the session's Heard mark,
// which moves with the hub's acknowledgements (tunnel.Dialer.AckLiveness),
// so it also heartbeats when the hub keeps sending but acknowledges
// nothing, which gives the tunnel's dead-peer close its answer when the hub
// is alive. The samples are a second apart (a fifth of pingAfter when that
// is shorter) only from when the keepalive's answer can first come; before
// that the session sleeps (nudger.next): an idle agent wakes two or three
// times per keepalive instead of every second.
func (s *session) nudge(ctx context.Context, pingAfter, beat time.Duration) {
	every := min(max(pingAfter/5, 10*time.Millisecond), time.Second)
	// The keepalive's answer gets a tenth of pingAfter (2.5 s by default),
	// at least one sample.
	now := time.Now()
	n := newNudger(pingAfter, pingAfter+max(pingAfter/10, every), beat, every, s.tun.Heard(), now)
	t := time.NewTimer(n.next(now))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if n.due(s.tun.Heard(), now) {
				s.log.Debug(
					"hub silent past its keepalive; sending a heartbeat", "silent_for", n.silentFor(now).Round(100*time.Millisecond))
				if err := s.write(control.WriteHeartbeat); err != nil {
					s.tun.Close()
					return
				}
			}
			t.Reset(n.next(now))
		}
	}
}

// nudger decides, from samples of a session's Heard mark, when a silent
// hub is due a heartbeat: once it has been silent for quietAfter,
// then every beat while the silence lasts; and when to take the next
// sample.
//
// A change in the mark is known to have come after the sample before the
// one that saw it (heardAfter), whenever that was. The keepalive goes out
// pingAfter after the last thing heard, so its answer cannot come before
// heardAfter+pingAfter: the samples until then are skipped, and from then
// on come every apart. Silence is counted from heardAfter plus one every,
// which is where a sampler a second apart would have counted it from; after
// a skipped stretch in which the mark moved (traffic, not keepalives) it
// counts from earlier than that, so a heartbeat may come early, never late.
type nudger struct {
	pingAfter, quietAfter, beat, every time.Duration
	last                               uint64
	sampledAt, heardAfter, nudgedAt    time.Time
}

func newNudger(pingAfter, quietAfter, beat, every time.Duration, heard uint64, now time.Time) *nudger {
	return &nudger{pingAfter: pingAfter, quietAfter: quietAfter, beat: beat, every: every,
		last: heard, sampledAt: now, heardAfter: now.Add(-every)}
}

// due records a sample and reports whether to send a heartbeat now.
func (n *nudger) due(heard uint64, now time.Time) bool {
	prev := n.sampledAt
	n.sampledAt = now
	if heard != n.last {
		n.last, n.heardAfter, n.nudgedAt = heard, prev, time.Time{}
		return false
	}
	if n.silentFor(now) < n.quietAfter || (!n.nudgedAt.IsZero() && now.Sub(n.nudgedAt) < n.beat) {
		return false
	}
	n.nudgedAt = now
	return true
}

// silentFor is how long the hub has been silent at now, as a sampler a
// second apart would count it.
func (n *nudger) silentFor(now time.Time) time.Duration {
	return now.Sub(n.heardAfter) - n.every
}

// next is how long to wait after the sample at now for the next one.
func (n *nudger) next(now time.Time) time.Duration {
	answerFrom := n.heardAfter.Add(n.pingAfter)
	if n.silentFor(now) >= n.quietAfter || !now.Before(answerFrom) {
		return n.every
	}
	return max(n.every, answerFrom.Sub(now))
}

// readControl handles the hub's control messages (uplink.Conn.ReadControl)
// until the stream fails, the hub falls silent for longer than silent once
// it has heartbeaten, or a fatal notice arrives (ErrRefused).
func (s *session) readControl(silent time.Duration, renewed chan<- struct{}) error {
	a, log := s.a, s.log
	return s.conn.ReadControl(silent, func(msg *control.Message) error {
		switch msg.Type {
		case control.TypeHeartbeat, control.TypeNotice: // the reader's own
		case siteproto.TypeServiceBindings:
			s.binds.apply(msg.ServiceBindings)
		case control.TypeAuthorizedKeys:
			a.setAuthorizedKeys(msg.AuthorizedKeys, log)
		case control.TypeSSHTrust:
			a.applySSHTrust(msg.SSHTrust, log)
			s.trustOnce.Do(func() { close(s.trusted) })
		case control.TypeRenewed:
			if err := a.applyRenewed(msg.Cert); err != nil {
				log.Error("renewed certificate rejected", "err", err)
				return nil
			}
			leaf := a.cert().Leaf
			log.Info("node certificate renewed", "valid_until", leaf.NotAfter.UTC().Format(time.RFC3339))
			a.updateStatus(func(st *Status) { st.CertExpires = leaf.NotAfter })
			select {
			case renewed <- struct{}{}:
			default:
			}
		default:
			log.Warn("unexpected control message from hub", "type", msg.Type)
		}
		if a.cfg.OnControl != nil {
			a.cfg.OnControl(msg)
		}
		return nil
	})
}

// absStateDir is the state dir as an absolute, clean path for the hub ("" if
// it cannot be made absolute).
func absStateDir(dir string) string {
	if dir == "" {
		return ""
	}
	abs, err := filepath.Abs(dir)
	if err != nil {
		return ""
	}
	return abs
}
