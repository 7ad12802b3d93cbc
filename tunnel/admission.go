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
	"sync/atomic"
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
// accepted (admitted) or has ended without being accepted (counted in
// failed). refused, if set, is called with the address of every refused
// attempt (it sends the retry hint).
//
// An Initial from an address whose attempt was refused less than
// sameAttempt ago (refusedRecently) is refused too, even if a slot has
// come free: it is the rest of that attempt's first flight, or a
// retransmission, and the agent has given the attempt up. Admitted, it
// would start a handshake from the middle of a ClientHello that nobody
// finishes, holding a slot for the handshake idle timeout.
func quicAdmission(
	sem chan struct{}, refusedRecently func(net.Addr) bool, refused func(net.Addr), failed *handshakeFailures,
) func(context.Context, *quic.ClientInfo) (context.Context, error) {
	return func(ctx context.Context, ci *quic.ClientInfo) (context.Context, error) {
		if refusedRecently != nil && refusedRecently(ci.RemoteAddr) {
			if refused != nil {
				refused(ci.RemoteAddr)
			}
			return nil, errBusy
		}
		select {
		case sem <- struct{}{}:
		default:
			if refused != nil {
				refused(ci.RemoteAddr)
			}
			return nil, errBusy
		}
		slot := &quicSlot{sem: sem, taken: time.Now()}
		ctx = context.WithValue(ctx, admissionKey{}, slot)
		context.AfterFunc(ctx, func() {
			if slot.release() {
				failed.add(time.Since(slot.taken))
			}
		})
		return ctx, nil
	}
}

// quicSlot is one QUIC connection's handshake slot.
type quicSlot struct {
	sem   chan struct{}
	taken time.Time
	done  atomic.Bool
}

// release gives the slot back; only the first call does, and reports so.
func (s *quicSlot) release() bool {
	if !s.done.CompareAndSwap(false, true) {
		return false
	}
	<-s.sem
	return true
}

// admitted gives back the admission slot of an accepted QUIC connection.
func admitted(ctx context.Context) {
	if slot, ok := ctx.Value(admissionKey{}).(*quicSlot); ok {
		slot.release()
	}
}

// handshakeFailures counts handshakes that held a slot and ended without a
// session, and how long they held it.
type handshakeFailures struct {
	n    atomic.Uint64
	held atomic.Int64 // nanoseconds
}

