package edge

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/resume"
)

const headerTimeout = 10 * time.Second

// trustWait bounds how long an ssh stream waits for the session's first
// SSH trust from the hub (sent right after the welcome, so normally a few
// milliseconds); past it the stream is served anyway, as before trust
// existed.
const trustWait = 5 * time.Second

// acceptStreams serves the streams the hub opens on sess until it ends.
// keep, if set, makes them resumable (resume.go): each carries an id after
// its header and, once answered, is held by the agent rather than by this
// session, so it is served on beyond the session's end.
func (a *Agent) acceptStreams(ctx context.Context, sess tunnel.Session, trusted <-chan struct{},
	log *slog.Logger, wg *sync.WaitGroup, live *atomic.Int64, keep *resume.Config) {
	for {
		st, err := sess.AcceptStream(ctx)
		if err != nil {
			return
		}
		wg.Add(1)
		live.Add(1)
		go func() {
			defer wg.Done()
			defer live.Add(-1)
			a.serveStream(ctx, st, trusted, log, keep)
		}()
	}
}

// serveStream reads the stream header, answers ok or why not, then relays.
// A malformed header closes only this stream.
//
// An ssh stream waits (at most trustWait) until the hub's first SSH trust of
// the session is applied, so the SSH server it reaches already presents its
// host certificate: clients verify it, and without it they refuse the node.
func (a *Agent) serveStream(ctx context.Context, st tunnel.Stream, trusted <-chan struct{}, log *slog.Logger,
	keep *resume.Config) {
	_ = st.SetReadDeadline(time.Now().Add(headerTimeout))
	h, err := tunnel.ReadHeader(st)
	if err != nil {
		log.Warn("bad stream header; closing stream", "err", err)
		st.Close()
		return
	}
	// accepted answers ok and hands the relay on: to this session's
	// goroutine, or for a resumable stream to the agent's held streams.
	// It reports whether the relay ran or was handed on.
	accepted := func(relay func(context.Context, tunnel.Stream)) bool {
		if err := tunnel.WriteReply(st, tunnel.Reply{OK: true}); err != nil {
			st.Close()
			return false
		}
		relay(ctx, st)
		return true
	}
	if keep != nil {
		pending, err := a.held.Accept(st, *keep)
		if err != nil {
			log.Warn("bad stream id; closing stream", "service", h.Service.String(), "err", err)
			st.Close()
			return
		}
		accepted = func(relay func(context.Context, tunnel.Stream)) bool {
			if err := tunnel.WriteReply(st, tunnel.Reply{OK: true}); err != nil {
				st.Close()
				return false
			}
			rs, err := resume.Answered(pending)
			if err != nil {
				log.Warn("stream not held; closing it", "err", err)
				return false
			}
			a.held.Go(func(ctx context.Context) { relay(ctx, rs) })
			return true
		}
	}
	_ = st.SetReadDeadline(time.Time{})
	refuse := func(reason string) {
		log.Info("stream refused", "service", h.Service.String(), "port", h.Port, "reason", reason)
		_ = tunnel.WriteReply(st, tunnel.Reply{OK: false, Reason: reason})
		st.Close()
	}
	switch h.Service {
	case tunnel.ServiceSSH:
		t := time.NewTimer(trustWait)
		select {
		case <-trusted:
		case <-ctx.Done():
			t.Stop()
			st.Close()
			return
		case <-t.C:
			log.Warn("serving an ssh stream before the hub's SSH trust arrived", "waited", trustWait)
		}
		t.Stop()
		if a.sshd != nil {
			accepted(func(ctx context.Context, st tunnel.Stream) { a.sshd.ServeConn(ctx, st) })
			return
		}
		a.relayLocal(ctx, st, a.cfg.SSHTarget, refuse, accepted, "local sshd")
	case tunnel.ServiceTCP:
		if !a.allow[h.Port] {
			refuse(fmt.Sprintf("port %d is not in this node's allow-list (tether-edge --allow-port)", h.Port))
			return
		}
		a.relayLocal(ctx, st, net.JoinHostPort("127.0.0.1", strconv.Itoa(int(h.Port))), refuse, accepted, "local port")
	default:
		refuse(fmt.Sprintf("service %s not supported by this agent", h.Service))
	}
}

// relayLocal connects st to the local TCP address addr, answering the hub
// through refuse or accepted.
func (a *Agent) relayLocal(ctx context.Context, st tunnel.Stream, addr string, refuse func(string),
	accepted func(func(context.Context, tunnel.Stream)) bool, what string) {
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		refuse(fmt.Sprintf("%s at %s unreachable: %v", what, addr, err))
		return
	}
	relayed := accepted(func(ctx context.Context, st tunnel.Stream) {
		stop := context.AfterFunc(ctx, func() { st.Close(); c.Close() })
		defer stop()
		tunnel.Pipe(st, c.(*net.TCPConn), nil)
	})
	if !relayed {
		c.Close() // the answer did not get through
	}
}
