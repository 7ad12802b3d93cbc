// Package resume makes a byte stream between the hub and an agent outlive
// the tunnel session it started on. Each end keeps the bytes the other has
// not acknowledged; when the link comes back (same hub, either transport),
// the stream is re-attached to a fresh tunnel stream by its ID and goes on
// with nothing lost, duplicated or reordered. The applications on both ends
// see a pause, nothing else.
//
// A Stream is a tunnel.Stream over a sequence of underlying tunnel streams.
// The side that opens a resumable stream writes the tunnel Header and an
// Open frame (WriteOpen), the other side reads them (ReadOpen), and both wrap
// their tunnel stream with New once the stream is accepted, and put it in
// their Set. An error on the underlying stream detaches the Stream: it keeps
// everything, and waits up to Config.Window to be re-attached, by
// Stream.Resume on one side (over a tunnel stream it opened after a Header
// naming the resume service) and Set.Accept on the other (after reading that
// Header), which finds the stream by its ID. The side that reconnects
// resumes every stream of its Set (Set.Streams): one may not have noticed
// yet that its link died. The package knows nothing of hubs and agents: who
// resumes and who accepts is the caller's choice.
//
// A Set remembers ended streams for their Window, so that a peer that missed
// only the last Ack of a finished stream is told it finished, and one whose
// stream ended here hears why.
//
// Acknowledgements ride in-band: a side acknowledges what it has put in its
// receive queue (bounded by Config.Buffer), and stops reading its underlying
// stream while that queue is full. So a peer whose application stops reading
// stalls this side's writes once Buffer bytes are in flight, as a full TCP
// window would; unlike TCP, it stalls its own writes too, since the Acks for
// them wait behind the data it does not read. Both ends should use the same
// Buffer: a receiver acknowledges every Buffer/8 bytes (or within 100 ms), so
// a sender with a much smaller Buffer than its peer waits on that timer.
//
// The wire frames are described in wire.go.
package resume

import (
	"errors"
	"fmt"
	"sync"
	"time"
)

// Defaults of Config.
const (
	DefaultWindow = 60 * time.Second
	DefaultBuffer = 4 << 20
)

// ackDelay bounds how long received bytes wait for their acknowledgement.
const ackDelay = 100 * time.Millisecond

// closeLinger bounds what an ending attachment still does on its underlying
// stream: write a last Ack or a Close frame, and read until the peer's end.
const closeLinger = 5 * time.Second

var (
	// ErrExpired: the stream stayed detached longer than its Window.
	ErrExpired = errors.New("resume: stream not re-attached in time")
	// ErrProtocol: the peer broke the wire protocol (an unknown frame, a
	// bad length, an ack beyond what was sent, data after Fin). Every
	// decoding error of this package wraps it.
	ErrProtocol = errors.New("resume: protocol error")
	// ErrAborted: the stream was ended for good, by Abort or CloseAll on
	// this side, or by a Close frame from the peer.
	ErrAborted = errors.New("resume: stream aborted")
	// ErrRefused: the peer refused to re-attach the stream (it does not
	// know it any more, or has ended it).
	ErrRefused = errors.New("resume: resume refused")
)

// EndedError is what Read and Write return once a stream has ended other
// than normally. Err is ErrExpired, ErrRefused, ErrAborted, or wraps
// ErrProtocol; Reason is the sentence for people (the peer's reason for a
// Close frame or a refusal).
type EndedError struct {
	Reason string
	Err    error
}

func (e *EndedError) Error() string {
	if e.Reason == "" {
		return e.Err.Error()
	}
	return fmt.Sprintf("%s: %s", e.Err, e.Reason)
}

func (e *EndedError) Unwrap() error { return e.Err }

// Config tunes a Stream. The zero value is usable: every zero field takes
// its default.
type Config struct {
	// Window: how long a detached stream waits to be re-attached; past it the
	// stream ends (Read/Write return *EndedError with Reason from
	// ExpiredReason). Default 60s.
	Window time.Duration
	// Buffer: the most bytes this side keeps unacknowledged for this stream
	// (the replay buffer), and the most received bytes it queues for the
	// application. Write blocks while the replay buffer is full (attached:
	// until acks come; detached: until re-attached and acked, or the window
	// ends). Default 4 MiB. It is allocated as it fills, not up front.
	Buffer int
	// Budget, if set, is shared by every stream of one peer: the replay
	// buffers of all of them together stay under its limit (a Write waits
	// for room).
	Budget *Budget
	// ExpiredReason words the end of a stream whose window passed, given how
	// long it was detached. Default: a generic sentence.
	ExpiredReason func(down time.Duration) string
	// OnDetach and OnAttach are optional hooks (metrics, logs), called
	// without locks held: OnDetach with the error that detached the stream,
	// OnAttach after every re-attachment (not for New).
	OnDetach func(s *Stream, err error)
	OnAttach func(s *Stream)
}

func (c Config) withDefaults() Config {
	if c.Window <= 0 {
		c.Window = DefaultWindow
	}
	if c.Buffer <= 0 {
		c.Buffer = DefaultBuffer
	}
	if c.ExpiredReason == nil {
		window := c.Window
		c.ExpiredReason = func(down time.Duration) string {
			unit := time.Second
			if down < 10*time.Second {
				unit = 10 * time.Millisecond
			}
			return fmt.Sprintf("the link was down for %v, longer than the %v resume window; stream ended",
				down.Round(unit), window)
		}
	}
	return c
}

// Budget is a byte budget shared by the streams of one peer (per agent on
// the hub; per hub link on the agent): their replay buffers together stay
// under its limit. Streams stuck on a peer that does not acknowledge keep
// their share until they end, so the limit should leave room for the
// others. Safe for concurrent use.
type Budget struct {
	limit int64

	mu   sync.Mutex
	used int64
	wq   waitq
}

// NewBudget returns a budget of limit bytes. A limit of 0 or less does not
// limit (InUse still counts).
func NewBudget(limit int64) *Budget { return &Budget{limit: limit} }

// InUse is the bytes the streams sharing b hold unacknowledged, for metrics.
func (b *Budget) InUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// take reserves up to n bytes and returns how many it got (0 when the budget
// is full), and the channel that is closed when room may have come back.
func (b *Budget) take(n int) (int, <-chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.limit > 0 {
		n = int(min(int64(n), b.limit-b.used))
	}
	if n <= 0 {
		return 0, b.wq.wait()
	}
	b.used += int64(n)
	return n, nil
}

// give returns n bytes to the budget.
func (b *Budget) give(n int) {
	if n == 0 {
		return
	}
	b.mu.Lock()
	b.used -= int64(n)
	b.wq.wake()
	b.mu.Unlock()
}

// waitq is a broadcast under a caller's lock: wait returns a channel that
// the next wake closes. It allocates only when someone waits.
type waitq struct{ ch chan struct{} }

func (w *waitq) wait() <-chan struct{} {
	if w.ch == nil {
		w.ch = make(chan struct{})
	}
	return w.ch
}

func (w *waitq) wake() {
	if w.ch != nil {
		close(w.ch)
		w.ch = nil
	}
}
