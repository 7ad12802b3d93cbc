package resume

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"math/bits"
	"net"
	"os"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

// errReplaced is what OnDetach hears when a stream is re-attached while it
// still had an underlying stream: the peer reconnecting proves it dead.
var errReplaced = errors.New("resume: re-attached over a new tunnel stream")

// writeCap is the most the sender hands the underlying stream in one Write:
// the tunnel's TCP transport cuts writes into yamux frames of 64 KiB, so a
// frame of 64 KiB and 5 bytes would cost a second, tiny one.
const writeCap = 64 << 10

// Replay buffer chunks: a chunk is a frame (header, then payload) that
// Writes fill in order; bulk writers get big chunks, which the sender writes
// as they are, others small ones, so that many quiet streams with a few
// unacknowledged bytes each do not hold 64 KiB apiece.
const (
	bigChunk   = writeCap
	smallChunk = 4 << 10
	bulkWrite  = 8 << 10 // a Write at least this long fills big chunks
)

var (
	bigChunks   = sync.Pool{New: func() any { return &chunk{buf: make([]byte, 0, bigChunk)} }}
	smallChunks = sync.Pool{New: func() any { return &chunk{buf: make([]byte, 0, smallChunk)} }}
)

func newChunk(seq uint64, big bool) *chunk {
	pool := &smallChunks
	if big {
		pool = &bigChunks
	}
	c := pool.Get().(*chunk)
	c.seq = seq
	c.buf = c.buf[:dataHeaderLen]
	return c
}

// recycle returns c to its pool, unless a sender still writes from it (the
// sender recycles it when done).
func (c *chunk) recycle() {
	if c.busy > 0 {
		c.dead = true
		return
	}
	*c = chunk{buf: c.buf[:0]}
	if cap(c.buf) == bigChunk {
		bigChunks.Put(c)
	} else {
		smallChunks.Put(c)
	}
}

// Received payloads longer than pooledMin come from pools by power-of-two
// size, up to MaxFrame: a bulk transfer allocates nothing per frame (a
// jump's frames are mostly under 32 KiB: the hub relays SSH packets of at
// most 32 KiB), and a queued payload pins less than twice its length, so
// a queue of small frames does not pin 64 KiB each. Shorter payloads get
// their own.
const (
	pooledMin      = 1 << 10
	pooledMinShift = 11 // the smallest pooled size, 2 KiB
	pooledClasses  = 16 - pooledMinShift + 1
)

var payloadPools [pooledClasses]sync.Pool

func init() {
	for i := range payloadPools {
		size := 1 << (pooledMinShift + i)
		payloadPools[i].New = func() any { b := make([]byte, size); return &b }
	}
}

// payloadClass is the pool for a payload of n bytes (pooledMin < n <=
// MaxFrame), or for a buffer of that capacity.
func payloadClass(n int) int { return max(0, bits.Len(uint(n-1))-pooledMinShift) }

func allocPayload(n int) []byte {
	if n > pooledMin {
		return (*payloadPools[payloadClass(n)].Get().(*[]byte))[:n]
	}
	return make([]byte, n)
}

func freePayload(b []byte) {
	if c := cap(b); c > pooledMin && c <= MaxFrame && c&(c-1) == 0 {
		b = b[:c]
		payloadPools[payloadClass(c)].Put(&b)
	}
}

// Stream is a resumable byte stream: a tunnel.Stream (net.Conn plus
// CloseWrite) over a sequence of underlying tunnel streams. It is safe for
// concurrent use as a net.Conn is; deadlines work as for net.Conn
// (os.ErrDeadlineExceeded, a net.Error whose Timeout is true).
//
// An error reading or writing the underlying stream detaches the Stream
// (the caller need not tell it that the session died): it closes the
// underlying stream, keeps everything, and starts its Window. Meanwhile
// Read returns what was already received and then blocks, and Write fills
// the replay buffer and then blocks. Resume or Set.Accept re-attach it.
//
// Close is a TCP close: it half-closes if CloseWrite was not called, stops
// delivering reads, and returns at once; the stream lingers until the peer
// has acknowledged everything (across re-attachments, within the Window),
// then ends and leaves its Set. If the peer had not half-closed by then, it
// is sent a Close frame, and its writes fail from then on. The linger lasts
// at most Window (from Close), attached or not.
type Stream struct {
	id       ID
	cfg      Config
	ackEvery uint64
	done     chan struct{} // closed when the stream has ended

	wmu sync.Mutex // serialises Write calls, so their bytes do not interleave

	mu   sync.Mutex
	post []func() // run by unlock, after mu is released

	// Attachment.
	att         *attachment   // current one (live, or in its handshake); nil when detached
	last        tunnel.Stream // the newest underlying stream, for addresses
	since       time.Time     // attached or detached since
	epoch       uint64        // detachments so far; tells a stale window timer
	windowTimer *time.Timer
	lingerTimer *time.Timer // bounds a Close's linger
	set         *Set

	// Send side, in units of sequence space (data bytes, plus 1 for Fin).
	chunks   []*chunk // unacknowledged data, in order, from head
	head     int
	dataEnd  uint64 // sequence number after the last data byte written
	wseq     uint64 // dataEnd, plus 1 once Fin is queued
	acked    uint64 // the peer's cumulative acknowledgement
	sendPos  uint64 // next unit to send on the current attachment
	fin      bool   // Fin queued
	buffered int    // data bytes held (or reserved by a Write) against Buffer and Budget
	wq       waitq  // Writes waiting for room

	// Receive side.
	queue    [][]byte // received, not yet read
	qoff     int      // read offset in queue[0]
	queued   int
	rseq     uint64 // units received in order
	rfin     bool   // the peer's Fin received
	ackSent  uint64 // the last acknowledgement the peer has (Ack frame or handshake)
	ackDue   bool
	ackArmed bool
	ackTimer *time.Timer
	rq       waitq // Reads waiting for data
	sq       waitq // the frame reader waiting for queue space

	rdl, wdl time.Time // deadlines

	wclosed bool  // CloseWrite (or Close) called
	closed  bool  // Close called
	ended   bool  // nothing more happens on the wire
	endErr  error // why, if not a normal end
}

