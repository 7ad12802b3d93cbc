package uplink

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
)

// DialStagger is how long Dial gives one hub address before it dials the
// next one too. A live hub answers well within it (a handshake is one or
// two round trips), so an uplink whose link blipped goes back to the hub
// it was on, and its streams with it; a dead hub, whose dial only ends
// with the handshake timeout, holds the others back this long at most.
const DialStagger = time.Second

// MaxHubs bounds the hub addresses an uplink keeps (MergeHubs).
const MaxHubs = 16

// Dial opens a tunnel with d to the first of addrs that answers, each
// address having DialTimeout. It dials addrs[0] first and the next address
// as soon as the one before failed or has not answered for DialStagger
// (RFC 8305's "connection attempt delay", across hubs): the first to
// answer wins and the others are closed. It returns the address that
// answered, or every address's error.
func Dial(ctx context.Context, d *tunnel.Dialer, addrs []string) (tunnel.Session, string, error) {
	return dialStaggered(ctx, d.Dial, addrs, DialStagger)
}

func dialStaggered(ctx context.Context, dial func(ctx context.Context, addr string) (tunnel.Session, error),
	addrs []string, stagger time.Duration) (tunnel.Session, string, error) {
	if len(addrs) == 0 {
		return nil, "", errors.New("no hub address to dial (node.json lists none; re-join)")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	type result struct {
		i   int
		s   tunnel.Session
		err error
	}
	results := make(chan result, len(addrs)) // buffered: attempts never block on send
	next, pending := 0, 0
	timer := time.NewTimer(stagger)
	defer timer.Stop()
	startNext := func() {
		if next == len(addrs) {
			return
		}
		i := next
		next++
		pending++
		go func() {
			dctx, cancel := context.WithTimeout(ctx, DialTimeout)
			defer cancel()
			s, err := dial(dctx, addrs[i])
			results <- result{i, s, err}
		}()
		timer.Reset(stagger)
	}
	startNext()
	var (
		won  tunnel.Session
		at   string
		errs = make([]error, len(addrs))
	)
	// Every attempt is waited for, so nothing outlives Dial but the winner.
	for pending > 0 {
		select {
		case <-timer.C:
			if won == nil {
				startNext()
			}
		case r := <-results:
			pending--
			switch {
			case r.err == nil && won == nil:
				won, at = r.s, addrs[r.i]
				cancel()
			case r.err == nil:
				_ = r.s.Close()
			default:
				errs[r.i] = fmt.Errorf("%s: %w", addrs[r.i], r.err)
				if won == nil {
					startNext()
				}
			}
		}
	}
	if won != nil {
		return won, at, nil
	}
	return nil, "", errors.Join(errs...)
}

// Prefer returns addrs with addr first, if it is one of them: the hub an
// uplink was connected to is dialed first again, so a blip of the link
// brings the uplink back to the same hub (and its streams with it), and a
// replica that died costs it DialStagger before the next one is dialed.
func Prefer(addrs []string, addr string) []string {
	i := slices.Index(addrs, addr)
	if i <= 0 {
		return addrs
	}
	out := make([]string, 0, len(addrs))
	out = append(out, addr)
	out = append(out, addrs[:i]...)
	return append(out, addrs[i+1:]...)
}

// Rotate returns addrs with the first moved last: after a hub answered the
// dial but the handshake failed, the next attempt starts at another hub, so
// one that is up but cannot admit the uplink is not the first one asked
// every time.
func Rotate(addrs []string) []string {
	if len(addrs) < 2 {
		return addrs
	}
	return append(slices.Clone(addrs[1:]), addrs[0])
}

// MergeHubs adds to known the addresses of announced it lacks (a hub
// announces the live replicas' addresses in its welcome), skipping those
// that are not HOST:PORT, and reports whether it added any. Known
// addresses stay even when not announced, since a replica down now may be
// the one that answers later, unless room is needed: past MaxHubs, known
// addresses the hub did not announce go first, from the end.
func MergeHubs(known, announced []string) ([]string, bool) {
	var add []string
	for _, a := range announced {
		if !slices.Contains(known, a) && !slices.Contains(add, a) && pki.ValidateHubAddr(a) == nil {
			add = append(add, a)
		}
	}
	if len(add) == 0 {
		return known, false
	}
	out := slices.Clone(known)
	for i := len(out) - 1; i >= 0 && len(out)+len(add) > MaxHubs; i-- {
		if !slices.Contains(announced, out[i]) {
			out = slices.Delete(out, i, i+1)
		}
	}
	out = append(out, add...)
	if len(out) > MaxHubs {
		out = out[:MaxHubs]
	}
	return out, !slices.Equal(out, known)
}
