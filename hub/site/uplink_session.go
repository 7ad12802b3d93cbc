package site

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/resume"
	"github.com/tether-dev/tether/tunnel/siteproto"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// parentPeer is the site's side of the shared uplink client: the parent
// hub, whose fatal notice is ErrRefused.
var parentPeer = uplink.Peer{Name: "parent hub", Refused: ErrRefused}

// uplinkSession is one session with the parent.
type uplinkSession struct {
	u    *Uplink
	conn *uplink.Conn // the tunnel and its control stream
	tun  tunnel.Session
	log  *slog.Logger
}

func (s *uplinkSession) send(m *control.Message) error { return s.conn.Send(m) }

// runOnce makes one session and serves it until it ends.
func (u *Uplink) runOnce(ctx context.Context) (connected bool, err error) {
	s, err := u.dial(ctx)
	if err != nil {
		return false, err
	}
	defer s.tun.Close()
	stop := context.AfterFunc(ctx, func() { s.tun.Close() })
	defer stop()
	w, err := s.conn.Start(ctx, s.hello())
	if err != nil {
		return false, err
	}
	defer s.conn.Control().Close()
	if w.Site == nil {
		return false, errors.New("the parent hub does not take site hubs (its welcome has no site section); upgrade it")
	}
	if err := checkWelcome(u.cfg.HubID, w.Site); err != nil {
		return false, err
	}
	if err := u.id.setPlace(w.Site.Path, w.Site.Ancestors); err != nil {
		u.log.Error("record the parent's welcome", "err", err)
	}
	live := siteLiveness(control.AgentLiveness(u.cfg.Tunnel, w), w.Site)
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
	keep := u.held.Keep(w, func(down time.Duration) string {
		return fmt.Sprintf("site %s's uplink to its parent was down for %s; session ended", u.Name(),
			down.Round(time.Second))
	}, s.log)
	return true, s.serve(ctx, live, queued, keep)
}

// dial opens a tunnel to the first of the parent's addresses that answers.
func (u *Uplink) dial(ctx context.Context) (*uplinkSession, error) {
	cfg := u.id.snapshot()
	tc := pki.ClientTLSConfig(u.id.cert(), u.id.id.CA)
	d := &tunnel.Dialer{TLSConfig: tc, Config: u.cfg.Tunnel, Transport: u.cfg.Transport, Logger: u.log}
	tun, addr, err := uplink.Dial(ctx, d, cfg.Hubs)
	if err != nil {
		return nil, err
	}
	log := u.log.With("parent", addr, "transport", tun.Transport().String())
	return &uplinkSession{u: u, conn: uplink.NewConn(tun, parentPeer, log), tun: tun, log: log}, nil
}

// hello announces this hub as a site.
func (s *uplinkSession) hello() *control.Message {
	u := s.u
	subtree := append([]string{u.cfg.HubID}, u.cfg.Subtree()...)
	slices.Sort(subtree)
	subtree = slices.Compact(subtree)
	if len(subtree) > siteproto.MaxSubtreeHubs {
		subtree = subtree[:siteproto.MaxSubtreeHubs]
	}
	return &control.Message{Type: control.TypeHello, Hello: &control.Hello{
		ProtocolVersion: control.ProtocolVersion,
		Name:            u.id.snapshot().Name,
		AgentVersion:    u.cfg.AgentVersion,
		Facts:           uplink.GatherFacts(),
		Capabilities:    slices.Clone(siteCaps),
		ResumeInstance:  u.held.Instance(),
		Site: &siteproto.Hello{
			Name:    u.id.snapshot().Name,
			HubID:   u.cfg.HubID,
			Subtree: subtree,
			HostCAs: u.cfg.HostCAs,
		},
	}}
}

// siteCaps are what the site announces: it keeps the parent's streams across
// its reconnects (control.CapResume) when the parent's welcome says the
// parent does too.
var siteCaps = []string{siteproto.CapSite, siteproto.CapSiteLiveness, control.CapHeartbeat, control.CapResume}

// siteLiveness is the node's liveness rule (live) with the heartbeat the
// parent's welcome asks of a site: the parent judges a site dead after a
// few of them (siteproto.CapSiteLiveness). How long this site gives a
// silent parent stays the node's rule.
func siteLiveness(live control.Liveness, w *siteproto.Welcome) control.Liveness {
	if w != nil && w.HeartbeatMillis > 0 {
		live.Every = time.Duration(w.HeartbeatMillis) * time.Millisecond
	}
	return live
}