func (f *handshakeFailures) add(held time.Duration) {
	f.n.Add(1)
	f.held.Add(int64(held))
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
//
// A dial that timed out is busy too if the hub's hint came during it:
// quic-go queues its stateless refusals four deep and drops the rest, so a
// hub saturated by a storm sends the hint and often no refusal, and the
// agent's dial waits for the handshake idle timeout. Without the hint the
// agent would then wait out its own backoff (up to 30 s). The hint is not
// authenticated, but it only sets the wait after a dial that failed anyway,
// never past the backoff cap: a forged one cannot end a dial.
func busyFromQUIC(err error, hints *hintBox, hub *net.UDPAddr) error {
	var te *quic.TransportError
	if errors.As(err, &te) && te.Remote && te.ErrorCode == quic.ConnectionRefused {
		be := &BusyError{Err: err}
		if hints != nil {
			be.RetryAfter, _ = hints.take(hub, quicHintWait)
		}
		return be
	}
	var idle *quic.IdleTimeoutError
	var hs *quic.HandshakeTimeoutError
	if hints != nil && (errors.As(err, &idle) || errors.As(err, &hs)) {
		if d, ok := hints.take(hub, 0); ok {
			return &BusyError{RetryAfter: d, Err: err}
		}
	}
	return err
}

// retryPacer hands refused agents return times as a virtual queue drained
// at the rate the hub can admit sessions: each refusal joins the queue, and
// its hint is the time the queue ahead of it takes to drain. A storm's
// agents then come back in a stream the hub can take, instead of all at
// the end of their own random backoffs (which leaves the hub idle early and
// some agents waiting a whole backoff cap late).
//
// The queue is a count, not a list of times, so a better estimate of the
// rate shortens every later hint at once. The estimate is of capacity, not
// of demand: it is the highest rate admitted over the windows of the last
// rateMemory in which the hub was full (it refused someone), or any window
// that beat it; a hub that admits few because few came says nothing of how
// many it could take, and one that has not been full lately keeps its last
// estimate. An estimate too low stretches the queue and leaves the hub idle
// while agents wait: with an estimate averaged over windows, the dips of a
// storm's first seconds (a hub busy refusing) asked agents back 25-30 s
// later while it idled from the tenth second on. One too high only costs
// refusals, which are cheap.
type retryPacer struct {
	mu       sync.Mutex // guards the following
	rate     float64    // estimated admissions per second at capacity; 0: not measured
	count    int        // admissions since winStart
	full     bool       // a refusal since winStart
	winStart time.Time  // zero until the first admission
	recent   []windowRate
	queued   float64 // agents handed a slot not yet due, as of queuedAt
	queuedAt time.Time
	// assumed is the lowest rate the queue drains at (see hint): each
	// handshake slot turning over twice a second, 512/s at the default 256
	// slots (a 2-core hub admits 400-1,300/s on the bench box). A hub
	// slower than that refuses agents more often than it needs to, which
	// costs it little (a refusal is a packet, with no state); a queue
	// slower than the hub leaves it idle while agents wait.
	assumed float64
}

// windowRate is the admission rate of one window that counts for the
// estimate.
type windowRate struct {
	end  time.Time
	rate float64
}

const (
	// rateWindow is how long admissions are counted before the estimate
	// is updated: short enough that a storm's first refusals are queued on
	// a measured rate within a second, long enough to count a few dozen
	// admissions on a slow hub.
	rateWindow = 500 * time.Millisecond
	// rateMemory is how long a window's rate counts for the estimate.
	rateMemory = 5 * time.Second
)

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
	if el < rateWindow {
		return
	}
	// A window much longer than rateWindow is one that events seldom
	// close: a hub with little to do, whatever a stray refusal in it says.
	r := float64(p.count) / el.Seconds()
	if r > p.rate || (p.full && el <= 4*rateWindow) {
		p.recent = append(p.recent, windowRate{end: now, rate: r})
	}
	p.count, p.full, p.winStart = 0, false, now
	for len(p.recent) > 0 && now.Sub(p.recent[0].end) > rateMemory {
		p.recent = p.recent[1:]
	}
	if len(p.recent) == 0 {
		return // not full lately: the last estimate stands
	}
	p.rate = 0
	for _, w := range p.recent {
		p.rate = max(p.rate, w.rate)
	}
}

// hint is the retry-after for one refused connection, in whole seconds
// (at least 1). backlog, unless negative, bounds the queue: no more agents
// than that can be waiting.
func (p *retryPacer) hint(now time.Time, backlog int) time.Duration {
	p.mu.Lock()
	defer p.mu.Unlock()
	if !p.winStart.IsZero() {
		p.updateLocked(now)
	}
	p.full = true
	// The assumed rate is a floor as well as the rate before one is
	// measured. Before: a hub that has just started, with a whole fleet
	// coming back in its first half second; asking them all back in a
	// second (as this did) brought the fleet back at once, to be refused
	// again (in a 10,000-agent storm each agent was refused five times
	// and the first seconds went to refusals). After: what a hub admits
	// in a storm's first seconds, busy refusing, is a fraction of what it
	// admits once the refused are spread out (47/s, then 400/s, on the
	// bench box), and hints queued on it (46 s) left it idle later.
	rate := max(p.rate, p.assumed)
	if rate == 0 {
		return time.Second
	}
	if el := now.Sub(p.queuedAt).Seconds(); el > 0 {
		p.queued = max(0, p.queued-el*rate)
		p.queuedAt = now
	}
	p.queued++
	if backlog >= 0 {
		p.queued = min(p.queued, float64(max(backlog, 1)))
	}
	d := min(time.Duration(p.queued/rate*float64(time.Second)), retryHintMax)
	return max(time.Second, d.Round(time.Second))
}

