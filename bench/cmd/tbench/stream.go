package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// sink is a TCP server that counts what each connection sends until EOF,
// then answers with the byte count and how long the bytes took to arrive
// (first byte to EOF), so the sender gets the receiver's view.
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

// pushFor writes to c for d, half-closes, and returns the receiver's MB/s
// and the bytes it received.
func pushFor(c net.Conn, d time.Duration) (float64, int64, error) {
	defer c.Close()
	buf := make([]byte, 128<<10)
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		if _, err := c.Write(buf); err != nil {
			return 0, 0, fmt.Errorf("push: %w", err)
		}
	}
	cw, ok := c.(interface{ CloseWrite() error })
	if !ok {
		return 0, 0, errors.New("push: connection cannot half-close")
	}
	if err := cw.CloseWrite(); err != nil {
		return 0, 0, fmt.Errorf("push: close write: %w", err)
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
