package site

import (
	"context"
	"crypto"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"slices"
	"sync"
	"time"

	"github.com/tether-dev/tether/edge"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// uplinkSession is one session with the parent.
type uplinkSession struct {
	u      *Uplink
	tun    tunnel.Session
	ctrl   tunnel.Stream
	log    *slog.Logger
	sendMu sync.Mutex
}

func (s *uplinkSession) send(m *control.Message) error {
	return s.write(func(w io.Writer) error { return control.Write(w, m) })
}

// write runs f on the control stream under the send lock and a write
// deadline; heartbeats go through it pre-encoded (control.WriteHeartbeat).
func (s *uplinkSession) write(f func(io.Writer) error) error {
	s.sendMu.Lock()
	defer s.sendMu.Unlock()
	_ = s.ctrl.SetWriteDeadline(time.Now().Add(sendTimeout))
	return f(s.ctrl)
}

// runOnce makes one session and serves it until it ends.
func (u *Uplink) runOnce(ctx context.Context) (connected bool, err error) {
	s, err := u.dial(ctx)
	if err != nil {
		return false, err
	}
	defer s.tun.Close()
	stop := context.AfterFunc(ctx, func() { s.tun.Close() })
	defer stop()
	octx, cancel := context.WithTimeout(ctx, openCtlTimeout)
	s.ctrl, err = s.tun.OpenStream(octx)
	cancel()
	if err != nil {
		return false, fmt.Errorf("open control stream: %w", err)
	}
	defer s.ctrl.Close()
	w, err := s.handshake()
	if err != nil {
		return false, err
	}
	if err := checkWelcome(u.cfg.HubID, w.Site); err != nil {
		return false, err
	}
	if err := u.id.setPlace(w.Site.Path, w.Site.Ancestors); err != nil {
		u.log.Error("record the parent's welcome", "err", err)
	}
	live := control.AgentLiveness(u.cfg.Tunnel, w)
	u.mu.Lock()
	queued := u.downSince
	u.sess, u.parentCaps, u.lastErr, u.connectedAt = s, slices.Clone(w.Capabilities), nil, time.Now()
	u.mu.Unlock()
	s.log.Info("uplink connected", "path", w.Site.Path)
	defer func() {
		u.mu.Lock()
		u.sess, u.downSince = nil, time.Now()
		u.mu.Unlock()
	}()
	return true, s.serve(ctx, live, queued)
}

// dial opens a tunnel to the first of the parent's addresses that answers.
func (u *Uplink) dial(ctx context.Context) (*uplinkSession, error) {
	cfg := u.id.snapshot()
	tc := pki.ClientTLSConfig(u.id.cert(), u.id.id.CA)
	d := &tunnel.Dialer{TLSConfig: tc, Config: u.cfg.Tunnel, Transport: u.cfg.Transport, Logger: u.log}
	var errs []error
	for _, addr := range cfg.Hubs {
		dctx, cancel := context.WithTimeout(ctx, dialTimeout)
		tun, err := d.Dial(dctx, addr)
		cancel()
		if err == nil {
			return &uplinkSession{u: u, tun: tun, log: u.log.With("parent", addr, "transport", tun.Transport().String())}, nil
		}
		errs = append(errs, fmt.Errorf("%s: %w", addr, err))
	}
	return nil, errors.Join(errs...)
}

// hello announces this hub as a site.
func (s *uplinkSession) hello() *control.Message {
	u := s.u
	subtree := append([]string{u.cfg.HubID}, u.cfg.Subtree()...)
	slices.Sort(subtree)
	subtree = slices.Compact(subtree)
	if len(subtree) > control.MaxSubtreeHubs {
		subtree = subtree[:control.MaxSubtreeHubs]
	}
	return &control.Message{Type: control.TypeHello, Hello: &control.Hello{
		ProtocolVersion: control.ProtocolVersion,
		Name:            u.id.snapshot().Name,
		AgentVersion:    u.cfg.AgentVersion,
		Facts:           edge.GatherFacts(),
		Capabilities:    []string{control.CapSite, control.CapHeartbeat},
		Site:            &control.SiteHello{Name: u.id.snapshot().Name, HubID: u.cfg.HubID, Subtree: subtree, HostCAs: u.cfg.HostCAs},
	}}
}

// handshake sends the hello and waits for the welcome. A fatal notice is
// ErrRefused; a welcome without a site section is a parent that takes no
// sites.
func (s *uplinkSession) handshake() (*control.Welcome, error) {
	if err := s.send(s.hello()); err != nil {
		return nil, err
	}
	_ = s.ctrl.SetReadDeadline(time.Now().Add(welcomeTimeout))
	msg, err := control.Read(s.ctrl)
	if err != nil {
		return nil, fmt.Errorf("waiting for welcome: %w", err)
	}
	switch {
	case msg.Type == control.TypeNotice && msg.Fatal:
		return nil, fmt.Errorf("%w: %s", ErrRefused, msg.Notice)
	case msg.Type == control.TypeNotice:
		return nil, fmt.Errorf("parent hub: %s", msg.Notice)
	case msg.Type != control.TypeWelcome:
		return nil, fmt.Errorf("parent hub sent %s instead of welcome", msg.Type)
	case msg.Welcome.Site == nil:
		return nil, errors.New("the parent hub does not take site hubs (its welcome has no site section); upgrade it")
	}
	_ = s.ctrl.SetReadDeadline(time.Time{})
	return msg.Welcome, nil
}

// serve runs a welcomed session: the parent's streams, heartbeats,
// renewal, the status heartbeat and inventory, and the control reader,
// until one ends. It returns only once everything it started has.
func (s *uplinkSession) serve(ctx context.Context, live control.Liveness, queuedSince time.Time) error {
	u := s.u
	var wg sync.WaitGroup
	defer wg.Wait()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	renewed := make(chan struct{}, 1)
	wg.Go(func() { s.acceptStreams(sctx, &wg); cancel() })
	wg.Go(func() { s.renewLoop(sctx, renewed) })
	wg.Go(func() { s.heartbeat(sctx, live.Every) })
	wg.Go(func() {
		if err := s.report(sctx, queuedSince); err != nil && sctx.Err() == nil {
			s.log.Warn("status report failed; closing the uplink", "err", err)
			s.tun.Close()
		}
	})
	u.hmu.Lock()
	hooks := slices.Clone(u.onConnect)
	u.hmu.Unlock()
	for _, f := range hooks {
		wg.Go(func() { f(sctx) })
	}
	err := s.readControl(sctx, live.Deadline, renewed)
	cancel()
	s.tun.Close()
	return err
}

func (s *uplinkSession) heartbeat(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := s.write(control.WriteHeartbeat); err != nil {
				s.tun.Close()
				return
			}
		}
	}
}

