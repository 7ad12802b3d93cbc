package resume

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/tether-dev/tether/tunnel/internal/wirecheck"
)

// Frames on an attached stream (all integers big endian), each a type byte
// then its fields:
//
//	Data   1  length uint32 (1..MaxFrame), then length bytes
//	Ack    2  received uint64: every unit received in order (data bytes, plus
//	          1 for a Fin); never decreasing, never beyond what was sent
//	Fin    3  no fields; the sender half-closed; takes one unit of sequence
//	          space, so it is acknowledged and replayed like data
//	Close  4  reason length uint16 (<= MaxReasonLen), then the reason: UTF-8
//	          without control characters; the sender ended the stream for good
//
// Handshake frames, written right after the tunnel Header by the caller:
//
//	Open            version(1)=1, id [16]byte
//	Resume request  version(1)=1, id [16]byte, received uint64
//	Resume answer   version(1)=1, status(1) 0 ok / 1 refused, received uint64
//	                (0 when refused), reason length uint16, reason (empty
//	                when ok; rules as for Close)
//
// Unlike the tunnel Header these frames carry no length, so a reader cannot
// skip a version it does not know: a new version is only sent to a peer that
// announced it.
const (
	// MaxFrame is the largest payload of one Data frame.
	MaxFrame = 64 << 10
	// MaxReasonLen is the longest reason of a Close frame or a refused
	// Resume answer, in bytes.
	MaxReasonLen = 512

	frameData  = 1
	frameAck   = 2
	frameFin   = 3
	frameClose = 4

	dataHeaderLen  = 1 + 4
	ackFrameLen    = 1 + 8
	closeHeaderLen = 1 + 2

	handshakeVersion = 1
	openLen          = 1 + 16
	requestLen       = 1 + 16 + 8
	answerPrefixLen  = 1 + 1 + 8 + 2
	answerStatusOK   = 0
	answerStatusFail = 1
)

// ID names a resumable stream on both ends; it is what a Resume request
// carries. NewID draws it at random, so it cannot be guessed from another.
type ID [16]byte

// NewID returns a random ID.
func NewID() ID {
	var id ID
	_, _ = rand.Read(id[:]) // never fails (crypto/rand aborts the process instead)
	return id
}

// String is the ID in hex, as logs and ParseID write it.
func (id ID) String() string { return hex.EncodeToString(id[:]) }

// ParseID parses the 32 hex digits String prints.
func ParseID(s string) (ID, error) {
	var id ID
	if len(s) != 2*len(id) {
		return ID{}, fmt.Errorf("resume: stream id %q: want %d hex digits", s, 2*len(id))
	}
	if _, err := hex.Decode(id[:], []byte(s)); err != nil {
		return ID{}, fmt.Errorf("resume: stream id %q: %w", s, err)
	}
	return id, nil
}

func (id ID) validate() error {
	if id == (ID{}) {
		return fmt.Errorf("%w: stream id is all zeros", ErrProtocol)
	}
	return nil
}

// frame is one decoded frame of an attached stream.
type frame struct {
	typ    byte
	data   []byte // frameData
	ack    uint64 // frameAck
	reason string // frameClose
}

// appendFrame appends the encoding of f to b. It does not validate f: the
// stream only builds valid frames.
func appendFrame(b []byte, f frame) []byte {
	switch f.typ {
	case frameData:
		b = append(b, frameData)
		b = binary.BigEndian.AppendUint32(b, uint32(len(f.data)))
		b = append(b, f.data...)
	case frameAck:
		b = append(b, frameAck)
		b = binary.BigEndian.AppendUint64(b, f.ack)
	case frameFin:
		b = append(b, frameFin)
	case frameClose:
		b = append(b, frameClose)
		b = binary.BigEndian.AppendUint16(b, uint16(len(f.reason)))
		b = append(b, f.reason...)
	}
	return b
}

// putDataHeader writes a Data frame header for n payload bytes into b[:5].
func putDataHeader(b []byte, n int) {
	b[0] = frameData
	binary.BigEndian.PutUint32(b[1:dataHeaderLen], uint32(n))
}