// estimate is the admission rate the pacer queues on, per second (0: not
// measured yet).
func (p *retryPacer) estimate() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rate
}

// refuser writes the busy refusal on TCP connections refused for lack of a
// handshake slot. The write, the read of the agent's ClientHello record (so
// that no unread data turns the close into a reset that could discard the
// hint) and the close run on a goroutine; at most maxRefusing at once,
// further refusals are plain closes, and their agents wait out their own
// backoff (AdmissionStats.RefusedTCPPlain counts them).
type refuser struct {
	pacer   retryPacer
	backlog func() int // ListenConfig.Backlog; nil: unknown
	slots   chan struct{}
	wg      *sync.WaitGroup

	// What was refused, for AdmissionStats.
	quic, tcpHinted, tcpPlain atomic.Uint64

	qmu     sync.Mutex // guards the following
	qrecent map[string]quicRefusal
	qorder  []quicRefusalKey // qrecent's keys, oldest first
}

const (
	maxRefusing    = 1024
	refuseDeadline = 2 * time.Second       // the hint's write
	refuseDrain    = 20 * time.Millisecond // the wait for the ClientHello
)

// discardRecord reads and drops one TLS record (header and body, at most
// 16 KiB + 256 bytes of body) from r.
func discardRecord(r io.Reader) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return
	}
	n := min(int64(binary.BigEndian.Uint16(hdr[3:5])), 1<<14+256)
	_, _ = io.Copy(io.Discard, io.LimitReader(r, n))
}

// newRefuser returns a refuser for a listener with maxHandshakes slots.
func newRefuser(wg *sync.WaitGroup, maxHandshakes int) *refuser {
	r := &refuser{slots: make(chan struct{}, maxRefusing), wg: wg}
	r.pacer.assumed = 2 * float64(maxHandshakes)
	return r
}

// waiting is how many agents may be waiting to connect (ListenConfig.Backlog),
// negative when unknown.
func (r *refuser) waiting() int {
	if r.backlog == nil {
		return -1
	}
	return r.backlog()
}

// quicRefusal is a QUIC attempt refused within sameAttempt.
type quicRefusal struct {
	at   time.Time
	secs time.Duration
}

type quicRefusalKey struct {
	addr string
	at   time.Time
}

// hintQUIC sends a refused QUIC attempt from addr its retry hint, on tr
// (the listener's transport, so it comes from the port the agent dialed).
//
// quic-go consults ConnContext for every Initial packet of an attempt it
// refused: an agent's first flight is two (the hybrid key share makes its
// ClientHello larger than one), and an agent slow to read the refusal
// sends more when its handshake timer fires. A 10,000-agent storm had
// seven refusals per attempt, and each took a place in the queue: the
// queue filled at once and every agent was asked back at its end. So a
// refusal from an address refused less than sameAttempt ago is the same
// attempt: it gets the same hint and no place of its own. (An agent asked
// back waits at least 80 % of a second.)
func (r *refuser) hintQUIC(tr *quic.Transport, addr net.Addr) {
	now := time.Now()
	key := addr.String()
	r.qmu.Lock()
	for len(r.qorder) > 0 && now.Sub(r.qorder[0].at) > sameAttempt {
		if old := r.qorder[0]; r.qrecent[old.addr].at.Equal(old.at) {
			delete(r.qrecent, old.addr)
		}
		r.qorder = r.qorder[1:]
	}
	last, seen := r.qrecent[key]
	secs := last.secs
	if !seen || now.Sub(last.at) > sameAttempt {
		secs = min(r.pacer.hint(now, r.waiting())/time.Second, 255)
		if r.qrecent == nil {
			r.qrecent = map[string]quicRefusal{}
		}
		if len(r.qrecent) < maxRecentRefusals {
			r.qrecent[key] = quicRefusal{at: now, secs: secs}
			r.qorder = append(r.qorder, quicRefusalKey{addr: key, at: now})
		}
	}
	r.qmu.Unlock()
	r.quic.Add(1)
	_, _ = tr.WriteTo(quicBusyRecord(byte(secs)), addr)
}