// renewLoop asks for a fresh certificate at two thirds of the current
// one's remaining life, as the agent does.
func (s *uplinkSession) renewLoop(ctx context.Context, renewed <-chan struct{}) {
	for {
		wait := max(time.Until(s.u.id.cert().Leaf.NotAfter)*2/3, time.Second)
		t := time.NewTimer(wait)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
		signer, ok := s.u.id.cert().PrivateKey.(crypto.Signer)
		if !ok {
			s.log.Error("renewal: the site key cannot sign")
			return
		}
		csr, err := pki.NewCSR(signer, s.u.id.snapshot().Name)
		if err != nil {
			s.log.Error("renewal CSR", "err", err)
			continue
		}
		if err := s.send(&control.Message{Type: control.TypeRenew, CSR: csr}); err != nil {
			return
		}
		t = time.NewTimer(renewAnswer)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-renewed:
			t.Stop()
		case <-t.C:
			s.log.Warn("no answer to certificate renewal; will retry")
		}
	}
}

// readControl handles the parent's control messages until the stream
// fails, the parent falls silent, or a fatal notice arrives (ErrRefused).
func (s *uplinkSession) readControl(ctx context.Context, silent time.Duration, renewed chan<- struct{}) error {
	u := s.u
	beats := false
	for {
		if beats {
			_ = s.ctrl.SetReadDeadline(time.Now().Add(silent))
		}
		msg, err := control.Read(s.ctrl)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return errors.New("the parent hub closed the control stream")
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("no heartbeat from the parent hub for %s", silent)
			}
			return fmt.Errorf("control stream: %w", err)
		}
		switch msg.Type {
		case control.TypeHeartbeat:
			beats = true
		case control.TypeRenewed:
			leaf, err := u.id.renewed(msg.Cert)
			if err != nil {
				s.log.Error("renewed certificate rejected", "err", err)
				continue
			}
			s.log.Info("site certificate renewed", "valid_until", leaf.NotAfter.UTC().Format(time.RFC3339))
			select {
			case renewed <- struct{}{}:
			default:
			}
		case control.TypeNotice:
			s.log.Warn("parent hub notice", "notice", msg.Notice)
			if msg.Fatal {
				return fmt.Errorf("%w: %s", ErrRefused, msg.Notice)
			}
		case control.TypeAuthorizedKeys, control.TypeSSHTrust:
			// A node's access pushes: a site hub has no SSH server of
			// its own to apply them to.
		default:
			u.hmu.Lock()
			h := u.handlers[msg.Type]
			u.hmu.Unlock()
			if h == nil {
				s.log.Debug("control message from the parent without a handler", "type", msg.Type)
				continue
			}
			h(ctx, msg)
		}
	}
}

// acceptStreams serves the streams the parent opens: route streams go to
// the ServeRoutes callback; anything else is refused.
func (s *uplinkSession) acceptStreams(ctx context.Context, wg *sync.WaitGroup) {
	for {
		st, err := s.tun.AcceptStream(ctx)
		if err != nil {
			return
		}
		wg.Go(func() { s.serveStream(ctx, st) })
	}
}

func (s *uplinkSession) serveStream(ctx context.Context, st tunnel.Stream) {
	_ = st.SetReadDeadline(time.Now().Add(routeTimeout))
	h, err := tunnel.ReadHeader(st)
	if err != nil {
		s.log.Info("bad stream header from the parent", "err", err)
		st.Close()
		return
	}
	if h.Service != tunnel.ServiceRoute {
		_ = tunnel.WriteReply(st, tunnel.Reply{OK: false, Reason: "a site hub serves only route streams from its parent, not " + h.String()})
		st.Close()
		return
	}
	req, err := control.ReadRouteRequest(st)
	if err != nil {
		_ = tunnel.WriteReply(st, tunnel.Reply{OK: false, Reason: "bad route request"})
		st.Close()
		return
	}
	_ = st.SetReadDeadline(time.Time{})
	s.u.hmu.Lock()
	f := s.u.routes
	s.u.hmu.Unlock()
	if f == nil {
		_ = tunnel.WriteReply(st, tunnel.Reply{OK: false, Reason: "site " + s.u.Name() + " does not route streams to its nodes (this hub serves no routes)"})
		st.Close()
		return
	}
	f(ctx, st, req)
}

// checkWelcome is the site's own cycle check: a welcome that lists this
// hub among the hubs above it means the tree loops (a parent that missed
// it, e.g. from a stale subtree), and the uplink must stop.
func checkWelcome(self string, w *control.SiteWelcome) error {
	if slices.Contains(w.Ancestors, self) {
		return fmt.Errorf("%w: this hub (%s) is above its own parent; the tree would loop. Join a hub outside this hub's subtree", ErrCycle, short(self))
	}
	return nil
}
