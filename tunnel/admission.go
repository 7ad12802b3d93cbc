package tunnel

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
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
// accepted (admitted) or has ended without being accepted. refused, if
// set, is called with the address of every refused attempt (it sends the
// retry hint).
func quicAdmission(sem chan struct{}, refused func(net.Addr)) func(context.Context, *quic.ClientInfo) (context.Context, error) {
	return func(ctx context.Context, ci *quic.ClientInfo) (context.Context, error) {
		select {
		case sem <- struct{}{}:
		default:
			if refused != nil {
				refused(ci.RemoteAddr)
			}
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

// BusyError is the error of a dial the hub refused because it was at its
// handshake limit (ListenConfig.MaxHandshakes): the hub is up, and said so
// before any cryptography. RetryAfter is when it asked the agent to come
// back: in the refusal record on TCP, in a datagram beside the refusal on
// QUIC (see quicBusyMagic); zero when none came (an older hub, a lost
// datagram), and the caller's own backoff applies.
//
// The hint is not authenticated (it comes before the TLS handshake), so a
// caller must bound it by its own backoff cap: a forged hint can then delay
// an agent no longer than its backoff would, which an attacker able to
// inject packets can do anyway by dropping them.
type BusyError struct {
	RetryAfter time.Duration
	Err        error // what the transport reported
}

func (e *BusyError) Error() string {
	if e.RetryAfter > 0 {
		return fmt.Sprintf("hub busy (handshake limit reached), asked to retry after %v", e.RetryAfter)
	}
	return fmt.Sprintf("hub busy (handshake limit reached): %v", e.Err)
}

func (e *BusyError) Unwrap() error { return e.Err }

// RetryAfter reports the hub's retry hint if err (from Dial) is a busy
// refusal; ok is false for any other error.
// When both transports were refused (TransportAuto), the longer hint wins.
func RetryAfter(err error) (d time.Duration, ok bool) {
	switch e := err.(type) {
	case nil:
		return 0, false
	case *BusyError:
		return e.RetryAfter, true
	case interface{ Unwrap() []error }:
		for _, inner := range e.Unwrap() {
			if id, iok := RetryAfter(inner); iok {
				d, ok = max(d, id), true
			}
		}
		return d, ok
	}
	return RetryAfter(errors.Unwrap(err))
}

// busyMagic opens the refusal the hub writes on a TCP connection it has no
// handshake slot for: 4 bytes, then the retry hint in whole seconds (1 byte).
// The 5 bytes stand where a TLS record header would; crypto/tls on the
// agent returns them in a tls.RecordHeaderError (the first byte is no TLS
// content type), so the agent reads the hint without any parsing of ours
// reaching into TLS.
var busyMagic = [4]byte{'T', 'B', 'S', 'Y'}

// retryHintMax bounds the hint the hub gives; the agent clamps it to its own
// backoff cap as well.
const retryHintMax = 60 * time.Second

// busyFromRecordHeader turns the refusal record into a BusyError.
func busyFromRecordHeader(err error) error {
	var rh tls.RecordHeaderError
	if !errors.As(err, &rh) || [4]byte(rh.RecordHeader[:4]) != busyMagic {
		return err
	}
	return &BusyError{RetryAfter: time.Duration(rh.RecordHeader[4]) * time.Second, Err: err}
}

// busyFromQUIC marks QUIC's CONNECTION_REFUSED (the hub's ConnContext
// refusal) as busy, with the retry hint the hub sent beside it, if one
// arrives on hints from hub.
func busyFromQUIC(err error, hints *hintBox, hub *net.UDPAddr) error {
	var te *quic.TransportError
	if errors.As(err, &te) && te.Remote && te.ErrorCode == quic.ConnectionRefused {
		be := &BusyError{Err: err}
		if hints != nil {
			be.RetryAfter, _ = hints.take(hub)
		}
		return be
	}
	return err
}

// retryPacer hands refused agents return times as a virtual queue: each
// refusal takes the next slot after the last one handed out, slots spaced
// by the rate at which the hub has been admitting sessions. A storm's
// agents then come back in a stream the hub can take, instead of all at
// the end of their own random backoffs (which leaves the hub idle early and
// some agents waiting a whole backoff cap late).
type retryPacer struct {
	mu       sync.Mutex // guards the following
	next     time.Time  // the last slot handed out
	rate     float64    // admissions per second, smoothed
	count    int        // admissions since winStart
	winStart time.Time
}

// minAdmitRate is the lowest rate slots are spaced by (a hub admitting
// slowly still hands out slots no more than 20 ms apart). Before any rate
// is measured every hint is 1 s (see hint).
const minAdmitRate = 50.0

// admitted counts one session admitted.
func (p *retryPacer) admitted(now time.Time) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.winStart.IsZero() {
		p.winStart = now
	}
	p.count++
	p.updateLocked(now)
}

func (p *retryPacer) updateLocked(now time.Time) {
	el := now.Sub(p.winStart)
	if el < time.Second {
		return
	}
	r := float64(p.count) / el.Seconds()
	if p.rate == 0 {
		p.rate = r
	} else {
		p.rate = (p.rate + r) / 2
	}
	p.count, p.winStart = 0, now
}

// hint is the retry-after for one refused connection, in whole seconds
// (at least 1).
func (p *retryPacer) hint(now time.Time) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.winStart.IsZero() {
		p.updateLocked(now)
	}
	if p.rate == 0 {
		// No admission rate measured yet (a hub that has just started,
		// under a whole fleet coming back): queueing agents on the
		// assumed rate sent the first refused QUIC agents of a storm
		// 30+ s away while the hub turned out to admit hundreds a second
		// (P5: p99 9 s, last agent 35.8 s). Ask them back in a second,
		// when the rate is known; refusals are cheap.
		return time.Second
	}
	if p.next.Before(now) {
		p.next = now
	}
	p.next = p.next.Add(time.Duration(float64(time.Second) / max(p.rate, minAdmitRate)))
	d := min(p.next.Sub(now), retryHintMax)
	return max(time.Second, d.Round(time.Second))
}

// refuser writes the busy refusal on TCP connections refused for lack of a
// handshake slot. The write, the half-close and the wait for the agent to
// close (so the unread ClientHello does not turn the close into a reset
// that could discard the hint) run on a goroutine; at most maxRefusing at
// once, further refusals are plain closes.
type refuser struct {
	pacer retryPacer
	slots chan struct{}
	wg    *sync.WaitGroup

	qmu       sync.Mutex // guards the following: the last QUIC refusal
	qlastAddr string
	qlastAt   time.Time
	qlastSecs time.Duration
}

const (
	maxRefusing    = 64
	refuseDeadline = 2 * time.Second
)

func newRefuser(wg *sync.WaitGroup) *refuser {
	return &refuser{slots: make(chan struct{}, maxRefusing), wg: wg}
}

// hintQUIC sends a refused QUIC attempt from addr its retry hint, on tr
// (the listener's transport, so it comes from the port the agent dialed).
//
// An agent's first flight is two Initial packets (the hybrid key share makes
// its ClientHello larger than one), and quic-go consults ConnContext for
// each once it has refused the first: a refusal from the address refused
// just before is the same attempt, and gets the same slot instead of
// taking a second one (which doubled every QUIC agent's place in the queue).
func (r *refuser) hintQUIC(tr *quic.Transport, addr net.Addr) {
	now := time.Now()
	key := addr.String()
	r.qmu.Lock()
	secs := r.qlastSecs
	if key != r.qlastAddr || now.Sub(r.qlastAt) > sameAttempt {
		secs = min(r.pacer.hint(now)/time.Second, 255)
		r.qlastAddr, r.qlastAt, r.qlastSecs = key, now, secs
	}
	r.qmu.Unlock()
	_, _ = tr.WriteTo(quicBusyRecord(byte(secs)), addr)
}

// sameAttempt is how close two refusals from one address must be to count
// as one QUIC attempt's two Initial packets.
const sameAttempt = 20 * time.Millisecond

// refuse answers raw with the busy record and a retry hint, then closes it.
func (r *refuser) refuse(raw net.Conn) {
	select {
	case r.slots <- struct{}{}:
	default:
		_ = raw.Close()
		return
	}
	secs := min(r.pacer.hint(time.Now())/time.Second, 255)
	r.wg.Go(func() {
		defer func() { <-r.slots }()
		defer raw.Close()
		_ = raw.SetDeadline(time.Now().Add(refuseDeadline))
		rec := append(busyMagic[:], byte(secs))
		if _, err := raw.Write(rec); err != nil {
			return
		}
		if cw, ok := raw.(interface{ CloseWrite() error }); ok {
			_ = cw.CloseWrite()
		}
		_, _ = io.Copy(io.Discard, io.LimitReader(raw, 64<<10))
	})
}
