package tunnel

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// pipeWait bounds how long a test waits for Pipe to return: a hang is the
// failure these tests look for, never a duration.
const pipeWait = 20 * time.Second

// tcpPair is a connected loopback TCP pair.
func tcpPair(t testing.TB) (client, server *net.TCPConn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		c, _ := ln.Accept()
		accepted <- c
	}()
	c, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	s := <-accepted
	if s == nil {
		t.Fatal("accept failed")
	}
	t.Cleanup(func() { c.Close(); s.Close() })
	return c.(*net.TCPConn), s.(*net.TCPConn)
}

// relayEnds is a Pipe under test: the caller talks to outerA and outerB;
// Pipe runs between innerA and innerB.
type relayEnds struct {
	outerA, outerB     net.Conn
	innerA, innerB     io.ReadWriteCloser
	onBytesA, onBytesB *atomic.Int64
}

// pipeSetups are the shapes Pipe relays in the product: TCP to TCP (the
// agent's tcp service, socket to socket), TCP to a tunnel stream of either
// transport (the bastion's and the agent's side of a jump).
func pipeSetups(t *testing.T) map[string]func(t *testing.T) (
	outerA, innerA net.Conn, innerB io.ReadWriteCloser, outerB net.Conn,
) {
	return map[string]func(t *testing.T) (net.Conn, net.Conn, io.ReadWriteCloser, net.Conn){
		"tcp-tcp": func(t *testing.T) (net.Conn, net.Conn, io.ReadWriteCloser, net.Conn) {
			c1, s1 := tcpPair(t)
			c2, s2 := tcpPair(t)
			return c1, s1, s2, c2
		},
		"tcp-yamux": func(t *testing.T) (net.Conn, net.Conn, io.ReadWriteCloser, net.Conn) {
			c1, s1 := tcpPair(t)
			agent, hub := pair(t, TransportTCP, nil)
			st, peer := openPair(t, hub, agent)
			return c1, s1, st, peer
		},
		"tcp-quic": func(t *testing.T) (net.Conn, net.Conn, io.ReadWriteCloser, net.Conn) {
			c1, s1 := tcpPair(t)
			agent, hub := pair(t, TransportQUIC, nil)
			st, peer := openPair(t, hub, agent)
			return c1, s1, st, peer
		},
	}
}

// runPipe starts Pipe(innerA, innerB) and returns a channel with its counts.
func runPipe(innerA, innerB io.ReadWriteCloser, sums *[2]atomic.Int64) <-chan PipeCounts {
	done := make(chan PipeCounts, 1)
	go func() {
		done <- Pipe(innerA, innerB, func(aToB bool, n int) {
			if aToB {
				sums[0].Add(int64(n))
			} else {
				sums[1].Add(int64(n))
			}
		})
	}()
	return done
}

func waitPipe(t *testing.T, done <-chan PipeCounts) PipeCounts {
	t.Helper()
	select {
	case c := <-done:
		return c
	case <-time.After(pipeWait):
		t.Fatal("Pipe did not return after both directions ended")
		return PipeCounts{}
	}
}

func randomBytes(t testing.TB, n int) []byte {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// TestPipeCopiesBothWays sends more than several copy buffers each way at
// once, half-closes, and checks every byte, the counts and the callbacks.
func TestPipeCopiesBothWays(t *testing.T) {
	for name, setup := range pipeSetups(t) {
		t.Run(name, func(t *testing.T) {
			outerA, innerA, innerB, outerB := setup(t)
			var sums [2]atomic.Int64
			done := runPipe(innerA, innerB, &sums)
			up, down := randomBytes(t, 3*pipeBufSize+12345), randomBytes(t, pipeBufSize+7)
			var wg sync.WaitGroup
			var gotUp, gotDown []byte
			var errUp, errDown error
			send := func(c net.Conn, b []byte) {
				defer wg.Done()
				if _, err := c.Write(b); err != nil {
					t.Errorf("write: %v", err)
				}
				if err := c.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
					t.Errorf("close write: %v", err)
				}
			}
			wg.Add(4)
			go send(outerA, up)
			go send(outerB, down)
			go func() { defer wg.Done(); gotUp, errUp = io.ReadAll(outerB) }()
			go func() { defer wg.Done(); gotDown, errDown = io.ReadAll(outerA) }()
			wg.Wait()
			if errUp != nil || errDown != nil {
				t.Fatalf("read: %v, %v", errUp, errDown)
			}
			if !bytes.Equal(gotUp, up) || !bytes.Equal(gotDown, down) {
				t.Fatalf("relayed bytes differ: got %d and %d bytes, want %d and %d", len(gotUp), len(gotDown), len(up), len(down))
			}
			c := waitPipe(t, done)
			if c.AtoB != int64(len(up)) || c.BtoA != int64(len(down)) {
				t.Errorf("counts = %+v, want AtoB %d BtoA %d", c, len(up), len(down))
			}
			if sums[0].Load() != c.AtoB || sums[1].Load() != c.BtoA {
				t.Errorf("onBytes summed %d and %d, counts say %+v", sums[0].Load(), sums[1].Load(), c)
			}
		})
	}
}