// chunk is a piece of the replay buffer: room for a Data frame header, then
// payload. Writes append to the last chunk until it is full; bytes already
// in a chunk never change. A full chunk is written by the sender as it is,
// without holding mu (busy counts such writes); anything else is copied
// into the sender's batch under mu. All fields are guarded by Stream.mu.
type chunk struct {
	seq    uint64 // sequence number of buf[dataHeaderLen]
	buf    []byte
	headed bool // buf holds its frame header (written once, when full)
	busy   int  // senders writing from buf without holding mu
	dead   bool // acknowledged or dropped while busy: the last sender recycles it
}

func (c *chunk) end() uint64 { return c.seq + uint64(len(c.buf)-dataHeaderLen) }
func (c *chunk) full() bool  { return len(c.buf) == cap(c.buf) }

// attachment is one underlying stream, with its frame reader and sender.
// It is the stream's generation: its goroutines act only while s.att is
// still theirs (checked under mu), so they never touch a later attachment.
type attachment struct {
	under tunnel.Stream
	kick  chan struct{} // the sender has work
	done  chan struct{} // closed when retired

	// Guarded by Stream.mu.
	live       bool // handshake done, goroutines started
	retired    bool
	graceful   bool   // retired by a normal end: finish writing, then half-close and read to the end
	closeFrame []byte // a Close frame for the sender to write last

	running   atomic.Int32 // goroutines left; the last closes under
	closeOnce sync.Once
}

func newAttachment(under tunnel.Stream) *attachment {
	return &attachment{under: under, kick: make(chan struct{}, 1), done: make(chan struct{})}
}

func (a *attachment) closeUnder() { a.closeOnce.Do(func() { _ = a.under.Close() }) }

func (a *attachment) exit() {
	if a.running.Add(-1) == 0 {
		a.closeUnder()
	}
}

// New makes a resumable stream of id over under, on which the Open frame
// has already been exchanged. Both ends call it. It starts attached.
func New(id ID, under tunnel.Stream, cfg Config) *Stream {
	cfg = cfg.withDefaults()
	s := &Stream{
		id:       id,
		cfg:      cfg,
		ackEvery: uint64(max(1, cfg.Buffer/8)),
		done:     make(chan struct{}),
		since:    time.Now(),
		last:     under,
	}
	s.mu.Lock()
	a := newAttachment(under)
	s.att = a
	s.startLocked(a)
	s.mu.Unlock()
	return s
}

// unlock releases mu, then runs what was posted under it (closing
// underlying streams, hooks, leaving the Set).
func (s *Stream) unlock() {
	p := s.post
	s.post = nil
	s.mu.Unlock()
	for _, f := range p {
		f()
	}
}

// ID is the stream's id.
func (s *Stream) ID() ID { return s.id }

// State reports whether the stream is attached to an underlying stream,
// and since when it has been in that state. An ended stream is not
// attached.
func (s *Stream) State() (attached bool, since time.Time) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.att != nil && s.att.live, s.since
}

var closedChan = func() chan struct{} { c := make(chan struct{}); close(c); return c }()

// Detached returns a channel that is closed once the stream is not
// attached: at once if it is detached (or ended) now, else when its current
// underlying stream is given up. Call it again after a re-attachment.
func (s *Stream) Detached() <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.att == nil || !s.att.live {
		return closedChan
	}
	return s.att.done
}

