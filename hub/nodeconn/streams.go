package nodeconn

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
)

// agentHeaderTimeout bounds how long a stream an agent opened may take to
// send its header.
const agentHeaderTimeout = 10 * time.Second

// serveAgentStreams accepts the streams a node's agent opens on its
// session until ctx ends or the session does. The only streams an agent may
// open besides its control stream are a tunnel.ServiceConnect stream, only
// if it announced siteproto.CapServiceConnect (serviceConnect) and this hub
// serves service tunnels, and a tunnel.ServiceResume stream on a session
// whose streams are resumable (resume.go); anything else is refused and
// audited. On such a session a service connect carries a resume Open frame
// after its header, and once answered is served under held (the hub's
// context, not the session's) by a goroutine the Server waits for, so that
// it outlives the session. The returned wait blocks until the loop and
// every stream it serves for the session have ended: call it after ctx is
// cancelled.
func (s *Server) serveAgentStreams(
	ctx, held context.Context,
	conn *Conn,
	serviceConnect bool,
	log *slog.Logger,
) (wait func()) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			// AcceptStream fails once the session or ctx ends.
			st, err := conn.Session.AcceptStream(ctx)
			if err != nil {
				return
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				s.serveAgentStream(ctx, held, conn, st, serviceConnect, log)
			}()
		}
	}()
	return wg.Wait
}

func (s *Server) serveAgentStream(
	ctx, held context.Context,
	conn *Conn,
	st tunnel.Stream,
	serviceConnect bool,
	log *slog.Logger,
) {
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	_ = st.SetReadDeadline(time.Now().Add(agentHeaderTimeout))
	h, err := tunnel.ReadHeader(st)
	_ = st.SetReadDeadline(time.Time{})
	remote := conn.Session.RemoteAddr().String()
	if err == nil && h.Service == tunnel.ServiceConnect && serviceConnect && conn.resume != nil &&
		conn.resume.connects {
		_ = st.SetReadDeadline(time.Now().Add(agentHeaderTimeout))
		p, err := conn.acceptResumable(st)
		_ = st.SetReadDeadline(time.Time{})
		if err != nil {
			log.Warn("agent stream refused", "err", err, "service", h.Service.String())
			s.refuseAgentStream(conn, st, "bad stream id: "+err.Error(),
				"the agent opened a service connect stream with a bad resume id: "+err.Error())
			return
		}
		// Until it is answered the stream lives on the session's tunnel,
		// and fails with it.
		s.sessions.Go(func() { s.cfg.Services.ServeConnect(held, p, conn.Name, remote) })
		return
	}
	if err == nil && h.Service == tunnel.ServiceConnect && serviceConnect {
		s.cfg.Services.ServeConnect(ctx, st, conn.Name, remote)
		return
	}
	if err == nil && h.Service == tunnel.ServiceResume && conn.resume != nil {
		conn.AcceptResume(ctx, st)
		return
	}
	why := "agents may not open streams to the hub, except service connects for the services they consume"
	detail := "the agent opened a stream to the hub; agents may not open streams other than service connects"
	switch {
	case err != nil:
		detail = "the agent opened a stream with a bad header: " + err.Error()
	case h.Service == tunnel.ServiceConnect && !serviceConnect:
		detail = "service connect stream from an agent that did not announce the service-connect capability"
	case h.Service == tunnel.ServiceConnect:
		why = "this hub does not serve service tunnels"
		detail = "service connect stream while the hub serves no service tunnels"
	case h.Service == tunnel.ServiceResume:
		why = "this session does not keep streams across reconnects"
		detail = "resume stream from an agent whose session does not keep streams (no resume-streams capability)"
	}
	log.Warn("agent stream refused", "err", err, "service", h.Service.String())
	s.refuseAgentStream(conn, st, why, detail)
}

// refuseAgentStream answers st, a stream conn's agent opened, with a
// refusal saying why, and audits it with detail.
func (s *Server) refuseAgentStream(conn *Conn, st tunnel.Stream, why, detail string) {
	s.cfg.Audit.Refusal(
		"stream",
		conn.Session.RemoteAddr().String(),
		store.AuditEvent{Kind: "stream", Node: conn.Name, Result: "refused", Detail: detail},
	)
	_ = st.SetWriteDeadline(time.Now().Add(5 * time.Second))
	_ = tunnel.WriteReply(st, tunnel.Reply{OK: false, Reason: why})
	st.Close()
}
