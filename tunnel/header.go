package tunnel

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"

	"github.com/tether-dev/tether/tunnel/internal/wirecheck"
)

// The stream header is the first thing the hub writes on every stream it
// opens; it names the service the agent should connect the stream to. The
// agent answers with a reply (ok, or a reason for refusing), then raw bytes
// flow both ways.
//
// Header frame (all integers big endian):
//
//	offset size field
//	0      1    version, 1
//	1      2    body length n, 3 in version 1, never more than 64
//	3      n    body
//
// Version 1 body:
//
//	0      1    service: 1 ssh, 2 tcp
//	1      2    port: 1..65535 for tcp, 0 for ssh
//
// Version and body length keep their place in every future version, so a
// reader always consumes a whole frame, even of a version it does not know,
// and can still write a Reply ("unsupported version") before closing.
// A version-1 body of any length but 3 is malformed: new fields come with a
// new version, which the hub only sends to agents that announced it.
//
// Reply frame:
//
//	offset size field
//	0      1    version, 1
//	1      1    status: 0 ok, 1 refused
//	2      2    reason length n, never more than 512
//	4      n    reason: UTF-8 text without control characters
//
// Reasons are shown to operators (in their terminal, on a jump that failed),
// which is why control characters (escape sequences) are refused.
const (
	headerVersion    = 1
	headerPrefixLen  = 3  // version + body length
	headerBodyLenV1  = 3  // service + port
	maxHeaderBodyLen = 64 // largest body a reader will consume

	replyVersion    = 1
	replyPrefixLen  = 4 // version + status + reason length
	replyStatusOK   = 0
	replyStatusFail = 1

	// MaxReasonLen is the longest Reply.Reason, in bytes.
	MaxReasonLen = 512
)

// ErrBadHeader is wrapped by every error about a malformed stream header or
// reply: unknown version, oversize or truncated frame, unknown service or
// status, bad port, bad reason text. Errors from the underlying reader other
// than a premature EOF are returned wrapped as they are, without it.
var ErrBadHeader = errors.New("tunnel: bad stream header")

// Service is what a stream is for; the agent connects the stream to it.
type Service uint8

const (
	// ServiceSSH connects the stream to the node's SSH server (sshd or the
	// agent's embedded one). Header.Port must be 0.
	ServiceSSH Service = 1
	// ServiceTCP connects the stream to a local TCP port on the node, if the
	// node's allow-list permits it. Header.Port names the port.
	ServiceTCP Service = 2
	// ServiceRoute carries a stream between hubs of a tree: a parent hub
	// reaching a node below one of its sites, or a site hub sending a
	// service tunnel's stream up to the nearest common hub. A route
	// request frame (tunnel/siteproto) follows the header. Header.Port must
	// be 0. A node agent refuses it.
	ServiceRoute Service = 3
	// ServiceConnect is opened by an agent towards its hub (the only stream
	// an agent opens besides the control stream): a connection accepted on
	// the agent's local listener of a service tunnel. A service connect
	// frame (tunnel/siteproto) follows the header, after a resume Open
	// frame on a session whose streams are resumable (control.CapResume).
	// Header.Port must be 0.
	ServiceConnect Service = 4
	// ServiceResume is opened by an agent or a site hub that reconnected,
	// once per resumable stream it still holds (tunnel/resume): a resume request
	// frame follows the header, and the hub re-attaches the stream of that
	// id to this new one. Only on sessions where both sides announced
	// resumable streams (control.CapResume). Header.Port must be 0.
	ServiceResume Service = 5
)

// String returns "ssh", "tcp", or "service(N)" for unknown values.
func (s Service) String() string {
	switch s {
	case ServiceSSH:
		return "ssh"
	case ServiceTCP:
		return "tcp"
	case ServiceRoute:
		return "route"
	case ServiceConnect:
		return "connect"
	case ServiceResume:
		return "resume"
	}
	return "service(" + strconv.Itoa(int(s)) + ")"
}

// Header is the first message on every stream the hub opens.
type Header struct {
	// Service is what the stream is for.
	Service Service
	// Port is the node-local TCP port for ServiceTCP (1..65535), and must be
	// 0 for ServiceSSH.
	Port uint16
}

// String returns "ssh" or "tcp:PORT", for logs.
func (h Header) String() string {
	if h.Service == ServiceTCP {
		return "tcp:" + strconv.Itoa(int(h.Port))
	}
	return h.Service.String()
}

// validate checks the invariants of a version 1 header.
func (h Header) validate() error {
	switch h.Service {
	case ServiceSSH, ServiceRoute, ServiceConnect, ServiceResume:
		if h.Port != 0 {
			return fmt.Errorf("%w: port %d given for %s, want 0", ErrBadHeader, h.Port, h.Service)
		}
	case ServiceTCP:
		if h.Port == 0 {
			return fmt.Errorf("%w: port 0 for tcp, want 1..65535", ErrBadHeader)
		}
	default:
		return fmt.Errorf("%w: unknown service %d", ErrBadHeader, uint8(h.Service))
	}
	return nil
}

