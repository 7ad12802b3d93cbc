package tunnel

import (
	"crypto/tls"
	"encoding/binary"
	"net"
	"sync"
)

// Write coalescing for the TLS+yamux transport.
//
// yamux's sender writes every data frame as two writes, its 12-byte header
// and then its body (up to yamuxMaxWrite), and crypto/tls turns each write
// into records of at most 16 KiB, each written to the socket on its own: a
// 64 KiB frame cost five write syscalls, about a tenth of the hub's CPU
// while it relays. Two small layers make it one:
//
//   - corkConn sits under TLS. Normally it writes through; while corked it
//     collects the encrypted records and writes them with one syscall when
//     uncorked (or when its buffer fills).
//   - frameConn sits between yamux and TLS. It corks when yamux writes the
//     header of a data frame that has a body, and uncorks after the next
//     write, the body, which yamux's sender writes straight after the
//     header in the same step. Every other frame (window updates, pings,
//     stream open and close, go-away) is written through at once.
//
// So no frame waits for a later one: the cork spans a header and the write
// that follows it in the same sender step, and if a body ever failed to
// follow, the next frame's write (at the latest the keepalive ping) would
// release the header in order. Records stay encrypted and in order; only the
// number of syscalls changes. Writes TLS makes on its own (alerts, key
// updates, close_notify) find the cork open, or are flushed with the frame
// they were queued behind.

// corkMax bounds a cork's buffer: a full frame's records (a 34-byte header
// record and four 16 KiB records) fit, so one frame is one syscall.
const corkMax = yamuxMaxWrite + 8<<10

var corkBufs = sync.Pool{New: func() any { b := make([]byte, 0, corkMax); return &b }}

// corkConn is the connection under TLS; see the comment above.
type corkConn struct {
	net.Conn

	mu     sync.Mutex // serialises writes and guards the following
	corked bool
	buf    *[]byte // pooled while corked, nil otherwise
}

func newCorkConn(c net.Conn) *corkConn { return &corkConn{Conn: c} }

func (c *corkConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		return c.Conn.Write(p)
	}
	b := *c.buf
	if len(b)+len(p) > cap(b) {
		if err := c.flushLocked(); err != nil {
			return 0, err
		}
		b = *c.buf
		if len(p) > cap(b) {
			return c.Conn.Write(p)
		}
	}
	*c.buf = append(b, p...)
	return len(p), nil
}

// cork starts collecting writes.
func (c *corkConn) cork() {
	c.mu.Lock()
	if !c.corked {
		c.corked = true
		c.buf = corkBufs.Get().(*[]byte)
	}
	c.mu.Unlock()
}

// uncork writes what was collected with one write and returns to writing
// through.
func (c *corkConn) uncork() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.corked {
		return nil
	}
	err := c.flushLocked()
	c.corked = false
	*c.buf = (*c.buf)[:0]
	corkBufs.Put(c.buf)
	c.buf = nil
	return err
}

func (c *corkConn) flushLocked() error {
	b := *c.buf
	if len(b) == 0 {
		return nil
	}
	_, err := c.Conn.Write(b)
	*c.buf = b[:0]
	return err
}

// yamux frame header layout (github.com/hashicorp/yamux): version, type,
// flags (2), stream ID (4), length (4), big-endian.
const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
)

// yamuxBodyLen is the body length announced by p when p is exactly the
// header of a yamux data frame, else 0.
func yamuxBodyLen(p []byte) int {
	if len(p) != yamuxHeaderSize || p[0] != 0 || p[1] != yamuxTypeData {
		return 0
	}
	return int(binary.BigEndian.Uint32(p[8:12]))
}

// frameConn is the connection yamux writes to; see the comment above. Only
// yamux's sender goroutine writes, so corked needs no lock.
type frameConn struct {
	net.Conn // the hookConn over TLS: reads, close and addresses go through
	cork     *corkConn
	corked   bool // a data header went into the cork; the next write ends it
}

// coalesceFrames returns the connection for yamux over c, whose writes end
// up in tc: a frameConn when tc runs over a corkConn, else c itself.
func coalesceFrames(c net.Conn, tc *tls.Conn) net.Conn {
	cc, ok := tc.NetConn().(*corkConn)
	if !ok {
		return c
	}
	return &frameConn{Conn: c, cork: cc}
}

func (f *frameConn) Write(p []byte) (int, error) {
	if f.corked {
		f.corked = false
		n, err := f.Conn.Write(p)
		if uerr := f.cork.uncork(); err == nil {
			err = uerr
		}
		return n, err
	}
	if yamuxBodyLen(p) == 0 {
		return f.Conn.Write(p)
	}
	f.cork.cork()
	n, err := f.Conn.Write(p)
	if err != nil {
		_ = f.cork.uncork()
		return n, err
	}
	f.corked = true
	return n, nil
}
