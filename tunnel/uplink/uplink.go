// Package uplink is the one uplink client that agents and site hubs share: enrolment with a join string
// (Enroll), the identity it yields, the connection to the hub above (Dial, then a Conn's control stream:
// hello, welcome, heartbeats, the reader with its silence deadline), certificate renewal (Renewals), the
// streams that outlive a session (Held: held across a reconnect, re-attached on the next session) and the
// reconnect loop with capped, jittered backoff (Retry).
//
// The node agent (edge) keeps itself connected to its hub with it, and a site hub (hub/site) to its parent.
// Each plugs in what is its own: the Peer it names in errors, its hello and what it does with the welcome,
// the streams the hub opens to it, a handler for the other control messages (Conn.ReadControl), and Retry's
// hooks (when to stop for good, what to report while waiting). So a fix to how an uplink connects, beats or
// backs off lands in both, and the hub binary links no agent code.
//
// It imports tunnel, pki and the wire contracts only.
package uplink

import (
	"context"
	"math/rand/v2"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

// Timeouts of one connection attempt.
const (
	DialTimeout    = 20 * time.Second // per hub address
	OpenCtlTimeout = 10 * time.Second // opening the control stream
	WelcomeTimeout = 15 * time.Second // from hello to welcome
	SendTimeout    = 10 * time.Second // one control message
)

// Default bounds of the reconnect backoff.
const (
	DefaultBackoffMin = 500 * time.Millisecond
	DefaultBackoffMax = 30 * time.Second
)

// Retry is the reconnect loop of an uplink: attempt, and after a failed or
// ended attempt wait a capped exponential backoff with full jitter (reset
// once an attempt got connected), until the context ends or the role says
// an error is final.
type Retry struct {
	// BackoffMin and BackoffMax bound the backoff; zero means
	// DefaultBackoffMin and DefaultBackoffMax.
	BackoffMin, BackoffMax time.Duration
	// RetryAfter, if set, waits for the hub's retry-after hint
	// (tunnel.RetryAfter: a hub at its handshake limit names when it can
	// take us) instead of the backoff, spread by Hinted.
	RetryAfter bool
	// Before, if set, runs before each attempt; its error ends Run with
	// that error.
	Before func() error
	// Stop, if set, is given each attempt's error (after the context is
	// checked); a non-nil result ends Run with that result.
	Stop func(err error) error
	// Waiting, if set, is told each attempt's error and the wait before
	// the next attempt.
	Waiting func(err error, wait time.Duration)
}

// Run calls once until ctx ends (nil) or Before or Stop end it (their
// error). once reports whether it got connected, which resets the backoff.
func (r *Retry) Run(ctx context.Context, once func(ctx context.Context) (connected bool, err error)) error {
	lo, hi := r.BackoffMin, r.BackoffMax
	if lo <= 0 {
		lo = DefaultBackoffMin
	}
	if hi <= 0 {
		hi = DefaultBackoffMax
	}
	attempt := 0
	for {
		if r.Before != nil {
			if err := r.Before(); err != nil {
				return err
			}
		}
		connected, err := once(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if r.Stop != nil {
			if serr := r.Stop(err); serr != nil {
				return serr
			}
		}
		if connected {
			attempt = 0
		}
		wait := Backoff(attempt, lo, hi)
		if hint, ok := tunnel.RetryAfter(err); r.RetryAfter && ok && hint > 0 {
			// The hub was at its handshake limit and said when it can
			// take us: its queue, not our guess.
			wait = Hinted(hint, hi)
		}
		attempt++
		if r.Waiting != nil {
			r.Waiting(err, wait)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(wait):
		}
	}
}

// Hinted is the wait for a hub's retry-after hint: the hint ±20 %, so
// uplinks handed the same second do not return in the same instant, and
// never past the backoff cap (the hint is not authenticated: it comes
// before the TLS handshake).
func Hinted(hint, cap time.Duration) time.Duration {
	hint = min(hint, cap)
	j := time.Duration(rand.Int64N(int64(hint)*2/5+1)) - hint/5
	return min(hint+j, cap)
}

// Backoff is "full jitter": uniform in [0, min(cap, base*2^attempt)], with
// half the base as a floor so a flapping hub is not hammered.
func Backoff(attempt int, base, max time.Duration) time.Duration {
	d := base
	for i := 0; i < attempt && d < max; i++ {
		d *= 2
	}
	if d > max {
		d = max
	}
	return base/2 + time.Duration(rand.Int64N(int64(d)))
}