// WriteHeader writes h as one version 1 frame, in a single Write. An invalid
// header (unknown service, bad port) is refused before anything is written.
func WriteHeader(w io.Writer, h Header) error {
	if err := h.validate(); err != nil {
		return fmt.Errorf("tunnel: write header: %w", err)
	}
	var b [headerPrefixLen + headerBodyLenV1]byte
	b[0] = headerVersion
	binary.BigEndian.PutUint16(b[1:3], headerBodyLenV1)
	b[3] = byte(h.Service)
	binary.BigEndian.PutUint16(b[4:6], h.Port)
	if err := writeAll(w, b[:]); err != nil {
		return fmt.Errorf("tunnel: write header: %w", err)
	}
	return nil
}

// ReadHeader reads exactly one header frame from r and validates it.
// It reads nothing beyond the frame, so the stream's payload follows intact.
func ReadHeader(r io.Reader) (Header, error) {
	var b [headerPrefixLen + maxHeaderBodyLen]byte
	if err := readFull(r, b[:headerPrefixLen]); err != nil {
		return Header{}, fmt.Errorf("tunnel: read header: %w", err)
	}
	version := b[0]
	n := int(binary.BigEndian.Uint16(b[1:3]))
	if n > maxHeaderBodyLen {
		return Header{}, fmt.Errorf("tunnel: read header: %w: body length %d exceeds %d", ErrBadHeader, n, maxHeaderBodyLen)
	}
	body := b[headerPrefixLen : headerPrefixLen+n]
	if err := readFull(r, body); err != nil {
		return Header{}, fmt.Errorf("tunnel: read header body: %w", err)
	}
	if version != headerVersion {
		return Header{}, fmt.Errorf("tunnel: read header: %w: unsupported version %d", ErrBadHeader, version)
	}
	if n != headerBodyLenV1 {
		return Header{}, fmt.Errorf("tunnel: read header: %w: body length %d, want %d in version 1", ErrBadHeader, n,
			headerBodyLenV1)
	}
	h := Header{Service: Service(body[0]), Port: binary.BigEndian.Uint16(body[1:3])}
	if err := h.validate(); err != nil {
		return Header{}, fmt.Errorf("tunnel: read header: %w", err)
	}
	return h, nil
}

// Reply is the agent's answer to a Header.
type Reply struct {
	// OK reports that the agent connected the stream to the service; bytes
	// flow from here on. If false the agent closes the stream after the reply.
	OK bool
	// Reason says why the agent refused (or, rarely, notes something about
	// an accepted stream). At most MaxReasonLen bytes of UTF-8 without
	// control characters.
	Reason string
}

// WriteReply writes rep as one version 1 frame, in a single Write. A reason
// that breaks the rules of Reply.Reason is refused before anything is
// written.
func WriteReply(w io.Writer, rep Reply) error {
	if err := validateReason(rep.Reason); err != nil {
		return fmt.Errorf("tunnel: write reply: %w", err)
	}
	var buf [replyPrefixLen + MaxReasonLen]byte
	buf[0] = replyVersion
	buf[1] = replyStatusFail
	if rep.OK {
		buf[1] = replyStatusOK
	}
	binary.BigEndian.PutUint16(buf[2:4], uint16(len(rep.Reason)))
	n := copy(buf[replyPrefixLen:], rep.Reason)
	if err := writeAll(w, buf[:replyPrefixLen+n]); err != nil {
		return fmt.Errorf("tunnel: write reply: %w", err)
	}
	return nil
}

// ReadReply reads exactly one reply frame from r and validates it.
func ReadReply(r io.Reader) (Reply, error) {
	var buf [replyPrefixLen + MaxReasonLen]byte
	if err := readFull(r, buf[:replyPrefixLen]); err != nil {
		return Reply{}, fmt.Errorf("tunnel: read reply: %w", err)
	}
	if buf[0] != replyVersion {
		return Reply{}, fmt.Errorf("tunnel: read reply: %w: unsupported version %d", ErrBadHeader, buf[0])
	}
	var rep Reply
	switch buf[1] {
	case replyStatusOK:
		rep.OK = true
	case replyStatusFail:
	default:
		return Reply{}, fmt.Errorf("tunnel: read reply: %w: unknown status %d", ErrBadHeader, buf[1])
	}
	n := int(binary.BigEndian.Uint16(buf[2:4]))
	if n > MaxReasonLen {
		return Reply{}, fmt.Errorf("tunnel: read reply: %w: reason length %d exceeds %d", ErrBadHeader, n, MaxReasonLen)
	}
	reason := buf[replyPrefixLen : replyPrefixLen+n]
	if err := readFull(r, reason); err != nil {
		return Reply{}, fmt.Errorf("tunnel: read reply reason: %w", err)
	}
	rep.Reason = string(reason)
	if err := validateReason(rep.Reason); err != nil {
		return Reply{}, fmt.Errorf("tunnel: read reply: %w", err)
	}
	return rep, nil
}

// validateReason checks a Reply's reason (wirecheck.Reason).
func validateReason(s string) error { return wirecheck.Reason(s, MaxReasonLen, ErrBadHeader) }

// readFull reads a whole frame part (wirecheck.ReadFull).
func readFull(r io.Reader, b []byte) error { return wirecheck.ReadFull(r, b, ErrBadHeader) }

func writeAll(w io.Writer, b []byte) error { return wirecheck.WriteAll(w, b) }