// TestPipeHalfClose: one side ending its writes must not end the other
// direction, which keeps flowing until that side ends too.
func TestPipeHalfClose(t *testing.T) {
	for name, setup := range pipeSetups(t) {
		t.Run(name, func(t *testing.T) {
			outerA, innerA, innerB, outerB := setup(t)
			var sums [2]atomic.Int64
			done := runPipe(innerA, innerB, &sums)
			if _, err := outerA.Write([]byte("request")); err != nil {
				t.Fatal(err)
			}
			if err := outerA.(interface{ CloseWrite() error }).CloseWrite(); err != nil {
				t.Fatal(err)
			}
			got, err := io.ReadAll(outerB)
			if err != nil || string(got) != "request" {
				t.Fatalf("B read %q, %v; want the request then EOF", got, err)
			}
			// After A's half-close, B's answer still reaches A.
			reply := randomBytes(t, 2*pipeBufSize)
			go func() {
				_, _ = outerB.Write(reply)
				_ = outerB.(interface{ CloseWrite() error }).CloseWrite()
			}()
			back, err := io.ReadAll(outerA)
			if err != nil || !bytes.Equal(back, reply) {
				t.Fatalf("A read %d bytes, %v; want the %d-byte reply after its own half-close", len(back), err, len(reply))
			}
			c := waitPipe(t, done)
			if c.AtoB != 7 || c.BtoA != int64(len(reply)) {
				t.Errorf("counts = %+v", c)
			}
		})
	}
}

// brokenWriter fails every Write (a peer that is gone) but can half-close,
// and its Read blocks until Close, as a live stream's would.
type brokenWriter struct {
	closed    chan struct{}
	closeOnce sync.Once
}

func (w *brokenWriter) Write([]byte) (int, error) { return 0, errors.New("peer gone") }
func (w *brokenWriter) CloseWrite() error         { return nil }
func (w *brokenWriter) Read([]byte) (int, error) {
	<-w.closed
	return 0, net.ErrClosed
}
func (w *brokenWriter) Close() error {
	w.closeOnce.Do(func() { close(w.closed) })
	return nil
}

// TestPipeWriteErrorClosesBoth: a write that fails must end the whole
// relay. Before, a failed write was taken for a clean end: the destination
// was half-closed and the other direction waited for ever.
func TestPipeWriteErrorClosesBoth(t *testing.T) {
	outerA, innerA := tcpPair(t)
	w := &brokenWriter{closed: make(chan struct{})}
	var sums [2]atomic.Int64
	done := runPipe(innerA, w, &sums)
	if _, err := outerA.Write([]byte("to a peer that is gone")); err != nil {
		t.Fatal(err)
	}
	c := waitPipe(t, done)
	if c.AtoB != 0 {
		t.Errorf("AtoB = %d, want 0: nothing was written", c.AtoB)
	}
	// The relay closed A too: its peer sees the end.
	_ = outerA.SetReadDeadline(time.Now().Add(pipeWait))
	if _, err := io.ReadAll(outerA); err != nil && !errors.Is(err, net.ErrClosed) && !isReset(err) {
		t.Errorf("A after the relay ended: %v", err)
	}
}

// isReset reports a connection reset, which a peer closing with unread
// data causes.
func isReset(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && !op.Timeout()
}
