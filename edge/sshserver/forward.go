package sshserver

import (
	"fmt"
	"net"
	"strconv"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// Port forwarding, as OpenSSH's sshd with GatewayPorts=no and PermitOpen
// limited to the loopback: ssh -L reaches only the node's own loopback
// (127.0.0.1, ::1, localhost), and ssh -R listens only on it. Whether a
// login may forward at all comes from the hub (the operator's roles,
// AuthorizedKey.NoForwarding and SetNoForwardingPrincipals). The protocol
// work is gliderlabs' DirectTCPIPHandler and ForwardedTCPHandler; this file
// decides, gives refusals a reason the client can show, and reports.

// isLoopbackHost reports whether host names the node's loopback.
func isLoopbackHost(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// forwardGrant is how the connection in ctx logged in, if it may forward.
func (s *Server) forwardGrant(ctx ssh.Context) error {
	conn, _ := ctx.Value(ssh.ContextKeyConn).(*gossh.ServerConn)
	key, _ := ctx.Value(ssh.ContextKeyPublicKey).(ssh.PublicKey)
	if conn == nil {
		return fmt.Errorf("port forwarding refused: connection not authenticated")
	}
	g, err := s.check(conn.User(), key)
	if err != nil {
		return fmt.Errorf("port forwarding refused: key not authorized for login %q", conn.User())
	}
	if !s.mayForward(g) {
		return fmt.Errorf(
			"port forwarding refused: none of your roles that select this node allows it (tether role create ... --forwarding)",
		)
	}
	return nil
}

// directTCPIP serves ssh -L (and -W): a channel to a port on the node's
// loopback.
func (s *Server) directTCPIP(srv *ssh.Server, conn *gossh.ServerConn, newChan gossh.NewChannel, ctx ssh.Context) {
	var d struct {
		DestAddr   string
		DestPort   uint32
		OriginAddr string
		OriginPort uint32
	}
	if err := gossh.Unmarshal(newChan.ExtraData(), &d); err != nil {
		newChan.Reject(gossh.ConnectionFailed, "malformed direct-tcpip request")
		return
	}
	dest := net.JoinHostPort(d.DestAddr, strconv.FormatUint(uint64(d.DestPort), 10))
	if reason := s.refuseForward(ctx, conn, "local", dest, d.DestAddr); reason != "" {
		newChan.Reject(gossh.Prohibited, reason)
		return
	}
	s.reportForward(ctx, conn, "local", dest)
	ssh.DirectTCPIPHandler(srv, conn, newChan, ctx)
}

// forwardRequest serves ssh -R ("tcpip-forward") and its cancellation.
// Like sshd with GatewayPorts=no, the listener is on the node's loopback
// whatever bind address the client asked for; a non-loopback address is
// refused rather than silently rebound, so the user learns it.
func (s *Server) forwardRequest(ctx ssh.Context, srv *ssh.Server, req *gossh.Request) (bool, []byte) {
	var p struct {
		BindAddr string
		BindPort uint32
	}
	if err := gossh.Unmarshal(req.Payload, &p); err != nil {
		return false, nil
	}
	conn, _ := ctx.Value(ssh.ContextKeyConn).(*gossh.ServerConn)
	if req.Type == "tcpip-forward" {
		// OpenSSH sends "localhost" when no bind address is given, and ""
		// means "every address" in RFC 4254, which GatewayPorts=no maps to
		// the loopback; so does this server.
		if p.BindAddr == "" {
			p.BindAddr = "localhost"
			req.Payload = gossh.Marshal(&p)
		}
		addr := net.JoinHostPort(p.BindAddr, strconv.FormatUint(uint64(p.BindPort), 10))
		if reason := s.refuseForward(ctx, conn, "remote", addr, p.BindAddr); reason != "" {
			return false, []byte(reason)
		}
		ok, payload := s.remoteForwards.HandleSSHRequest(ctx, srv, req)
		if ok {
			s.reportForward(ctx, conn, "remote", addr)
		}
		return ok, payload
	}
	if p.BindAddr == "" {
		p.BindAddr = "localhost"
		req.Payload = gossh.Marshal(&p)
	}
	return s.remoteForwards.HandleSSHRequest(ctx, srv, req)
}

// refuseForward returns why a forwarding (kind "local" to addr, or
// "remote" listening on addr) is refused, or "" to allow it; refusals are
// logged and reported.
func (s *Server) refuseForward(ctx ssh.Context, conn *gossh.ServerConn, kind, addr, host string) string {
	reason := ""
	if err := s.forwardGrant(ctx); err != nil {
		reason = err.Error()
	} else if !isLoopbackHost(host) {
		where := "to"
		if kind == "remote" {
			where = "on"
		}
		reason = fmt.Sprintf("port forwarding refused: %s is not the node's loopback; "+
			"only forwarding %s 127.0.0.1, ::1 or localhost is allowed", addr, where)
	}
	if reason == "" {
		return ""
	}
	if st := connStateFrom(ctx); st != nil {
		st.log.Info("port forwarding refused", "kind", kind, "addr", addr, "reason", reason)
		if st.firstReport("fwd-refused\x00" + kind + "\x00" + addr) {
			s.emit(s.forwardEvent(ctx, conn, EventForwardRefused, kind+" "+addr+": "+reason))
		}
	}
	return reason
}

// reportForward logs and reports an allowed forwarding, once per
// connection, kind and address (ssh -L opens a channel per TCP connection).
func (s *Server) reportForward(ctx ssh.Context, conn *gossh.ServerConn, kind, addr string) {
	st := connStateFrom(ctx)
	if st == nil || !st.firstReport("fwd\x00"+kind+"\x00"+addr) {
		return
	}
	st.log.Info("port forwarding", "kind", kind, "addr", addr)
	s.emit(s.forwardEvent(ctx, conn, EventForward, kind+" "+addr))
}

func (s *Server) forwardEvent(ctx ssh.Context, conn *gossh.ServerConn, kind EventKind, detail string) Event {
	e := Event{Kind: kind, Detail: detail}
	if conn != nil {
		e.Login = conn.User()
	}
	if key, ok := ctx.Value(ssh.ContextKeyPublicKey).(ssh.PublicKey); ok {
		e.KeyFingerprint = fingerprint(key)
		e.Operator = s.operatorOf(key)
	}
	return e
}
