package tunnel

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"sync"
	"time"

	"github.com/quic-go/quic-go"
)

// errBusy refuses a QUIC connection attempt while ListenConfig.MaxHandshakes
// handshakes are in progress.
var errBusy = errors.New("tunnel: too many handshakes in progress")

type admissionKey struct{}

// quicAdmission is quic.Transport.ConnContext: it takes a slot of sem for
// every new connection (refusing it with CONNECTION_REFUSED when there is
// none, before any cryptography) and gives it back once the connection is
// accepted (admitted) or has ended without being accepted.
func quicAdmission(sem chan struct{}) func(context.Context, *quic.ClientInfo) (context.Context, error) {
	return func(ctx context.Context, _ *quic.ClientInfo) (context.Context, error) {
		select {
		case sem <- struct{}{}:
		default:
			return nil, errBusy
		}
		release := sync.OnceFunc(func() { <-sem })
		ctx = context.WithValue(ctx, admissionKey{}, release)
		context.AfterFunc(ctx, release)
		return ctx, nil
	}
}

// admitted gives back the admission slot of an accepted QUIC connection.
func admitted(ctx context.Context) {
	if release, ok := ctx.Value(admissionKey{}).(func()); ok {
		release()
	}
}

// ticketEpoch is how long one session ticket key encrypts new tickets; the
// previous epoch's key still decrypts, so a ticket stays usable for one to
// two epochs.
const ticketEpoch = 24 * time.Hour

// ticketKeys sets a TLS config's session ticket keys from a long-term secret
// (the hub's QUIC stateless reset key, kept in its data dir), so tickets
// issued before a hub restart are still accepted after it. The key changes
// every ticketEpoch (derived from the secret and the epoch number), which
// bounds how long one key protects tickets.
type ticketKeys struct {
	secret [32]byte
	conf   *tls.Config

	mu      sync.Mutex
	timer   *time.Timer
	stopped bool
}

func newTicketKeys(secret [32]byte, conf *tls.Config) *ticketKeys {
	k := &ticketKeys{secret: secret, conf: conf}
	k.rotate()
	return k
}

// rotate installs the current and previous epochs' keys and schedules the
// next rotation.
func (k *ticketKeys) rotate() {
	now := time.Now()
	epoch := now.Unix() / int64(ticketEpoch/time.Second)
	k.conf.SetSessionTicketKeys([][32]byte{k.key(epoch), k.key(epoch - 1)})
	next := time.Unix((epoch+1)*int64(ticketEpoch/time.Second), 0)
	k.mu.Lock()
	defer k.mu.Unlock()
	if !k.stopped {
		k.timer = time.AfterFunc(next.Sub(now), k.rotate)
	}
}

func (k *ticketKeys) key(epoch int64) [32]byte {
	m := hmac.New(sha256.New, k.secret[:])
	m.Write([]byte("tether tunnel session ticket key"))
	var e [8]byte
	binary.BigEndian.PutUint64(e[:], uint64(epoch))
	m.Write(e[:])
	var out [32]byte
	copy(out[:], m.Sum(nil))
	return out
}

// stop ends the rotation; nil-safe.
func (k *ticketKeys) stop() {
	if k == nil {
		return
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	k.stopped = true // a rotation already running schedules no other
	if k.timer != nil {
		k.timer.Stop()
	}
}