// readFrame reads one frame from r. A malformed frame is an error wrapping
// ErrProtocol. Input that ends at a frame boundary is io.EOF, and input that
// ends inside a frame is io.ErrUnexpectedEOF (a link cut mid-frame, not a
// protocol error); other errors of r come back as they are. alloc provides
// the buffer of a Data payload of n bytes.
func readFrame(r io.Reader, alloc func(n int) []byte) (frame, error) {
	var b [8]byte
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return frame{}, err
	}
	f := frame{typ: b[0]}
	switch f.typ {
	case frameData:
		if err := readRest(r, b[:4]); err != nil {
			return frame{}, err
		}
		n := binary.BigEndian.Uint32(b[:4])
		if n == 0 || n > MaxFrame {
			return frame{}, fmt.Errorf("%w: data frame of %d bytes, want 1..%d", ErrProtocol, n, MaxFrame)
		}
		f.data = alloc(int(n))
		if err := readRest(r, f.data); err != nil {
			return frame{}, err
		}
	case frameAck:
		if err := readRest(r, b[:8]); err != nil {
			return frame{}, err
		}
		f.ack = binary.BigEndian.Uint64(b[:8])
	case frameFin:
	case frameClose:
		if err := readRest(r, b[:2]); err != nil {
			return frame{}, err
		}
		n := int(binary.BigEndian.Uint16(b[:2]))
		if n > MaxReasonLen {
			return frame{}, fmt.Errorf("%w: close reason of %d bytes, max %d", ErrProtocol, n, MaxReasonLen)
		}
		reason := make([]byte, n)
		if err := readRest(r, reason); err != nil {
			return frame{}, err
		}
		f.reason = string(reason)
		if err := validateReason(f.reason); err != nil {
			return frame{}, fmt.Errorf("close frame: %w", err)
		}
	default:
		return frame{}, fmt.Errorf("%w: unknown frame type %d", ErrProtocol, f.typ)
	}
	return f, nil
}

// readRest reads the rest of a frame whose first byte was read: any end of
// input is a truncated frame.
func readRest(r io.Reader, b []byte) error {
	if _, err := io.ReadFull(r, b); err != nil {
		if errors.Is(err, io.EOF) {
			return io.ErrUnexpectedEOF
		}
		return err
	}
	return nil
}

// sanitizeReason makes s a valid reason: control characters and invalid
// UTF-8 become '?', and it is cut at a rune boundary to MaxReasonLen bytes.
func sanitizeReason(s string) string {
	if validateReason(s) == nil {
		return s
	}
	var b strings.Builder
	for _, r := range strings.ToValidUTF8(s, "?") {
		if unicode.IsControl(r) {
			r = '?'
		}
		if b.Len()+utf8.RuneLen(r) > MaxReasonLen {
			break
		}
		b.WriteRune(r)
	}
	return b.String()
}

// WriteOpen writes the Open frame that starts a new resumable stream, in a
// single Write. The side that opens the stream sends it right after the
// tunnel Header.
func WriteOpen(w io.Writer, id ID) error {
	if err := id.validate(); err != nil {
		return fmt.Errorf("resume: write open: %w", err)
	}
	var b [openLen]byte
	b[0] = handshakeVersion
	copy(b[1:], id[:])
	if err := writeAll(w, b[:]); err != nil {
		return fmt.Errorf("resume: write open: %w", err)
	}
	return nil
}

// ReadOpen reads exactly one Open frame and validates it. It reads nothing
// beyond the frame.
func ReadOpen(r io.Reader) (ID, error) {
	var b [openLen]byte
	if err := readHandshake(r, b[:]); err != nil {
		return ID{}, fmt.Errorf("resume: read open: %w", err)
	}
	if b[0] != handshakeVersion {
		return ID{}, fmt.Errorf("resume: read open: %w: unsupported version %d", ErrProtocol, b[0])
	}
	id := ID(b[1:])
	if err := id.validate(); err != nil {
		return ID{}, fmt.Errorf("resume: read open: %w", err)
	}
	return id, nil
}

// ResumeRequest asks the peer to re-attach stream ID over the tunnel stream
// it arrives on.
type ResumeRequest struct {
	ID ID
	// Received is everything the requester received of the stream in order
	// (data bytes, plus 1 for a Fin): the peer replays from there.
	Received uint64
}

// WriteResumeRequest writes req as one frame, in a single Write.
func WriteResumeRequest(w io.Writer, req ResumeRequest) error {
	if err := req.ID.validate(); err != nil {
		return fmt.Errorf("resume: write resume request: %w", err)
	}
	var b [requestLen]byte
	b[0] = handshakeVersion
	copy(b[1:17], req.ID[:])
	binary.BigEndian.PutUint64(b[17:], req.Received)
	if err := writeAll(w, b[:]); err != nil {
		return fmt.Errorf("resume: write resume request: %w", err)
	}
	return nil
}

