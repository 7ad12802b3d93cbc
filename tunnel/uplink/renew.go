package uplink

import (
	"context"
	"crypto/x509"
	"log/slog"
	"sync"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
)

// RenewResponseTimeout is how long an uplink waits for the hub to answer a
// renewal before trying again.
const RenewResponseTimeout = 30 * time.Second

// Renewal is what Renewals needs of a session and its identity.
type Renewal struct {
	// Leaf returns the current certificate (it changes on renewal).
	// Required.
	Leaf func() *x509.Certificate
	// Identity signs the CSRs (its key and name). Required.
	Identity *Identity
	// Send writes a message on the control stream. Required.
	Send func(*control.Message) error
	// Renewed receives a value once the session's reader has applied the
	// hub's answer (control.TypeRenewed). Required.
	Renewed <-chan struct{}
	// Log receives the rounds' logs. Required.
	Log *slog.Logger
}

// Renewals asks for a fresh certificate at two thirds of the current one's
// remaining lifetime, and again after each round, for as long as ctx lives.
// Answers arrive on the control stream and are handed over through
// r.Renewed. Between rounds nothing runs but a timer: a session waits days
// for its renewal, and a goroutine parked that long would hold its stack
// for nothing. The returned wait, called after ctx ends, returns once a
// round in progress has.
func Renewals(ctx context.Context, r Renewal) (wait func()) {
	var (
		mu      sync.Mutex // guards t, and running.Add against wait
		t       *time.Timer
		running sync.WaitGroup
	)
	var schedule func() // with mu held
	schedule = func() {
		wait := max(time.Until(r.Leaf().NotAfter)*2/3, time.Second)
		r.Log.Debug("certificate renewal scheduled", "in", wait.Round(time.Millisecond))
		t = time.AfterFunc(wait, func() {
			mu.Lock()
			if ctx.Err() != nil {
				mu.Unlock()
				return
			}
			running.Add(1)
			mu.Unlock()
			defer running.Done()
			if !renewRound(ctx, r) {
				return
			}
			mu.Lock()
			defer mu.Unlock()
			if ctx.Err() == nil {
				schedule()
			}
		})
	}
	mu.Lock()
	schedule()
	mu.Unlock()
	context.AfterFunc(ctx, func() {
		mu.Lock()
		t.Stop()
		mu.Unlock()
	})
	return func() {
		<-ctx.Done()
		mu.Lock() // no round starts after this
		mu.Unlock()
		running.Wait()
	}
}

// renewRound asks the hub for a fresh certificate once and waits up to
// RenewResponseTimeout for the answer. It reports false when the request
// could not be sent (the session is going), so no further round is due.
func renewRound(ctx context.Context, r Renewal) bool {
	csr, err := pki.NewCSR(r.Identity.key, r.Identity.Config.Name)
	if err != nil {
		r.Log.Error("renewal CSR", "err", err)
		return true
	}
	if err := r.Send(&control.Message{Type: control.TypeRenew, CSR: csr}); err != nil {
		r.Log.Info("could not ask for certificate renewal", "err", err)
		return false
	}
	t := time.NewTimer(RenewResponseTimeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-r.Renewed:
	case <-t.C:
		r.Log.Warn("no answer to certificate renewal; will retry", "valid_until", r.Leaf().NotAfter)
	}
	return true
}
