package edge

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// ErrRejoinNeeded means the node certificate expired while the agent was
// offline; the hub will not accept it, so the node must join again.
var ErrRejoinNeeded = errors.New("node certificate expired: re-join needed")

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

// renewals runs the shared renewal schedule (uplink.Renewals) for the
// node's identity on one session.
func (a *Agent) renewals(ctx context.Context, send func(*control.Message) error, renewed <-chan struct{},
	log *slog.Logger) (wait func()) {
	return uplink.Renewals(ctx, uplink.Renewal{
		Leaf:     func() *x509.Certificate { return a.cert().Leaf },
		Identity: a.id, Send: send, Renewed: renewed, Log: log,
	})
}

// applyRenewed checks and stores a renewed certificate: it must chain to the
// hub CA and be for this node's key. The file is replaced atomically; the
// live session keeps running and the next connection uses the new cert.
func (a *Agent) applyRenewed(pemChain string) error {
	a.idMu.Lock()
	defer a.idMu.Unlock()
	certs, cert, err := uplink.VerifyRenewed(pemChain, a.id.NodeCA, a.id.Key())
	if err != nil {
		return err
	}
	if a.cfg.StateDir != "" {
		if err := pki.WriteFileAtomic(filepath.Join(a.cfg.StateDir, certFile), pki.EncodeCerts(certs...), 0o600); err != nil {
			return err
		}
	}
	a.id.Cert = cert
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
