package main

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// sink is a TCP server that counts what each connection sends until the
// end marker (a 0xff byte; the payload is zeros) or EOF, then answers with
// the byte count and how long the bytes took to arrive (first byte to the
// end), so the sender gets the receiver's view. The marker makes the count
// work through relays that do not pass a half-close on (frp closes both
// directions when one ends): the sender does not half-close.
type sink struct {
	ln net.Listener
	wg sync.WaitGroup
}

func newSink() (*sink, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	s := &sink{ln: ln}
	s.wg.Go(s.serve)
	return s, nil
}

func (s *sink) port() int { return s.ln.Addr().(*net.TCPAddr).Port }

func (s *sink) serve() {
	for {
		c, err := s.ln.Accept()
		if err != nil {
			return
		}
		s.wg.Go(func() {
			defer c.Close()
			buf := make([]byte, 256<<10)
			var n int64
			var first time.Time
			for {
				k, err := c.Read(buf)
				if k > 0 && first.IsZero() {
					first = time.Now()
				}
				if i := bytes.IndexByte(buf[:k], endMarker); i >= 0 {
					n += int64(i)
					break
				}
				n += int64(k)
				if err != nil {
					break
				}
			}
			var out [16]byte
			binary.BigEndian.PutUint64(out[:8], uint64(n))
			binary.BigEndian.PutUint64(out[8:], uint64(time.Since(first)))
			_, _ = c.Write(out[:])
		})
	}
}

func (s *sink) Close() {
	s.ln.Close()
	s.wg.Wait()
}

// endMarker ends a push: the payload is all zeros.
const endMarker = 0xff

// pushFor writes zeros to c for d, then the end marker, and returns the receiver's MB/s and the bytes it
// received.
func pushFor(c net.Conn, d time.Duration) (float64, int64, error) {
	defer c.Close()
	buf := make([]byte, 128<<10)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if _, err := c.Write(buf); err != nil {
			return 0, 0, fmt.Errorf("push: %w", err)
		}
	}
	if _, err := c.Write([]byte{endMarker}); err != nil {
		return 0, 0, fmt.Errorf("push: end marker: %w", err)
	}
	_ = c.SetReadDeadline(time.Now().Add(time.Minute))
	var out [16]byte
	if _, err := io.ReadFull(c, out[:]); err != nil {
		return 0, 0, fmt.Errorf("push: read the receiver's count: %w", err)
	}
	n := int64(binary.BigEndian.Uint64(out[:8]))
	took := time.Duration(binary.BigEndian.Uint64(out[8:]))
	if took <= 0 {
		return 0, 0, errors.New("push: nothing arrived")
	}
	return mbps(n, took), n, nil
}