// ReadResumeRequest reads exactly one Resume request and validates it.
func ReadResumeRequest(r io.Reader) (ResumeRequest, error) {
	var b [requestLen]byte
	if err := readHandshake(r, b[:]); err != nil {
		return ResumeRequest{}, fmt.Errorf("resume: read resume request: %w", err)
	}
	if b[0] != handshakeVersion {
		return ResumeRequest{}, fmt.Errorf("resume: read resume request: %w: unsupported version %d",
			ErrProtocol, b[0])
	}
	req := ResumeRequest{ID: ID(b[1:17]), Received: binary.BigEndian.Uint64(b[17:])}
	if err := req.ID.validate(); err != nil {
		return ResumeRequest{}, fmt.Errorf("resume: read resume request: %w", err)
	}
	return req, nil
}

// ResumeAnswer is the answer to a ResumeRequest.
type ResumeAnswer struct {
	// OK: the stream is re-attached; frames follow the answer.
	OK bool
	// Received is everything the answering side received in order (0 when
	// refused): the requester replays from there.
	Received uint64
	// Reason says why the stream was refused (empty when OK). At most
	// MaxReasonLen bytes of UTF-8 without control characters.
	Reason string
}

func (a ResumeAnswer) validate() error {
	if a.OK && a.Reason != "" {
		return fmt.Errorf("%w: accepted answer with a reason", ErrProtocol)
	}
	if !a.OK && a.Received != 0 {
		return fmt.Errorf("%w: refused answer with received count %d, want 0", ErrProtocol, a.Received)
	}
	return validateReason(a.Reason)
}

// WriteResumeAnswer writes a as one frame, in a single Write. An invalid
// answer (a reason on an OK, a count on a refusal, a bad reason) is refused
// before anything is written.
func WriteResumeAnswer(w io.Writer, a ResumeAnswer) error {
	if err := a.validate(); err != nil {
		return fmt.Errorf("resume: write resume answer: %w", err)
	}
	var b [answerPrefixLen + MaxReasonLen]byte
	b[0] = handshakeVersion
	b[1] = answerStatusFail
	if a.OK {
		b[1] = answerStatusOK
	}
	binary.BigEndian.PutUint64(b[2:10], a.Received)
	binary.BigEndian.PutUint16(b[10:12], uint16(len(a.Reason)))
	n := copy(b[answerPrefixLen:], a.Reason)
	if err := writeAll(w, b[:answerPrefixLen+n]); err != nil {
		return fmt.Errorf("resume: write resume answer: %w", err)
	}
	return nil
}

// ReadResumeAnswer reads exactly one Resume answer and validates it. It
// reads nothing beyond the frame, so the stream's frames follow intact.
func ReadResumeAnswer(r io.Reader) (ResumeAnswer, error) {
	var b [answerPrefixLen + MaxReasonLen]byte
	if err := readHandshake(r, b[:answerPrefixLen]); err != nil {
		return ResumeAnswer{}, fmt.Errorf("resume: read resume answer: %w", err)
	}
	if b[0] != handshakeVersion {
		return ResumeAnswer{}, fmt.Errorf("resume: read resume answer: %w: unsupported version %d",
			ErrProtocol, b[0])
	}
	var a ResumeAnswer
	switch b[1] {
	case answerStatusOK:
		a.OK = true
	case answerStatusFail:
	default:
		return ResumeAnswer{}, fmt.Errorf("resume: read resume answer: %w: unknown status %d", ErrProtocol, b[1])
	}
	a.Received = binary.BigEndian.Uint64(b[2:10])
	n := int(binary.BigEndian.Uint16(b[10:12]))
	if n > MaxReasonLen {
		return ResumeAnswer{}, fmt.Errorf("resume: read resume answer: %w: reason length %d exceeds %d",
			ErrProtocol, n, MaxReasonLen)
	}
	reason := b[answerPrefixLen : answerPrefixLen+n]
	if err := readHandshake(r, reason); err != nil {
		return ResumeAnswer{}, fmt.Errorf("resume: read resume answer reason: %w", err)
	}
	a.Reason = string(reason)
	if err := a.validate(); err != nil {
		return ResumeAnswer{}, fmt.Errorf("resume: read resume answer: %w", err)
	}
	return a, nil
}

// validateReason checks a Close frame's or a refusal's reason
// (wirecheck.Reason).
func validateReason(s string) error { return wirecheck.Reason(s, MaxReasonLen, ErrProtocol) }

// readHandshake reads a whole handshake frame part (wirecheck.ReadFull).
func readHandshake(r io.Reader, b []byte) error { return wirecheck.ReadFull(r, b, ErrProtocol) }

func writeAll(w io.Writer, b []byte) error { return wirecheck.WriteAll(w, b) }