// Done is closed when the stream has ended: finished normally, expired,
// aborted, refused, or broken by a protocol error.
func (s *Stream) Done() <-chan struct{} { return s.done }

// Err is why the stream ended (an *EndedError), or nil if it has not ended
// or ended normally.
func (s *Stream) Err() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.endErr
}

// startLocked starts the reader and sender of a, which is now live.
func (s *Stream) startLocked(a *attachment) {
	a.live = true
	a.running.Store(2)
	go s.sendLoop(a)
	go s.readLoop(a)
}

// kickLocked tells the live sender there is something to write.
func (s *Stream) kickLocked() {
	if a := s.att; a != nil && a.live {
		select {
		case a.kick <- struct{}{}:
		default:
		}
	}
}

// retireLocked gives up a. A graceful retirement lets the sender finish its
// write and send closeFrame (if any) before half-closing, and the reader
// read to the peer's end, both bounded by closeLinger; otherwise the
// underlying stream is closed at once.
func (s *Stream) retireLocked(a *attachment, graceful bool, closeFrame []byte) {
	if a == nil || a.retired {
		return
	}
	a.retired = true
	close(a.done)
	if s.att == a {
		s.att = nil
	}
	if !graceful || !a.live {
		s.post = append(s.post, a.closeUnder)
		return
	}
	a.graceful = true
	a.closeFrame = closeFrame
	s.post = append(s.post, func() {
		dl := time.Now().Add(closeLinger)
		_ = a.under.SetWriteDeadline(dl)
		_ = a.under.SetReadDeadline(dl)
	})
}

// detachedLocked starts the window of a stream that was attached until now.
func (s *Stream) detachedLocked(err error) {
	now := time.Now()
	s.since = now
	s.epoch++
	epoch := s.epoch
	s.windowTimer = time.AfterFunc(s.cfg.Window, func() { s.expire(epoch, now) })
	if h := s.cfg.OnDetach; h != nil {
		s.post = append(s.post, func() { h(s, err) })
	}
}

func (s *Stream) stopWindowLocked() {
	if s.windowTimer != nil {
		s.windowTimer.Stop()
		s.windowTimer = nil
	}
}

// detach gives up a after an error on it, if it is still the current one.
func (s *Stream) detach(a *attachment, err error) {
	s.mu.Lock()
	if s.att != a || a.retired {
		s.mu.Unlock()
		return
	}
	s.retireLocked(a, false, nil)
	s.detachedLocked(err)
	s.unlock()
}

func (s *Stream) expire(epoch uint64, at time.Time) {
	s.mu.Lock()
	if s.ended || s.epoch != epoch || (s.att != nil && s.att.live) {
		s.mu.Unlock()
		return
	}
	var err error = &EndedError{Reason: s.cfg.ExpiredReason(time.Since(at)), Err: ErrExpired}
	if s.rfin && s.fin && s.acked == s.dataEnd {
		// Everything arrived both ways but the Ack of our Fin: the link died
		// as the stream finished (most likely the peer has, and has nothing
		// more to say). Our application missed nothing; if the peer's missed
		// the Fin, the peer's own end says so.
		err = nil
	}
	s.endLocked(err, false, nil)
	s.unlock()
}

// endLocked ends the stream: err nil for a normal end, else the
// *EndedError Read and Write return from now on. See retireLocked for
// graceful and closeFrame.
func (s *Stream) endLocked(err error, graceful bool, closeFrame []byte) {
	if s.ended {
		return
	}
	s.ended = true
	s.endErr = err
	s.since = time.Now()
	s.stopWindowLocked()
	if s.ackTimer != nil {
		s.ackTimer.Stop()
		s.ackArmed = false
	}
	if s.lingerTimer != nil {
		s.lingerTimer.Stop()
		s.lingerTimer = nil
	}
	s.retireLocked(s.att, graceful, closeFrame)
	if b := s.cfg.Budget; b != nil {
		b.give(s.buffered)
	}
	s.buffered = 0
	for _, c := range s.chunks[s.head:] {
		c.recycle()
	}
	s.chunks, s.head = nil, 0
	s.rq.wake()
	s.wq.wake()
	s.sq.wake()
	if set := s.set; set != nil {
		t := s.tombLocked()
		s.post = append(s.post, func() { set.forget(s, t) })
	}
	// After leaving the set: who sees Done sees the set without s.
	s.post = append(s.post, func() { close(s.done) })
}

// tombLocked is what the set remembers of s, which has ended.
func (s *Stream) tombLocked() tomb {
	t := tomb{clean: s.endErr == nil, rseq: s.rseq, wseq: s.wseq, until: time.Now().Add(s.cfg.Window)}
	var e *EndedError
	if errors.As(s.endErr, &e) {
		t.reason = e.Reason
		if t.reason == "" {
			t.reason = e.Err.Error()
		}
	}
	t.reason = sanitizeReason(t.reason)
	return t
}

