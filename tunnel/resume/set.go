package resume

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

// maxTombs bounds how many ended streams a Set remembers (see tomb).
const maxTombs = 4096

// Set holds the resumable streams of one peer (the hub keeps one per node,
// an agent one per hub link), so the side that accepts a Resume finds the
// stream by its ID, and the side that reconnects lists what to resume. A
// stream leaves its set when it has ended. Safe for concurrent use.
type Set struct {
	mu      sync.Mutex
	streams map[ID]*Stream
	tombs   map[ID]tomb
	order   []ID // tombs, oldest first
}

// tomb is what a Set remembers of an ended stream, for as long as its peer
// might still try to resume it (the stream's Window): a peer that missed
// the last Ack of a finished stream is told it finished, and one that
// missed a Close frame (or whose stream expired here) gets the reason.
type tomb struct {
	clean      bool // ended normally
	reason     string
	rseq, wseq uint64
	until      time.Time
}

// NewSet returns an empty set.
func NewSet() *Set {
	return &Set{streams: make(map[ID]*Stream), tombs: make(map[ID]tomb)}
}

// Add puts s in the set. It fails for a stream whose ID the set already
// holds (or recently held), for a stream in another set, and for an ended
// stream.
func (set *Set) Add(s *Stream) error {
	set.mu.Lock()
	defer set.mu.Unlock()
	set.pruneLocked(time.Now())
	if _, ok := set.streams[s.id]; ok {
		return fmt.Errorf("resume: stream %v is already in the set", s.id)
	}
	if _, ok := set.tombs[s.id]; ok {
		return fmt.Errorf("resume: stream %v has ended recently: its id cannot be used again", s.id)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.set != nil:
		return fmt.Errorf("resume: stream %v is already in another set", s.id)
	case s.ended:
		return fmt.Errorf("resume: stream %v has ended", s.id)
	}
	s.set = set
	set.streams[s.id] = s
	return nil
}

// Get returns the stream with id, if the set holds it.
func (set *Set) Get(id ID) (*Stream, bool) {
	set.mu.Lock()
	defer set.mu.Unlock()
	s, ok := set.streams[id]
	return s, ok
}

// Streams returns every stream of the set. A side that reconnects after its
// session died resumes all of them: a stream may not have noticed yet that
// its underlying stream is dead, and resuming an attached stream replaces
// its underlying stream.
func (set *Set) Streams() []*Stream {
	set.mu.Lock()
	defer set.mu.Unlock()
	out := make([]*Stream, 0, len(set.streams))
	for _, s := range set.streams {
		out = append(out, s)
	}
	return out
}

// Detached returns the streams waiting to be re-attached.
func (set *Set) Detached() []*Stream {
	var out []*Stream
	for _, s := range set.Streams() {
		if attached, _ := s.State(); !attached {
			out = append(out, s)
		}
	}
	return out
}

// Len is the number of streams in the set.
func (set *Set) Len() int {
	set.mu.Lock()
	defer set.mu.Unlock()
	return len(set.streams)
}

// Accept serves a Resume request on under, after the caller has read the
// tunnel Header naming the resume service: it reads the request (bounded by
// ctx), finds the stream, answers, and attaches it, giving up an underlying
// stream it may still think alive (the peer reconnecting proves it dead).
//
// An unknown id, an ended stream, or a received count outside what the
// stream sent is refused with a reason (an error wrapping ErrRefused or
// ErrProtocol is returned); a stream that had already finished normally is
// told so, and Accept returns nil. Accept takes under over: it closes it
// unless the stream now runs on it.
func (set *Set) Accept(ctx context.Context, under tunnel.Stream) error {
	done := bound(ctx, under)
	req, err := ReadResumeRequest(under)
	if err != nil {
		if errors.Is(err, ErrProtocol) {
			refuse(under, done, sanitizeReason(err.Error()))
		} else {
			_ = done()
			_ = under.Close()
		}
		return err
	}
	set.mu.Lock()
	set.pruneLocked(time.Now())
	s := set.streams[req.ID]
	t, ended := set.tombs[req.ID]
	ended = ended && time.Now().Before(t.until)
	set.mu.Unlock()
	if s != nil {
		return s.accept(req.Received, under, done)
	}
	if ended {
		return answerEnded(req.ID, t, req.Received, under, done)
	}
	reason := fmt.Sprintf("no stream %v to resume here: it ended long ago or never existed", req.ID)
	refuse(under, done, reason)
	return fmt.Errorf("%w: %s", ErrRefused, reason)
}

// answerEnded answers a Resume request for stream id, which has ended (t),
// from a peer that received r. A peer that missed only the last Ack of a
// stream that finished normally is told it finished (it then finishes too);
// any other is refused with the reason the stream ended.
func answerEnded(id ID, t tomb, r uint64, under tunnel.Stream, done func() error) error {
	var reason string
	switch {
	case t.clean && r == t.wseq:
		err := WriteResumeAnswer(under, ResumeAnswer{OK: true, Received: t.rseq})
		if cerr := done(); cerr != nil && err == nil {
			err = cerr
		}
		_ = under.Close()
		if err != nil {
			return fmt.Errorf("resume: accept stream %v: %w", id, err)
		}
		return nil
	case t.clean:
		reason = fmt.Sprintf("stream %v has already finished", id)
	default:
		reason = sanitizeReason(fmt.Sprintf("stream %v has ended: %s", id, t.reason))
	}
	refuse(under, done, reason)
	return fmt.Errorf("%w: %s", ErrRefused, reason)
}

// refuse answers a Resume request with a refusal (best effort) and closes
// under.
func refuse(under tunnel.Stream, done func() error, reason string) {
	_ = WriteResumeAnswer(under, ResumeAnswer{Reason: reason})
	_ = done()
	_ = under.Close()
}

// CloseAll aborts every stream of the set with reason (the hub shutting
// down, the node removed or revoked): see Stream.Abort.
func (set *Set) CloseAll(reason string) {
	for _, s := range set.Streams() {
		s.Abort(reason)
	}
}

// forget takes s, which has ended, out of the set and remembers t for it.
func (set *Set) forget(s *Stream, t tomb) {
	set.mu.Lock()
	defer set.mu.Unlock()
	if set.streams[s.id] != s {
		return
	}
	delete(set.streams, s.id)
	set.pruneLocked(time.Now())
	for len(set.order) >= maxTombs {
		delete(set.tombs, set.order[0])
		set.order = set.order[1:]
	}
	set.tombs[s.id] = t
	set.order = append(set.order, s.id)
}

// pruneLocked drops the tombs whose time has passed. Windows differ between
// streams, so a tomb behind a longer-lived one waits for it; maxTombs bounds
// that.
func (set *Set) pruneLocked(now time.Time) {
	for len(set.order) > 0 {
		t, ok := set.tombs[set.order[0]]
		if ok && now.Before(t.until) {
			return
		}
		delete(set.tombs, set.order[0])
		set.order = set.order[1:]
	}
}