// serve runs a welcomed session: the parent's streams, heartbeats,
// renewal, the status heartbeat and inventory, and the control reader,
// until one ends. It returns only once everything it started has, but for
// the parent's streams when keep is set: those are resumable, and held by
// the uplink rather than the session; the streams held from earlier
// sessions are re-attached over this one first.
func (s *uplinkSession) serve(ctx context.Context, live control.Liveness, queuedSince time.Time,
	keep *resume.Config) error {
	u := s.u
	var wg sync.WaitGroup
	defer wg.Wait()
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	renewed := make(chan struct{}, 1)
	if keep != nil {
		held := u.held.Streams() // all of them from earlier sessions: this one has none yet
		wg.Go(func() { u.held.Resume(sctx, s.tun, held, s.log) })
	}
	wg.Go(func() { s.acceptStreams(sctx, &wg, keep); cancel() })
	waitRenewals := uplink.Renewals(sctx, uplink.Renewal{
		Leaf:     func() *x509.Certificate { return u.id.cert().Leaf },
		Identity: u.id.id, Send: s.send, Renewed: renewed, Log: s.log,
	})
	defer waitRenewals()
	wg.Go(func() { s.conn.Heartbeat(sctx, live.Every) })
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

// readControl handles the parent's control messages (uplink.Conn.ReadControl)
// until the stream fails, the parent falls silent, or a fatal notice
// arrives (ErrRefused).
func (s *uplinkSession) readControl(ctx context.Context, silent time.Duration, renewed chan<- struct{}) error {
	u := s.u
	return s.conn.ReadControl(silent, func(msg *control.Message) error {
		switch msg.Type {
		case control.TypeHeartbeat, control.TypeNotice: // the reader's own
		case control.TypeRenewed:
			leaf, err := u.id.renewed(msg.Cert)
			if err != nil {
				s.log.Error("renewed certificate rejected", "err", err)
				return nil
			}
			s.log.Info("site certificate renewed", "valid_until", leaf.NotAfter.UTC().Format(time.RFC3339))
			select {
			case renewed <- struct{}{}:
			default:
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
				return nil
			}
			h(ctx, msg)
		}
		return nil
	})
}

// acceptStreams serves the streams the parent opens: route streams go to
// the ServeRoutes callback; anything else is refused. Resumable streams
// (keep) are served by the uplink's held streams, under their context and
// not the session's: once answered they outlive the session (until then
// they fail with its tunnel).
func (s *uplinkSession) acceptStreams(ctx context.Context, wg *sync.WaitGroup, keep *resume.Config) {
	for {
		st, err := s.tun.AcceptStream(ctx)
		if err != nil {
			return
		}
		if keep != nil {
			s.u.held.Go(func(ctx context.Context) { s.serveStream(ctx, st, keep) })
			continue
		}
		wg.Go(func() { s.serveStream(ctx, st, nil) })
	}
}

func (s *uplinkSession) serveStream(ctx context.Context, st tunnel.Stream, keep *resume.Config) {
	_ = st.SetReadDeadline(time.Now().Add(routeTimeout))
	h, err := tunnel.ReadHeader(st)
	if err != nil {
		s.log.Info("bad stream header from the parent", "err", err)
		st.Close()
		return
	}
	if h.Service != tunnel.ServiceRoute {
		_ = tunnel.WriteReply(
			st, tunnel.Reply{OK: false, Reason: "a site hub serves only route streams from its parent, not " + h.String()})
		st.Close()
		return
	}
	if keep != nil {
		// The route stream's Open frame; f's answer makes it held
		// (resume.Answered).
		p, err := s.u.held.Accept(st, *keep)
		if err != nil {
			s.log.Info("bad route stream from the parent", "err", err)
			_ = tunnel.WriteReply(st, tunnel.Reply{OK: false, Reason: "bad stream id"})
			st.Close()
			return
		}
		st = p
	}
	req, err := siteproto.ReadRouteRequest(st)
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
		_ = tunnel.WriteReply(
			st,
			tunnel.Reply{
				OK:     false,
				Reason: "site " + s.u.Name() + " does not route streams to its nodes (this hub serves no routes)",
			},
		)
		st.Close()
		return
	}
	f(ctx, st, req)
}

// checkWelcome is the site's own cycle check: a welcome that lists this
// hub among the hubs above it means the tree loops (a parent that missed
// it, e.g. from a stale subtree), and the uplink must stop.
func checkWelcome(self string, w *siteproto.Welcome) error {
	if slices.Contains(w.Ancestors, self) {
		return fmt.Errorf(
			"%w: this hub (%s) is above its own parent; the tree would loop. Join a hub outside this hub's subtree",
			ErrCycle, short(self))
	}
	return nil
}
