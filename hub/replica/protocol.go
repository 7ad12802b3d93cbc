package replica

import (
	"errors"
	"fmt"
	"io"

	"github.com/tether-dev/tether/tunnel"
)

// ErrBadRequest is wrapped by every error about a malformed peer request.
var ErrBadRequest = errors.New("replica: bad peer request")

// A peer request is the first message on every stream of a peer link:
//
//	byte 0       version (1)
//	byte 1       n, the length of the node ID (1..maxNodeIDLen)
//	bytes 2..2+n the node ID the stream is for
//	then         a tunnel stream header (tunnel.WriteHeader): the service
//
// The holder answers with a tunnel.Reply (the agent's answer, or why the
// holder refused), then bytes flow as on a node stream.
const (
	requestVersion = 1
	maxNodeIDLen   = 64
)

// Request is what a replica asks of the replica holding a node's tunnel.
type Request struct {
	NodeID string
	Header tunnel.Header
}

// WriteRequest writes r in one frame (the header follows in a second
// write; the stream buffers both until the reply is read).
func WriteRequest(w io.Writer, r Request) error {
	if err := checkNodeID(r.NodeID); err != nil {
		return err
	}
	b := make([]byte, 0, 2+len(r.NodeID))
	b = append(b, requestVersion, byte(len(r.NodeID)))
	b = append(b, r.NodeID...)
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("replica: write peer request: %w", err)
	}
	return tunnel.WriteHeader(w, r.Header)
}

// ReadRequest reads one request, nothing beyond it.
func ReadRequest(r io.Reader) (Request, error) {
	var pre [2]byte
	if _, err := io.ReadFull(r, pre[:]); err != nil {
		return Request{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	if pre[0] != requestVersion {
		return Request{}, fmt.Errorf("%w: version %d, want %d", ErrBadRequest, pre[0], requestVersion)
	}
	id := make([]byte, pre[1])
	if _, err := io.ReadFull(r, id); err != nil {
		return Request{}, fmt.Errorf("%w: node id: %w", ErrBadRequest, err)
	}
	if err := checkNodeID(string(id)); err != nil {
		return Request{}, err
	}
	h, err := tunnel.ReadHeader(r)
	if err != nil {
		return Request{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
	}
	return Request{NodeID: string(id), Header: h}, nil
}

func checkNodeID(id string) error {
	if len(id) == 0 || len(id) > maxNodeIDLen {
		return fmt.Errorf("%w: node id of %d bytes, want 1..%d", ErrBadRequest, len(id), maxNodeIDLen)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return fmt.Errorf("%w: node id holds byte 0x%02x", ErrBadRequest, c)
		}
	}
	return nil
}
