package uplink

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"errors"
	"log/slog"
	"runtime"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/tether-dev/tether/tunnel/control"
)

// TestRenewals runs the renewal schedule on a fake clock: a round at two
// thirds of the remaining lifetime, the next one counted from the renewed
// certificate, a retry (again at two thirds of what is left) when the hub
// does not answer, no goroutine while waiting for a round, none left once
// the session's context ends, and no further round after a failed send.
func TestRenewals(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, key, _ := ed25519.GenerateKey(rand.Reader)
		start := time.Now()
		var leafMu sync.Mutex // guards leaf
		leaf := &x509.Certificate{NotAfter: start.Add(90 * time.Minute)}
		var (
			mu      sync.Mutex
			asked   []time.Duration // when each CSR was sent, from start
			answer  = true          // the fake hub renews
			sendErr error
		)
		renewed := make(chan struct{}, 1)
		send := func(m *control.Message) error {
			if m.Type != control.TypeRenew || len(m.CSR) == 0 {
				t.Errorf("sent %+v, want a renewal with a CSR", m)
			}
			mu.Lock()
			defer mu.Unlock()
			if sendErr != nil {
				return sendErr
			}
			asked = append(asked, time.Since(start))
			if answer { // a 90-minute certificate from now
				leafMu.Lock()
				leaf = &x509.Certificate{NotAfter: time.Now().Add(90 * time.Minute)}
				leafMu.Unlock()
				renewed <- struct{}{}
			}
			return nil
		}
		ctx, cancel := context.WithCancel(context.Background())
		wait := Renewals(ctx, Renewal{
			Leaf:     func() *x509.Certificate { leafMu.Lock(); defer leafMu.Unlock(); return leaf },
			Identity: &Identity{Config: NodeConfig{Name: "n1"}, key: key},
			Send:     send, Renewed: renewed, Log: slog.New(slog.DiscardHandler),
		})
		synctest.Wait()
		if n := renewalGoroutines(); n != 0 {
			t.Errorf("%d renewal goroutines while waiting for the first round, want none (a timer only)", n)
		}

		time.Sleep(2*time.Hour + time.Minute)
		synctest.Wait()
		mu.Lock()
		// 60 min (two thirds of 90), then 60 min after that round.
		want := []time.Duration{60 * time.Minute, 120 * time.Minute}
		if len(asked) != len(want) || asked[0] != want[0] || asked[1] != want[1] {
			t.Errorf("rounds at %v, want %v", asked, want)
		}
		answer = false
		mu.Unlock()

		// Unanswered: the next round 60 min on waits RenewResponseTimeout,
		// then retries at two thirds of the 30 min - 30 s left.
		time.Sleep(60*time.Minute + RenewResponseTimeout + 20*time.Minute - time.Minute)
		synctest.Wait()
		mu.Lock()
		retry := 180*time.Minute + RenewResponseTimeout + (30*time.Minute-RenewResponseTimeout)*2/3
		if len(asked) != 4 || asked[2] != 180*time.Minute || asked[3] != retry {
			t.Errorf("rounds at %v, want a third at 3h and a retry at %v", asked, retry)
		}
		sendErr = errors.New("session closing")
		mu.Unlock()

		// A send that fails ends the schedule: no round after it.
		time.Sleep(time.Hour)
		synctest.Wait()
		mu.Lock()
		if len(asked) != 4 {
			t.Errorf("rounds at %v after a failed send, want none after %v", asked, retry)
		}
		mu.Unlock()
		cancel()
		wait()
		synctest.Wait()
		if n := renewalGoroutines(); n != 0 {
			t.Errorf("%d renewal goroutines after the context ended, want none", n)
		}
	})
}

// renewalGoroutines counts the goroutines running the renewal code, by
// their stacks (runtime.NumGoroutine counts the whole test binary's, whose
// other goroutines may end meanwhile).
func renewalGoroutines() int {
	buf := make([]byte, 1<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "uplink.Renewals") || strings.Contains(g, "uplink.renewRound") {
			n++
		}
	}
	return n
}

// TestRenewalsWaitForARoundInProgress: ending the session while the hub has
// not answered yet ends the round at once, and wait returns after it.
func TestRenewalsWaitForARoundInProgress(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		_, key, _ := ed25519.GenerateKey(rand.Reader)
		leaf := &x509.Certificate{NotAfter: time.Now().Add(3 * time.Second)}
		sent := make(chan struct{}, 1)
		ctx, cancel := context.WithCancel(context.Background())
		wait := Renewals(ctx, Renewal{
			Leaf:     func() *x509.Certificate { return leaf },
			Identity: &Identity{Config: NodeConfig{Name: "n1"}, key: key},
			Send:     func(*control.Message) error { sent <- struct{}{}; return nil },
			Renewed:  make(chan struct{}), Log: slog.New(slog.DiscardHandler),
		})
		<-sent // at 2 s; the round now waits for an answer
		cancel()
		done := make(chan struct{})
		go func() { wait(); close(done) }()
		synctest.Wait()
		select {
		case <-done:
		default:
			t.Fatal("wait did not return once the context ended during a round")
		}
	})
}