// protocolError ends the stream after the peer broke the protocol on a,
// telling the peer why.
func (s *Stream) protocolError(a *attachment, err error) {
	s.mu.Lock()
	if s.att != a || a.retired {
		s.mu.Unlock()
		return
	}
	s.protocolErrorLocked(err)
	s.unlock()
}

func (s *Stream) protocolErrorLocked(err error) {
	s.dropQueueLocked()
	frame := appendFrame(nil, frame{typ: frameClose, reason: sanitizeReason(err.Error())})
	s.endLocked(&EndedError{Err: err}, true, frame)
}

// checkFinishLocked ends the stream once nothing more is to cross the wire:
// our Fin acknowledged, and the peer's Fin received and acknowledged; or
// our Fin acknowledged after Close while the peer still had its side open
// (it is told with a Close frame).
func (s *Stream) checkFinishLocked() {
	if s.ended || !s.fin || s.acked != s.wseq {
		return
	}
	switch {
	case s.rfin && s.ackSent == s.rseq:
		s.endLocked(nil, true, nil)
	case s.rfin:
		s.ackDue = true
		s.kickLocked()
	case s.closed:
		frame := appendFrame(nil, frame{typ: frameClose, reason: "the peer closed the stream"})
		s.endLocked(nil, true, frame)
	}
}

func (s *Stream) dropQueueLocked() {
	for _, b := range s.queue {
		freePayload(b)
	}
	s.queue, s.qoff, s.queued = nil, 0, 0
	s.sq.wake()
}

// sendLoop is the only writer of a.under: data, replays, acks, Fin and a
// last Close frame.
func (s *Stream) sendLoop(a *attachment) {
	defer a.exit()
	batch := make([]byte, 0, writeCap)
	for {
		s.mu.Lock()
		if a.retired {
			graceful, closeFrame := a.graceful, a.closeFrame
			s.mu.Unlock()
			if graceful {
				if closeFrame != nil {
					_ = writeAll(a.under, closeFrame)
				}
				_ = a.under.CloseWrite()
			}
			return
		}
		var direct *chunk
		batch, direct = s.nextLocked(batch[:0])
		s.unlock()
		if len(batch) == 0 && direct == nil {
			select {
			case <-a.kick:
			case <-a.done:
			}
			continue
		}
		var err error
		if len(batch) > 0 {
			err = writeAll(a.under, batch)
		}
		if direct != nil {
			if err == nil {
				err = writeAll(a.under, direct.buf)
			}
			s.mu.Lock()
			direct.busy--
			if direct.dead {
				direct.recycle()
			}
			s.mu.Unlock()
		}
		if err != nil {
			s.detach(a, err)
			return
		}
	}
}

// nextLocked picks what to write next: frames copied into batch (at most
// writeCap bytes), or one full chunk to write as it is (not both at once,
// but an Ack may come first).
func (s *Stream) nextLocked(batch []byte) ([]byte, *chunk) {
	if s.rseq > s.ackSent && (s.ackDue || s.rseq-s.ackSent >= s.ackEvery) {
		batch = appendFrame(batch, frame{typ: frameAck, ack: s.rseq})
		s.ackSent = s.rseq
		s.ackDue = false
		if s.ackArmed {
			s.ackTimer.Stop()
			s.ackArmed = false
		}
		s.checkFinishLocked()
		if s.ended {
			return batch, nil
		}
	}
	for s.sendPos < s.dataEnd {
		c := s.chunks[s.chunkAtLocked(s.sendPos)]
		if c.seq == s.sendPos && c.full() && cap(c.buf) == bigChunk {
			if len(batch) > ackFrameLen {
				break // write the batch first; this chunk goes out next time
			}
			if !c.headed {
				putDataHeader(c.buf, len(c.buf)-dataHeaderLen)
				c.headed = true
			}
			c.busy++
			s.sendPos = c.end()
			return batch, c
		}
		// One frame per chunk piece, so that the next full chunk can still
		// go out as it is.
		room := writeCap - len(batch) - dataHeaderLen
		if room <= 0 {
			break
		}
		off := dataHeaderLen + int(s.sendPos-c.seq)
		n := min(room, len(c.buf)-off)
		var h [dataHeaderLen]byte
		putDataHeader(h[:], n)
		batch = append(batch, h[:]...)
		batch = append(batch, c.buf[off:off+n]...)
		s.sendPos += uint64(n)
	}
	if s.fin && s.sendPos == s.dataEnd && len(batch) < writeCap {
		batch = append(batch, frameFin)
		s.sendPos++
	}
	return batch, nil
}

