package sshserver

import (
	"errors"
	"fmt"
	"net"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"
)

// EventKind names something the server reports through Config.OnEvent.
type EventKind string

// Event kinds.
const (
	// EventLoginRefused: a key the node knows (an operator's key or a
	// certificate from a trusted CA) asked for a login it is not granted
	// here. Reported once per connection, login and key.
	EventLoginRefused EventKind = "login-refused"
	// EventLoginAccepted: a connection authenticated (once per
	// connection). Not an audit row of its own: it tells the hub that the
	// jump carrying the connection logged in.
	EventLoginAccepted EventKind = "login-accepted"
	// EventLoginFailed: a connection ended without logging in (after any
	// EventLoginRefused it had). Like EventLoginAccepted, an outcome for
	// the hub's jump row, not an audit row of its own.
	EventLoginFailed EventKind = "login-failed"
	// EventForward: a port forwarding was set up (ssh -L: once per
	// connection and destination; ssh -R: once per listener).
	EventForward EventKind = "forward"
	// EventForwardRefused: a port forwarding was refused (not allowed for
	// the key, or not to or on the node's loopback).
	EventForwardRefused EventKind = "forward-refused"
	// EventAccessRevoked: a live connection was closed because the trust
	// the hub pushed no longer allows its key and login.
	EventAccessRevoked EventKind = "access-revoked"
)

// Event is a security-relevant happening on the server, for the hub's audit.
type Event struct {
	Kind           EventKind
	Login          string // the login asked for
	Operator       string // whose key, if the node knows (authorized_keys comment or certificate key id)
	KeyFingerprint string // SHA256 fingerprint of the key (of a certificate's key)
	Detail         string // human-readable: the reason, or the forwarding
}

// emit hands e to Config.OnEvent, if set.
func (s *Server) emit(e Event) {
	if s.cfg.OnEvent != nil {
		s.cfg.OnEvent(e)
	}
}

// firstReport reports whether key (what was reported) was not reported on
// this connection yet, and marks it. The set is bounded so a client cannot
// grow it without limit; past the bound nothing more is reported.
func (st *connState) firstReport(key string) bool {
	st.mu.Lock()
	defer st.mu.Unlock()
	if _, ok := st.reported[key]; ok || len(st.reported) >= maxReportsPerConn {
		return false
	}
	if st.reported == nil {
		st.reported = make(map[string]struct{})
	}
	st.reported[key] = struct{}{}
	return true
}

// maxReportsPerConn bounds the events one connection can cause.
const maxReportsPerConn = 32

// firstRefusal is firstReport for a refused login.
func (st *connState) firstRefusal(user string, key gossh.PublicKey) bool {
	return st.firstReport("refused\x00" + user + "\x00" + string(key.Marshal()))
}

// login is who a connection authenticated as; zero before authentication.
type login struct {
	user     string
	key      gossh.PublicKey
	operator string // whose key, as far as the node knows (operatorOf)
}

func (st *connState) setLogin(l login) {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.login = l
}

func (st *connState) getLogin() login {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.login
}

// revokeGrace bounds how long a connection whose access was withdrawn
// stays open after its sessions were told why and ended: the client
// normally hangs up at once, having printed the reason.
const revokeGrace = time.Second

// liveSessions is a connection's shell and exec sessions, and whether
// recheckConns already closed it.
type liveSessions struct {
	set     map[ssh.Session]struct{}
	revoked bool
}

// addSession registers sess with its connection until the returned func
// is called.
func (st *connState) addSession(sess ssh.Session) (remove func()) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.sessions.set == nil {
		st.sessions.set = map[ssh.Session]struct{}{}
	}
	st.sessions.set[sess] = struct{}{}
	return func() {
		st.mu.Lock()
		defer st.mu.Unlock()
		delete(st.sessions.set, sess)
	}
}

// revoke marks the connection as closed for withdrawn access and returns
// its live sessions; first is false if it was marked already (an earlier
// trust change closed it, and it is still winding down).
func (st *connState) revoke() (sessions []ssh.Session, first bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.sessions.revoked {
		return nil, false
	}
	st.sessions.revoked = true
	for sess := range st.sessions.set {
		sessions = append(sessions, sess)
	}
	return sessions, true
}

// withdrawnReason says why l may no longer log in, err being check's
// answer, in the words the operator and the audit read.
func withdrawnReason(l login, err error) string {
	fp := fingerprint(l.key)
	var r *refusal
	switch {
	case errors.Is(err, errKeyRevoked):
		return "the hub revoked key " + fp
	case errors.As(err, &r):
		return fmt.Sprintf("key %s may no longer log in as %q here", fp, l.user)
	default:
		return fmt.Sprintf("key %s is no longer accepted here: "+
			"its operator was removed or their roles no longer select this node", fp)
	}
}

// recheckConns ends every authenticated connection whose key may no longer
// log in as its login under the trust just installed (an operator removed,
// a key revoked, a role narrowed), so access taken away on the hub ends
// live sessions too, not only new logins. Each session is first told why
// on its stderr, which the operator's ssh prints, and ended; the
// connection closes when the client hangs up, revokeGrace at the latest.
// A connection is reported once, however many trust changes (keys, then
// trust) arrive while it winds down.
func (s *Server) recheckConns() {
	s.mu.Lock()
	type victim struct {
		conn net.Conn
		st   *connState
		l    login
		why  string
	}
	var victims []victim
	for c, st := range s.conns {
		if !st.authenticated.Load() {
			continue
		}
		l := st.getLogin()
		if l.key == nil {
			continue
		}
		if _, err := s.check(l.user, l.key); err != nil {
			victims = append(victims, victim{c, st, l, withdrawnReason(l, err)})
		}
	}
	s.mu.Unlock()
	for _, v := range victims {
		sessions, first := v.st.revoke()
		if !first {
			continue
		}
		v.st.log.Warn("access revoked by the hub; closing the connection", "user", v.l.user,
			"key", keyDescription(v.l.key), "reason", v.why)
		s.emit(Event{Kind: EventAccessRevoked, Login: v.l.user, Operator: v.l.operator, KeyFingerprint: fingerprint(v.l.key),
			Detail: "live connection closed: " + v.why})
		for _, sess := range sessions {
			fmt.Fprintf(sess.Stderr(), "\r\ntether: your access to this node was withdrawn (%s); session ended\r\n", v.why)
			_ = sess.Exit(255)
		}
		if len(sessions) == 0 {
			v.conn.Close()
			continue
		}
		time.AfterFunc(revokeGrace, func() { v.conn.Close() })
	}
}
