package bastion

import (
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/gliderlabs/ssh"
	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/ratelimit"
)

// LoginFailure is a connection that ended without authenticating, or one
// refused because its source failed too often. The hub audits them.
type LoginFailure struct {
	Remote   string
	User     string // last user name tried, if any
	Attempts int    // public keys offered and refused
	// Result is "refused" (authentication failed or the client gave up),
	// "timeout" (the handshake did not finish in time: slowloris), or
	// "rate_limited" (refused at connect: too many failures from Remote).
	Result string
	Reason string
	// Suppressed counts rate_limited refusals of the same source not
	// reported since the previous report (see ratelimit.Refusal).
	Suppressed int
}

// guardedConn watches one operator connection until it authenticates: the
// handshake deadline, the attempts made, and — if it never authenticates —
// the failure it reports when it is closed.
type guardedConn struct {
	net.Conn
	b        *Bastion
	src      string
	limited  time.Duration      // >0: refused by the rate limiter, retry after this
	deadline time.Time          // end of the handshake
	attempt  *ratelimit.Attempt // counted against src until it authenticates

	authed    atomic.Bool
	closeOnce sync.Once
	doneOnce  sync.Once // ends attempt

	mu       sync.Mutex
	user     string
	attempts int
	timedOut bool
}

func (g *guardedConn) Read(p []byte) (int, error) {
	n, err := g.Conn.Read(p)
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) && !g.authed.Load() {
		g.mu.Lock()
		g.timedOut = true
		g.mu.Unlock()
	}
	return n, err
}

// gliderlabs resets the deadline before every read and write (to its idle
// and max timeouts, zero when unset), which would lift the handshake
// deadline at once: until the client authenticates, no deadline goes past
// the handshake's.
func (g *guardedConn) bound(t time.Time) time.Time {
	if !g.authed.Load() && !g.deadline.IsZero() && (t.IsZero() || t.After(g.deadline)) {
		return g.deadline
	}
	return t
}

func (g *guardedConn) SetDeadline(t time.Time) error      { return g.Conn.SetDeadline(g.bound(t)) }
func (g *guardedConn) SetReadDeadline(t time.Time) error  { return g.Conn.SetReadDeadline(g.bound(t)) }
func (g *guardedConn) SetWriteDeadline(t time.Time) error { return g.Conn.SetWriteDeadline(g.bound(t)) }

func (g *guardedConn) Close() error {
	err := g.Conn.Close()
	g.closeOnce.Do(func() {
		g.endAttempt(!g.authed.Load())
		if g.authed.Load() || g.limited > 0 {
			return
		}
		g.mu.Lock()
		f := LoginFailure{Remote: g.RemoteAddr().String(), User: g.user, Attempts: g.attempts, Result: "refused"}
		timedOut := g.timedOut
		g.mu.Unlock()
		switch {
		case timedOut:
			f.Result, f.Reason = "timeout", fmt.Sprintf("SSH handshake not completed within %s", g.b.cfg.HandshakeTimeout)
		case f.Attempts > 0:
			f.Reason = fmt.Sprintf("authentication failed (%d key(s) refused)", f.Attempts)
		default:
			f.Reason = "connection closed before authenticating"
		}
		g.b.loginFailed(f)
	})
	return err
}

// endAttempt tells the rate limiter how the attempt ended, once.
func (g *guardedConn) endAttempt(failed bool) {
	if g.attempt != nil {
		g.doneOnce.Do(func() { g.attempt.Done(failed) })
	}
}

// authLog is the gossh AuthLogCallback of g's connection.
func (g *guardedConn) authLog(meta gossh.ConnMetadata, method string, err error) {
	if err == nil && method == "publickey" {
		// Lift the handshake deadline only once a signature verified,
		// not when a key is merely queried.
		g.authed.Store(true)
		_ = g.Conn.SetDeadline(time.Time{})
		g.endAttempt(false) // a long session must not hold its source's share
		return
	}
	if err != nil && method != "none" { // "none" is every client's first probe
		g.mu.Lock()
		g.user = fmt.Sprintf("%.64s", meta.User())
		g.attempts++
		g.mu.Unlock()
	}
}

func (b *Bastion) loginFailed(f LoginFailure) {
	b.cfg.Logger.Info("operator login failed", "remote", f.Remote, "user", f.User, "result", f.Result, "reason", f.Reason)
	if b.cfg.OnLoginFailure != nil {
		b.cfg.OnLoginFailure(f)
	}
}

// accept is the ConnCallback: it refuses sources that failed too often
// (cheaply, or now and then with an explanation the client shows), and
// arms the handshake deadline of the others.
func (b *Bastion) accept(ctx ssh.Context, conn net.Conn) net.Conn {
	g := &guardedConn{Conn: conn, b: b, src: ratelimit.Source(conn.RemoteAddr().String())}
	if b.cfg.Limiter != nil {
		attempt, retry := b.cfg.Limiter.Begin(g.src)
		g.attempt = attempt
		if attempt == nil {
			if b.cfg.RateLimited != nil {
				b.cfg.RateLimited.Inc()
			}
			r := b.cfg.Limiter.Refused(g.src)
			if r.Report {
				f := LoginFailure{Remote: conn.RemoteAddr().String(), Result: "rate_limited", Suppressed: r.Suppressed,
					Reason: fmt.Sprintf("too many failed logins from %s; refusing connections for %s",
						g.src, retry.Round(time.Second))}
				b.cfg.Logger.Warn(
					"operator logins rate limited", "remote", f.Remote, "reason", f.Reason, "suppressed", f.Suppressed,
				)
				if b.cfg.OnLoginFailure != nil {
					b.cfg.OnLoginFailure(f)
				}
			}
			if !r.Explain {
				// RFC 4253 4.2 lets a server send lines before its version;
				// OpenSSH shows them with -v. Then close: no key exchange.
				_ = conn.SetWriteDeadline(time.Now().Add(time.Second))
				_, _ = fmt.Fprintf(
					conn, "tether: too many failed SSH logins from %s; try again in %s\r\n", g.src, retry.Round(time.Second),
				)
				return nil
			}
			// Now and then, a full handshake whose banner says why, so a
			// person behind that address learns what happened.
			g.limited = retry
		}
	}
	// Bound the unauthenticated phase; cleared once a key is accepted.
	g.deadline = time.Now().Add(b.cfg.HandshakeTimeout)
	_ = conn.SetDeadline(g.deadline)
	ctx.SetValue(guardKey{}, g)
	return g
}

type guardKey struct{}

func guardOf(ctx ssh.Context) *guardedConn {
	g, _ := ctx.Value(guardKey{}).(*guardedConn)
	return g
}

// banner is shown by clients before authentication; only refused sources
// get one.
func (g *guardedConn) banner(gossh.ConnMetadata) string {
	if g.limited == 0 {
		return ""
	}
	return fmt.Sprintf(
		"tether: too many failed SSH logins from %s; try again in %s\n",
		g.src, g.limited.Round(time.Second),
	)
}