// chunkAtLocked returns the index of the chunk holding sequence number pos,
// which lies in [acked, dataEnd).
func (s *Stream) chunkAtLocked(pos uint64) int {
	cs := s.chunks[s.head:]
	return s.head + sort.Search(len(cs), func(i int) bool { return cs[i].end() > pos })
}

// readLoop reads a's frames until a fails or is retired.
func (s *Stream) readLoop(a *attachment) {
	defer a.exit()
	// A small buffer: frame headers and Acks come out of it, payloads are
	// read straight into their own buffers past it.
	br := bufio.NewReaderSize(a.under, 512)
	for {
		f, err := readFrame(br, allocPayload)
		if err != nil {
			if errors.Is(err, ErrProtocol) {
				s.protocolError(a, err)
			} else {
				s.detach(a, err)
			}
			return
		}
		switch f.typ {
		case frameData:
			s.deliver(a, f.data)
		case frameAck:
			s.onAck(a, f.ack)
		case frameFin:
			s.onFin(a)
		case frameClose:
			s.onClose(a, f.reason)
		}
	}
}

// deliver queues a received payload, waiting for room (backpressure).
func (s *Stream) deliver(a *attachment, p []byte) {
	s.mu.Lock()
	for {
		if s.att != a || a.retired {
			s.mu.Unlock()
			freePayload(p)
			return
		}
		if s.rfin {
			s.protocolErrorLocked(fmt.Errorf("%w: data after fin", ErrProtocol))
			s.unlock()
			freePayload(p)
			return
		}
		if s.closed {
			freePayload(p) // Close stops delivery; the bytes are still acknowledged
			break
		}
		if s.queued == 0 || s.queued+len(p) <= s.cfg.Buffer {
			s.queue = append(s.queue, p)
			s.queued += len(p)
			s.rq.wake()
			break
		}
		ch := s.sq.wait()
		s.mu.Unlock()
		select {
		case <-ch:
		case <-a.done:
		}
		s.mu.Lock()
	}
	s.rseq += uint64(len(p))
	switch {
	case s.rseq-s.ackSent >= s.ackEvery:
		s.kickLocked()
	case !s.ackArmed:
		s.ackArmed = true
		if s.ackTimer == nil {
			s.ackTimer = time.AfterFunc(ackDelay, s.ackTimeout)
		} else {
			s.ackTimer.Reset(ackDelay)
		}
	}
	s.unlock()
}

func (s *Stream) ackTimeout() {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.ackArmed = false
	if !s.ended && s.rseq > s.ackSent {
		s.ackDue = true
		s.kickLocked()
	}
}

func (s *Stream) onAck(a *attachment, v uint64) {
	s.mu.Lock()
	defer s.unlock()
	if s.att != a || a.retired {
		return
	}
	if v < s.acked || v > s.sendPos {
		s.protocolErrorLocked(fmt.Errorf("%w: ack %d outside %d..%d, what was sent and not yet acknowledged",
			ErrProtocol, v, s.acked, s.sendPos))
		return
	}
	s.ackedLocked(v)
	s.checkFinishLocked()
}

// ackedLocked records that the peer has received everything before v, and
// frees the replay buffer up to there.
func (s *Stream) ackedLocked(v uint64) {
	freed := int(min(v, s.dataEnd) - min(s.acked, s.dataEnd))
	s.acked = v
	if freed > 0 {
		s.buffered -= freed
		if b := s.cfg.Budget; b != nil {
			b.give(freed)
		}
		s.wq.wake()
	}
	for s.head < len(s.chunks) {
		c := s.chunks[s.head]
		if c.end() > v || (!c.full() && c.busy > 0) { // a Write is filling c, the last chunk
			break
		}
		c.recycle()
		s.chunks[s.head] = nil
		s.head++
	}
	if s.head == len(s.chunks) {
		s.chunks, s.head = s.chunks[:0], 0
	} else if s.head >= 64 && s.head > len(s.chunks)/2 {
		n := copy(s.chunks, s.chunks[s.head:])
		clear(s.chunks[n:])
		s.chunks, s.head = s.chunks[:n], 0
	}
}

func (s *Stream) onFin(a *attachment) {
	s.mu.Lock()
	defer s.unlock()
	if s.att != a || a.retired {
		return
	}
	if s.rfin {
		s.protocolErrorLocked(fmt.Errorf("%w: second fin", ErrProtocol))
		return
	}
	s.rfin = true
	s.rseq++
	s.ackDue = true
	s.kickLocked()
	s.rq.wake()
	s.checkFinishLocked()
}

func (s *Stream) onClose(a *attachment, reason string) {
	s.mu.Lock()
	defer s.unlock()
	if s.att != a || a.retired {
		return
	}
	s.endLocked(&EndedError{Reason: reason, Err: ErrAborted}, false, nil)
}