// refusedRecently reports whether a QUIC attempt from addr was refused less
// than sameAttempt ago.
func (r *refuser) refusedRecently(addr net.Addr) bool {
	r.qmu.Lock()
	defer r.qmu.Unlock()
	last, ok := r.qrecent[addr.String()]
	return ok && time.Since(last.at) <= sameAttempt
}

const (
	// sameAttempt is how close two refusals from one address must be to
	// count as one QUIC attempt: beyond a first flight and one
	// retransmission (quic-go's first probe timeout is ~300 ms), short of
	// the agent's next attempt (at least 800 ms on).
	sameAttempt = 500 * time.Millisecond
	// maxRecentRefusals bounds the addresses remembered: a storm beyond it
	// (or a spoofed flood) is counted per packet again.
	maxRecentRefusals = 1 << 16
)

// refuse answers raw with the busy record and a retry hint, then closes it.
func (r *refuser) refuse(raw net.Conn) {
	select {
	case r.slots <- struct{}{}:
	default:
		r.tcpPlain.Add(1)
		_ = raw.Close()
		return
	}
	r.tcpHinted.Add(1)
	secs := min(r.pacer.hint(time.Now(), r.waiting())/time.Second, 255)
	r.wg.Go(func() {
		defer func() { <-r.slots }()
		defer raw.Close()
		_ = raw.SetDeadline(time.Now().Add(refuseDeadline))
		rec := append(busyMagic[:], byte(secs))
		if _, err := raw.Write(rec); err != nil {
			return
		}
		// The agent sends its ClientHello, one TLS record, as soon as it
		// has connected, and nothing more until the hub answers: if that
		// record is read the close is a clean FIN. It is read for at most
		// refuseDrain: a ClientHello arriving after the close draws a
		// reset, which reaches the agent after the hint (Linux hands it
		// the data received before a reset). Waiting for the agent's own
		// close instead held each refusal for a round trip through the
		// agent's TLS stack, which in a storm of a busy fleet exhausted
		// maxRefusing: 30,000 of 32,000 refusals of a 10,000-agent storm
		// went out without a hint.
		_ = raw.SetReadDeadline(time.Now().Add(refuseDrain))
		discardRecord(raw)
	})
}

// AdmissionStats counts what a Listener refused for lack of a handshake
// slot (ListenConfig.MaxHandshakes), and the admission rate its retry hints
// are paced by.
type AdmissionStats struct {
	// RefusedQUIC counts refused QUIC connection attempts (each is
	// answered with a retry hint).
	RefusedQUIC uint64
	// RefusedTCPHinted counts refused TCP connections answered with a
	// retry hint, RefusedTCPPlain those closed without one because too many
	// refusals were being written at once (the agent then waits out its own
	// backoff).
	RefusedTCPHinted, RefusedTCPPlain uint64
	// AdmitRate is the pacer's estimate of the sessions per second the
	// hub admits at capacity; 0 before a rate has been measured.
	AdmitRate float64
	// HandshakesFailed counts connections that took a handshake slot and
	// ended without a session (both transports), HandshakeFailedHeld the
	// time they held their slots, in all.
	HandshakesFailed    uint64
	HandshakeFailedHeld time.Duration
}

// AdmissionStats reports the Listener's refusals so far.
func (l *Listener) AdmissionStats() AdmissionStats {
	r := l.refuse
	return AdmissionStats{
		RefusedQUIC:         r.quic.Load(),
		RefusedTCPHinted:    r.tcpHinted.Load(),
		RefusedTCPPlain:     r.tcpPlain.Load(),
		AdmitRate:           r.pacer.estimate(),
		HandshakesFailed:    l.failed.n.Load(),
		HandshakeFailedHeld: time.Duration(l.failed.held.Load()),
	}
}
