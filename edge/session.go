package edge

import (
	"context"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/resume"
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
	// resumeConnects: the hub keeps this agent's service connects too
	// (control.HubCapResumeConnect); set before serve.
	resumeConnects bool
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
	s.resumeConnects = slices.Contains(welcome.Capabilities, control.HubCapResumeConnect)
	next, finish, err := s.serve(ctx, control.AgentLiveness(a.cfg.Tunnel, welcome), a.keep(welcome, s.log))
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
	caps := []string{control.CapTCP, control.CapHeartbeat, siteproto.CapServiceConnect, control.CapTransportLiveness,
		control.CapResume, control.CapResumeConnect}
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
		ResumeInstance:  a.resumeInstance(),
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
//
// keep, if set, makes the hub's streams resumable: the streams the agent
// held when the session was welcomed are re-attached over it first.
func (s *session) serve(ctx context.Context, live control.Liveness, keep *resume.Config) (next *moved,
	finish func() error, err error) {
	var wg sync.WaitGroup
	sctx, cancel := context.WithCancel(ctx)
	rctx, stopRenew := context.WithCancel(sctx)

	renewed := make(chan struct{}, 1)
	connectKeep := keep // the service connects', if the hub keeps those too
	if !s.resumeConnects {
		connectKeep = nil
	}
	s.binds = newServiceBinder(sctx, s.tun.OpenStream, s.a.held, connectKeep, s.log)
	if keep != nil {
		held := s.a.held.Streams() // all of them from earlier sessions: this one has none yet
		wg.Go(func() { s.a.held.Resume(sctx, s.tun, held, s.log) })
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		s.a.acceptStreams(sctx, s.tun, s.trusted, s.log, &wg, &s.live, keep)
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
		wg.Go(func() { s.nudge(sctx, pingAfter) })
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