// Read reads received data. After the peer's CloseWrite it returns io.EOF
// once everything is read; after Close, net.ErrClosed; after an abnormal
// end, the *EndedError once the data received before it is read (at once
// after Abort).
func (s *Stream) Read(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for {
		if s.closed {
			return 0, net.ErrClosed
		}
		if !s.rdl.IsZero() && !time.Now().Before(s.rdl) {
			return 0, os.ErrDeadlineExceeded
		}
		if len(p) == 0 {
			return 0, nil
		}
		if s.queued > 0 {
			return s.readQueueLocked(p), nil
		}
		if s.rfin {
			return 0, io.EOF
		}
		if s.ended {
			if s.endErr == nil {
				return 0, io.EOF
			}
			return 0, s.endErr
		}
		if err := s.waitLocked(s.rq.wait(), nil, s.rdl); err != nil {
			return 0, err
		}
	}
}

func (s *Stream) readQueueLocked(p []byte) int {
	n := 0
	for n < len(p) && len(s.queue) > 0 {
		b := s.queue[0]
		c := copy(p[n:], b[s.qoff:])
		n += c
		s.qoff += c
		if s.qoff == len(b) {
			freePayload(b)
			s.queue[0] = nil
			s.queue = s.queue[1:]
			s.qoff = 0
		}
	}
	s.queued -= n
	s.sq.wake()
	return n
}

// waitLocked waits, with mu released, for ch or budget to close or the
// deadline to pass (os.ErrDeadlineExceeded).
func (s *Stream) waitLocked(ch, budget <-chan struct{}, deadline time.Time) error {
	s.mu.Unlock()
	defer s.mu.Lock()
	if deadline.IsZero() {
		select {
		case <-ch:
		case <-budget:
		}
		return nil
	}
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-ch:
	case <-budget:
	case <-t.C:
	}
	return nil // the caller checks the deadline again
}

// Write copies p into the replay buffer and returns; the frames go out as
// the underlying stream takes them. It blocks while the buffer (or the
// Budget) is full.
func (s *Stream) Write(p []byte) (int, error) {
	s.wmu.Lock()
	defer s.wmu.Unlock()
	s.mu.Lock()
	defer s.unlock()
	big := len(p) >= bulkWrite
	n := 0
	for {
		if err := s.writeErrLocked(); err != nil {
			return n, err
		}
		if !s.wdl.IsZero() && !time.Now().Before(s.wdl) {
			return n, os.ErrDeadlineExceeded
		}
		if n == len(p) {
			return n, nil
		}
		// Fill the last chunk, or a new one.
		var c *chunk
		spare := smallChunk - dataHeaderLen
		if big {
			spare = bigChunk - dataHeaderLen
		}
		if l := len(s.chunks); l > s.head && !s.chunks[l-1].full() {
			c = s.chunks[l-1]
			spare = cap(c.buf) - len(c.buf)
		}
		m := min(len(p)-n, spare, s.cfg.Buffer-s.buffered)
		var budgetCh <-chan struct{}
		if m > 0 && s.cfg.Budget != nil {
			m, budgetCh = s.cfg.Budget.take(m)
		}
		if m <= 0 {
			_ = s.waitLocked(s.wq.wait(), budgetCh, s.wdl)
			continue
		}
		s.buffered += m
		fresh := c == nil
		if fresh {
			c = newChunk(s.dataEnd, big)
		}
		// Copy without holding mu: the bytes past len(c.buf) are read by
		// nobody, and busy keeps c from being recycled meanwhile.
		off := len(c.buf)
		dst := c.buf[off : off+m]
		c.busy++
		s.mu.Unlock()
		copy(dst, p[n:n+m])
		s.mu.Lock()
		c.busy--
		switch {
		case s.ended: // the end released the reservation, and dropped c
			if fresh || c.dead {
				c.recycle()
			}
			continue
		case s.wclosed:
			s.buffered -= m
			if b := s.cfg.Budget; b != nil {
				b.give(m)
			}
			if fresh {
				c.recycle()
			}
			continue
		}
		c.buf = c.buf[:off+m]
		if fresh {
			s.chunks = append(s.chunks, c)
		}
		s.dataEnd += uint64(m)
		s.wseq += uint64(m)
		n += m
		s.kickLocked()
	}
}

func (s *Stream) writeErrLocked() error {
	switch {
	case s.closed:
		return net.ErrClosed
	case s.ended && s.endErr != nil:
		return s.endErr
	case s.wclosed || s.ended:
		return net.ErrClosed
	}
	return nil
}

// CloseWrite half-closes the stream: the peer reads io.EOF after everything
// written so far, and this side can still read. The Fin is replayed after a
// re-attachment until acknowledged.
func (s *Stream) CloseWrite() error {
	s.mu.Lock()
	defer s.unlock()
	switch {
	case s.closed:
		return net.ErrClosed
	case s.wclosed:
		return nil
	case s.ended && s.endErr != nil:
		return s.endErr
	}
	s.queueFinLocked()
	return nil
}

