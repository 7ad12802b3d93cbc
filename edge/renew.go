package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"sync"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
)

// ErrRejoinNeeded means the node certificate expired while the agent was
// offline; the hub will not accept it, so the node must join again.
var ErrRejoinNeeded = errors.New("node certificate expired: re-join needed")

// renewResponseTimeout is how long the agent waits for the hub to answer a
// renewal before trying again.
const renewResponseTimeout = 30 * time.Second

// cert returns the current client certificate (it changes on renewal).
func (a *Agent) cert() tls.Certificate {
	a.idMu.Lock()
	defer a.idMu.Unlock()
	return a.id.Cert
}

// checkExpiry refuses to dial with an expired certificate, with a message
// that says what to do instead of an opaque TLS alert.
func (a *Agent) checkExpiry() error {
	leaf := a.cert().Leaf
	if time.Now().After(leaf.NotAfter) {
		return fmt.Errorf("%w: it expired at %s while this node was offline",
			ErrRejoinNeeded, leaf.NotAfter.UTC().Format(time.RFC3339))
	}
	return nil
}

// renewals asks for a fresh certificate at two thirds of the current one's
// remaining lifetime, and again after each round, for as long as ctx lives.
// Answers arrive on the control stream and are handed over through renewed.
// Between rounds nothing runs but a timer: a session waits days for its
// renewal, and a goroutine parked that long would hold its stack for
// nothing. The returned wait, called after ctx ends, returns once a round in
// progress has.
func (a *Agent) renewals(ctx context.Context, send func(*control.Message) error, renewed <-chan struct{}, log *slog.Logger) (wait func()) {
	var (
		mu      sync.Mutex // guards t, and running.Add against wait
		t       *time.Timer
		running sync.WaitGroup
	)
	var schedule func() // with mu held
	schedule = func() {
		wait := max(time.Until(a.cert().Leaf.NotAfter)*2/3, time.Second)
		log.Debug("certificate renewal scheduled", "in", wait.Round(time.Millisecond))
		t = time.AfterFunc(wait, func() {
			mu.Lock()
			if ctx.Err() != nil {
				mu.Unlock()
				return
			}
			running.Add(1)
			mu.Unlock()
			defer running.Done()
			if !a.renewRound(ctx, send, renewed, log) {
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
// renewResponseTimeout for the answer. It reports false when the request
// could not be sent (the session is going), so no further round is due.
func (a *Agent) renewRound(ctx context.Context, send func(*control.Message) error, renewed <-chan struct{}, log *slog.Logger) bool {
	csr, err := pki.NewCSR(a.id.key, a.id.Config.Name)
	if err != nil {
		log.Error("renewal CSR", "err", err)
		return true
	}
	if err := send(&control.Message{Type: control.TypeRenew, CSR: csr}); err != nil {
		log.Info("could not ask for certificate renewal", "err", err)
		return false
	}
	t := time.NewTimer(renewResponseTimeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-renewed:
	case <-t.C:
		log.Warn("no answer to certificate renewal; will retry", "valid_until", a.cert().Leaf.NotAfter)
	}
	return true
}

// applyRenewed checks and stores a renewed certificate: it must chain to the
// hub CA and be for this node's key. The file is replaced atomically; the
// live session keeps running and the next connection uses the new cert.
func (a *Agent) applyRenewed(pemChain string) error {
	certs, err := pki.ParseCerts([]byte(pemChain))
	if err != nil {
		return err
	}
	a.idMu.Lock()
	defer a.idMu.Unlock()
	inter := x509.NewCertPool()
	for _, c := range certs[1:] {
		inter.AddCert(c)
	}
	if _, err := certs[0].Verify(x509.VerifyOptions{Roots: poolOf(a.id.NodeCA), Intermediates: inter,
		KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}); err != nil {
		return fmt.Errorf("renewed certificate does not verify: %w", err)
	}
	if !samePublicKey(certs[0].PublicKey, a.id.key.Public()) {
		return errors.New("renewed certificate is not for this node's key")
	}
	if a.cfg.StateDir != "" {
		if err := pki.WriteFileAtomic(filepath.Join(a.cfg.StateDir, certFile), pki.EncodeCerts(certs...), 0o600); err != nil {
			return err
		}
	}
	chain := make([][]byte, len(certs))
	for i, c := range certs {
		chain[i] = c.Raw
	}
	a.id.Cert = tls.Certificate{Certificate: chain, PrivateKey: a.id.Cert.PrivateKey, Leaf: certs[0]}
	a.tickets = nil // a resumed session would carry the old certificate
	return nil
}

// sessionCache is the TLS session cache for the next dial.
func (a *Agent) sessionCache() tls.ClientSessionCache {
	a.idMu.Lock()
	defer a.idMu.Unlock()
	if a.tickets == nil {
		a.tickets = tls.NewLRUClientSessionCache(4)
	}
	return a.tickets
}
