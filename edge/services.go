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
)

const headerTimeout = 10 * time.Second

// trustWait bounds how long an ssh stream waits for the session's first
// SSH trust from the hub (sent right after the welcome, so normally a few
// milliseconds); past it the stream is served anyway, as before trust
// existed.
const trustWait = 5 * time.Second

func (a *Agent) acceptStreams(ctx context.Context, sess tunnel.Session, trusted <-chan struct{},
	log *slog.Logger, wg *sync.WaitGroup, live *atomic.Int64) {
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
			a.serveStream(ctx, st, trusted, log)
		}()
	}
}

// serveStream reads the stream header, answers ok or why not, then relays.
// A malformed header closes only this stream.
//
// An ssh stream waits (at most trustWait) until the hub's first SSH trust of
// the session is applied, so the SSH server it reaches already presents its
// host certificate: clients verify it, and without it they refuse the node.
func (a *Agent) serveStream(ctx context.Context, st tunnel.Stream, trusted <-chan struct{}, log *slog.Logger) {
	_ = st.SetReadDeadline(time.Now().Add(headerTimeout))
	h, err := tunnel.ReadHeader(st)
	if err != nil {
		log.Warn("bad stream header; closing stream", "err", err)
		st.Close()
		return
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
			if err := tunnel.WriteReply(st, tunnel.Reply{OK: true}); err != nil {
				st.Close()
				return
			}
			a.sshd.ServeConn(ctx, st)
			return
		}
		a.relayLocal(ctx, st, a.cfg.SSHTarget, refuse, "local sshd")
	case tunnel.ServiceTCP:
		if !a.allow[h.Port] {
			refuse(fmt.Sprintf("port %d is not in this node's allow-list (tether-edge --allow-port)", h.Port))
			return
		}
		a.relayLocal(ctx, st, net.JoinHostPort("127.0.0.1", strconv.Itoa(int(h.Port))), refuse, "local port")
	default:
		refuse(fmt.Sprintf("service %s not supported by this agent", h.Service))
	}
}

func (a *Agent) relayLocal(ctx context.Context, st tunnel.Stream, addr string, refuse func(string), what string) {
	d := net.Dialer{Timeout: 5 * time.Second}
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		refuse(fmt.Sprintf("%s at %s unreachable: %v", what, addr, err))
		return
	}
	if err := tunnel.WriteReply(st, tunnel.Reply{OK: true}); err != nil {
		c.Close()
		st.Close()
		return
	}
	stop := context.AfterFunc(ctx, func() { st.Close(); c.Close() })
	defer stop()
	tunnel.Pipe(st, c.(*net.TCPConn), nil)
}