func (s *Stream) queueFinLocked() {
	s.wclosed = true
	if s.ended {
		return
	}
	s.fin = true
	s.wseq++
	s.kickLocked()
	s.wq.wake()
}

// Close closes the stream as a TCP close does, without blocking: see Stream.
// Read and Write return net.ErrClosed from now on.
func (s *Stream) Close() error {
	s.mu.Lock()
	defer s.unlock()
	if s.closed {
		return nil
	}
	s.closed = true
	s.dropQueueLocked()
	s.rq.wake()
	if !s.wclosed {
		s.queueFinLocked()
	}
	s.wq.wake()
	s.checkFinishLocked()
	if !s.ended {
		// A peer that never takes the last bytes (its application stopped
		// reading) must not keep them here for ever.
		s.lingerTimer = time.AfterFunc(s.cfg.Window, s.lingerExpired)
	}
	return nil
}

func (s *Stream) lingerExpired() {
	s.mu.Lock()
	defer s.unlock()
	if s.ended {
		return
	}
	reason := fmt.Sprintf("the peer did not take the stream's last bytes within %v of its close", s.cfg.Window)
	frame := appendFrame(nil, frame{typ: frameClose, reason: reason})
	s.endLocked(&EndedError{Reason: reason, Err: ErrExpired}, true, frame)
}

// Abort ends the stream now: the peer is sent a Close frame with reason
// (best effort; a peer that is detached learns it when it tries to resume),
// and Read and Write return an *EndedError wrapping ErrAborted. A reason
// that is not valid UTF-8, has control characters or is longer than
// MaxReasonLen is cleaned up, not refused.
func (s *Stream) Abort(reason string) {
	reason = sanitizeReason(reason)
	s.mu.Lock()
	defer s.unlock()
	if s.ended {
		return
	}
	s.dropQueueLocked()
	frame := appendFrame(nil, frame{typ: frameClose, reason: reason})
	s.endLocked(&EndedError{Reason: reason, Err: ErrAborted}, true, frame)
}

// LocalAddr is the address of the current (or last) underlying stream.
func (s *Stream) LocalAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last.LocalAddr()
}

// RemoteAddr is the peer address of the current (or last) underlying stream.
func (s *Stream) RemoteAddr() net.Addr {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last.RemoteAddr()
}

// SetDeadline sets the read and write deadlines, as net.Conn.
func (s *Stream) SetDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return net.ErrClosed
	}
	s.rdl, s.wdl = t, t
	s.rq.wake()
	s.wq.wake()
	return nil
}

// SetReadDeadline sets the read deadline, as net.Conn.
func (s *Stream) SetReadDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return net.ErrClosed
	}
	s.rdl = t
	s.rq.wake()
	return nil
}

// SetWriteDeadline sets the write deadline, as net.Conn.
func (s *Stream) SetWriteDeadline(t time.Time) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return net.ErrClosed
	}
	s.wdl = t
	s.wq.wake()
	return nil
}

// Resume re-attaches s over under, which the caller has just opened and on
// which it has written the tunnel Header naming the resume service: it
// writes the Resume request, reads the answer (bounded by ctx), and goes on
// from what the peer has received. A stream that is still attached gives
// up its old underlying stream first.
//
// Resume takes under over: it closes it on failure. If the handshake fails
// (the new link died too, ctx ended) the stream stays detached and Resume
// may be called again. A refused answer ends the stream with the peer's
// reason, an *EndedError wrapping ErrRefused, which Resume returns.
func (s *Stream) Resume(ctx context.Context, under tunnel.Stream) error {
	s.mu.Lock()
	if s.ended {
		err := s.endErrLocked()
		s.mu.Unlock()
		_ = under.Close()
		return err
	}
	a := s.beginAttachLocked(under)
	rseq := s.rseq
	s.unlock()

	done := bound(ctx, under)
	err := WriteResumeRequest(under, ResumeRequest{ID: s.id, Received: rseq})
	var ans ResumeAnswer
	if err == nil {
		ans, err = ReadResumeAnswer(under)
	}
	if cerr := done(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		return s.abandon(a, fmt.Errorf("resume: stream %v: %w", s.id, err))
	}

	s.mu.Lock()
	if err := s.supersededLocked(a, under); err != nil {
		return err
	}
	if !ans.OK {
		e := &EndedError{Reason: ans.Reason, Err: ErrRefused}
		s.endLocked(e, false, nil)
		s.unlock()
		return e
	}
	if ans.Received < s.acked || ans.Received > s.wseq {
		perr := fmt.Errorf("%w: the peer says it received %d, outside %d..%d, what this side sent",
			ErrProtocol, ans.Received, s.acked, s.wseq)
		s.retireLocked(a, false, nil) // not live: closed by unlock, after the Close frame
		s.dropQueueLocked()
		s.endLocked(&EndedError{Err: perr}, false, nil)
		s.post = append([]func(){func() {
			_ = under.SetWriteDeadline(time.Now().Add(closeLinger))
			_ = writeAll(under, appendFrame(nil, frame{typ: frameClose, reason: sanitizeReason(perr.Error())}))
		}}, s.post...)
		err := s.endErr
		s.unlock()
		return err
	}
	s.sendPos = ans.Received
	s.ackedLocked(ans.Received)
	s.ackSent = rseq
	s.attachedLocked(a)
	s.unlock()
	return nil
}

