package tunnel

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/binary"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"testing"
)

// countConn counts the writes that reach the socket.
type countConn struct {
	net.Conn
	writes atomic.Int64
}

func (c *countConn) Write(p []byte) (int, error) {
	c.writes.Add(1)
	return c.Conn.Write(p)
}

func yamuxHeader(typ byte, length uint32) []byte {
	h := make([]byte, yamuxHeaderSize)
	h[1] = typ
	binary.BigEndian.PutUint32(h[4:8], 7)
	binary.BigEndian.PutUint32(h[8:12], length)
	return h
}

func TestYamuxBodyLen(t *testing.T) {
	for _, tc := range []struct {
		name string
		p    []byte
		want int
	}{
		{"data header with body", yamuxHeader(yamuxTypeData, 65536), 65536},
		{"data header without body (SYN, FIN)", yamuxHeader(yamuxTypeData, 0), 0},
		{"window update", yamuxHeader(1, 262144), 0},
		{"ping", yamuxHeader(2, 1), 0},
		{"go away", yamuxHeader(3, 0), 0},
		{"a body that starts like a header", append(yamuxHeader(yamuxTypeData, 5), 1, 2, 3, 4, 5), 0},
		{"short", []byte{0, 0, 0}, 0},
		{"other version", append([]byte{1}, yamuxHeader(yamuxTypeData, 5)[1:]...), 0},
	} {
		if got := yamuxBodyLen(tc.p); got != tc.want {
			t.Errorf("%s: yamuxBodyLen = %d, want %d", tc.name, got, tc.want)
		}
	}
}

func FuzzYamuxBodyLen(f *testing.F) {
	f.Add(yamuxHeader(yamuxTypeData, 65536))
	f.Add(yamuxHeader(1, 1))
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, p []byte) {
		n := yamuxBodyLen(p)
		if n < 0 {
			t.Fatalf("negative body length %d", n)
		}
		if n > 0 && (len(p) != yamuxHeaderSize || p[0] != 0 || p[1] != yamuxTypeData || uint32(n) != binary.BigEndian.Uint32(p[8:])) {
			t.Fatalf("body length %d for %x, which is not a data header announcing it", n, p)
		}
	})
}

// TestCorkConn: writes go through at once unless corked; a cork's writes
// reach the socket as one write, in order, when it is released or full.
func TestCorkConn(t *testing.T) {
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	cc := &countConn{Conn: a}
	c := newCorkConn(cc)
	got := make(chan []byte, 16)
	go func() {
		buf := make([]byte, 2*corkMax)
		for {
			n, err := b.Read(buf)
			if err != nil {
				close(got)
				return
			}
			got <- bytes.Clone(buf[:n])
		}
	}()
	write := func(p []byte) {
		t.Helper()
		if n, err := c.Write(p); err != nil || n != len(p) {
			t.Fatalf("Write(%d bytes) = %d, %v", len(p), n, err)
		}
	}

	write([]byte("through"))
	if g := <-got; string(g) != "through" {
		t.Fatalf("uncorked write arrived as %q", g)
	}

	c.cork()
	write([]byte("a"))
	write([]byte("bc"))
	if n := cc.writes.Load(); n != 1 {
		t.Fatalf("corked writes reached the socket: %d writes", n)
	}
	if err := c.uncork(); err != nil {
		t.Fatal(err)
	}
	if g := <-got; string(g) != "abc" {
		t.Fatalf("corked writes arrived as %q, want one %q", g, "abc")
	}
	if err := c.uncork(); err != nil { // a second uncork is harmless
		t.Fatal(err)
	}

	// More than a cork holds: flushed when full, nothing lost or reordered.
	c.cork()
	want := make([]byte, 0, 3*corkMax)
	for i := range 3 {
		p := bytes.Repeat([]byte{byte('x' + i)}, corkMax-100)
		want = append(want, p...)
		write(p)
	}
	big := bytes.Repeat([]byte{'!'}, 2*corkMax)
	want = append(want, big...)
	write(big)
	if err := c.uncork(); err != nil {
		t.Fatal(err)
	}
	var all []byte
	for len(all) < len(want) {
		all = append(all, <-got...)
	}
	if !bytes.Equal(all, want) {
		t.Fatalf("a cork over its size delivered %d bytes, not the %d written in order", len(all), len(want))
	}
}

// TestFrameCoalescing runs yamux over TLS over a corkConn, as the dialer
// does, and checks that streams carry their data intact and that a 64 KiB
// frame reaches the socket as one write, not five (one per TLS record
// plus the header's).
func TestFrameCoalescing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, err := ln.Accept()
		if err != nil {
			close(accepted)
			return
		}
		accepted <- c
	}()
	raw, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	srvRaw, ok := <-accepted
	if !ok {
		t.Fatal("accept failed")
	}
	counted := &countConn{Conn: raw}
	ctc := tls.Client(newCorkConn(counted), clientTLS(true))
	stc := tls.Server(newCorkConn(srvRaw), tunnelServerTLS())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = stc.HandshakeContext(t.Context()) }()
	if err := ctc.HandshakeContext(t.Context()); err != nil {
		t.Fatalf("handshake: %v", err)
	}
	wg.Wait()
	log := slog.New(slog.DiscardHandler)
	cfg := DefaultConfig()
	agent, err := newYamuxSession(ctc, cfg, false, log)
	if err != nil {
		t.Fatal(err)
	}
	defer agent.Close()
	hub, err := newYamuxSession(stc, cfg, true, log)
	if err != nil {
		t.Fatal(err)
	}
	defer hub.Close()

	const streams, perStream = 4, 2 << 20
	payload := make([]byte, perStream)
	_, _ = rand.Read(payload)
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	before := counted.writes.Load()
	errs := make(chan error, 2*streams)
	for range streams {
		go func() {
			s, err := agent.OpenStream(ctx)
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			_, err = s.Write(payload)
			errs <- err
		}()
		go func() {
			s, err := hub.AcceptStream(ctx)
			if err != nil {
				errs <- err
				return
			}
			defer s.Close()
			got := make([]byte, perStream)
			if _, err := io.ReadFull(s, got); err != nil {
				errs <- err
				return
			}
			if !bytes.Equal(got, payload) {
				errs <- io.ErrUnexpectedEOF
				return
			}
			errs <- nil
		}()
	}
	for range 2 * streams {
		if err := <-errs; err != nil {
			t.Fatalf("stream: %v", err)
		}
	}
	writes := counted.writes.Load() - before
	frames := int64(streams * perStream / yamuxMaxWrite)
	// Each frame is one write; stream opens and closes and pings are a few
	// more. Without coalescing it is five per frame.
	if writes > frames+frames/4+16 {
		t.Errorf("%d socket writes for %d full frames: data frames are not coalesced", writes, frames)
	}
	t.Logf("%d socket writes for %d frames", writes, frames)
}
