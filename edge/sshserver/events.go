package sshserver

import (
	"net"

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

// recheckConns closes every authenticated connection whose key may no
// longer log in as its login under the trust just installed (an operator
// removed, a key revoked, a role narrowed), so access taken away on the hub
// ends live sessions too, not only new logins.
func (s *Server) recheckConns() {
	s.mu.Lock()
	type victim struct {
		conn net.Conn
		st   *connState
		l    login
	}
	var victims []victim
	for c, st := range s.conns {
		if !st.authenticated.Load() {
			continue
		}
		l := st.getLogin()
		if l.key == nil || s.allowedLogin(l.user, l.key) {
			continue
		}
		victims = append(victims, victim{c, st, l})
	}
	s.mu.Unlock()
	for _, v := range victims {
		v.st.log.Warn("access revoked by the hub; closing the connection", "user", v.l.user, "key", keyDescription(v.l.key))
		v.conn.Close()
		s.emit(Event{Kind: EventAccessRevoked, Login: v.l.user, Operator: v.l.operator, KeyFingerprint: fingerprint(v.l.key),
			Detail: "live connection closed: the hub's trust no longer allows this key and login"})
	}
}