// beginAttachLocked gives up the current attachment (if any) for a new one
// over under, still in its handshake.
func (s *Stream) beginAttachLocked(under tunnel.Stream) *attachment {
	if old := s.att; old != nil {
		wasLive := old.live
		s.retireLocked(old, false, nil)
		if wasLive {
			s.detachedLocked(errReplaced)
		}
	}
	a := newAttachment(under)
	s.att = a
	s.last = under
	return a
}

// abandon gives up a after its handshake failed with err; the stream stays
// detached. If the stream ended meanwhile, that is the error to report.
func (s *Stream) abandon(a *attachment, err error) error {
	s.mu.Lock()
	if s.att == a {
		s.att = nil
	}
	if s.ended && s.endErr != nil {
		err = s.endErr
	}
	s.mu.Unlock()
	a.closeUnder()
	return err
}

// attachedLocked makes a, whose handshake succeeded, the live attachment.
func (s *Stream) attachedLocked(a *attachment) {
	s.stopWindowLocked()
	s.epoch++
	s.since = time.Now()
	s.startLocked(a)
	if h := s.cfg.OnAttach; h != nil {
		s.post = append(s.post, func() { h(s) })
	}
	s.kickLocked()
	s.checkFinishLocked()
}

func (s *Stream) endErrLocked() error {
	if s.endErr != nil {
		return s.endErr
	}
	return fmt.Errorf("resume: stream %v: %w", s.id, net.ErrClosed)
}

// accept is Set.Accept's part on a stream it found: r is what the peer
// received. done ends the handshake's bounds (see bound).
func (s *Stream) accept(r uint64, under tunnel.Stream, done func() error) error {
	s.mu.Lock()
	if s.ended { // and about to leave the set
		t := s.tombLocked()
		s.mu.Unlock()
		return answerEnded(s.id, t, r, under, done)
	}
	if r < s.acked || r > s.wseq {
		perr := fmt.Errorf("%w: the peer says it received %d, outside %d..%d, what this side sent",
			ErrProtocol, r, s.acked, s.wseq)
		s.dropQueueLocked()
		s.endLocked(&EndedError{Err: perr}, false, nil)
		err := s.endErr
		s.unlock()
		refuse(under, done, sanitizeReason(perr.Error()))
		return err
	}
	a := s.beginAttachLocked(under)
	s.sendPos = r
	s.ackedLocked(r)
	rseq := s.rseq
	s.unlock()

	err := WriteResumeAnswer(under, ResumeAnswer{OK: true, Received: rseq})
	if cerr := done(); cerr != nil && err == nil {
		err = cerr
	}
	if err != nil {
		return s.abandon(a, fmt.Errorf("resume: accept stream %v: %w", s.id, err))
	}
	s.mu.Lock()
	if err := s.supersededLocked(a, under); err != nil {
		return err
	}
	s.ackSent = rseq
	s.attachedLocked(a)
	s.unlock()
	return nil
}

// bound makes the end of ctx interrupt I/O on under. The function it
// returns lifts that, and reports ctx's error if it did interrupt.
func bound(ctx context.Context, under tunnel.Stream) func() error {
	if dl, ok := ctx.Deadline(); ok {
		_ = under.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = under.SetDeadline(time.Unix(1, 0)) })
	return func() error {
		if !stop() {
			return ctx.Err()
		}
		_ = under.SetDeadline(time.Time{})
		return nil
	}
}

// supersededLocked handles a handshake that finished after a was replaced
// (another re-attachment, or the stream ended meanwhile): it unlocks s,
// closes under and says why; nil, with s still locked, if a is current.
func (s *Stream) supersededLocked(a *attachment, under tunnel.Stream) error {
	if s.att == a {
		return nil
	}
	err := s.endErrLocked()
	s.mu.Unlock()
	_ = under.Close()
	if err == nil {
		err = fmt.Errorf("resume: stream %v: re-attached elsewhere meanwhile", s.id)
	}
	return err
}
