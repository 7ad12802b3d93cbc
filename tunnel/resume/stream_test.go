package resume

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tether-dev/tether/tunnel"
)

// tcpStreams is a resumable stream over a loopback TCP connection pair (a
// real tunnel.Stream, without a session), for tests that do not re-attach.
func tcpStreams(t *testing.T, cfg Config) (a, b *Stream) {
	t.Helper()
	ca, cb := tcpPair(t)
	id := NewID()
	a, b = New(id, ca, cfg), New(id, cb, cfg)
	t.Cleanup(func() { a.Abort("test over"); b.Abort("test over") })
	return a, b
}

// readTestFrame reads one frame as a raw peer would.
func readTestFrame(r io.Reader) (frame, error) {
	return readFrame(r, func(n int) []byte { return make([]byte, n) })
}

func exchange(t *testing.T, w, r io.ReadWriter, msg string) {
	t.Helper()
	if _, err := w.Write([]byte(msg)); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(r, buf); err != nil || string(buf) != msg {
		t.Fatalf("read %q, %v; want %q", buf, err, msg)
	}
}

func wantEnded(t *testing.T, what string, err, class error, reason string) {
	t.Helper()
	var e *EndedError
	if !errors.As(err, &e) || !errors.Is(err, class) || !strings.Contains(e.Reason+" "+e.Error(), reason) {
		t.Fatalf("%s: %v, want an *EndedError wrapping %v mentioning %q", what, err, class, reason)
	}
}

// TestStreamHalfCloseAndClose: the tunnel.Stream contract (as
// tunnel.TestHalfClose checks it for the transports), and a normal end
// that releases everything.
func TestStreamHalfCloseAndClose(t *testing.T) {
	a, b := tcpStreams(t, Config{})
	var _ tunnel.Stream = a
	exchange(t, a, b, "ping")
	exchange(t, b, a, "pong")
	if _, err := a.Write([]byte("request")); err != nil {
		t.Fatal(err)
	}
	if err := a.CloseWrite(); err != nil {
		t.Fatalf("CloseWrite: %v", err)
	}
	if err := a.CloseWrite(); err != nil {
		t.Fatalf("second CloseWrite: %v", err)
	}
	if _, err := a.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after CloseWrite: %v, want net.ErrClosed", err)
	}
	got, err := io.ReadAll(b)
	if err != nil || string(got) != "request" {
		t.Fatalf("peer read %q, %v; want request then EOF", got, err)
	}
	if _, err := b.Write([]byte("response")); err != nil {
		t.Fatalf("peer write after our CloseWrite: %v", err)
	}
	if err := b.Close(); err != nil {
		t.Fatal(err)
	}
	got, err = io.ReadAll(a)
	if err != nil || string(got) != "response" {
		t.Fatalf("read %q, %v; want response then EOF", got, err)
	}
	waitClosed(t, a.Done(), 5*time.Second, "a ends once both Fins are acknowledged")
	waitClosed(t, b.Done(), 5*time.Second, "b ends once both Fins are acknowledged")
	if err := a.Close(); err != nil {
		t.Fatalf("Close: %v", err)
	}
	if err := a.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, err := a.Read(make([]byte, 1)); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Read after Close: %v, want net.ErrClosed", err)
	}
	if _, err := a.Write([]byte("x")); !errors.Is(err, net.ErrClosed) {
		t.Errorf("Write after Close: %v, want net.ErrClosed", err)
	}
	if err := a.CloseWrite(); !errors.Is(err, net.ErrClosed) {
		t.Errorf("CloseWrite after Close: %v, want net.ErrClosed", err)
	}
	for name, s := range map[string]*Stream{"a": a, "b": b} {
		if err := s.Err(); err != nil {
			t.Errorf("%s ended with %v, want a normal end", name, err)
		}
		checkReleased(t, name, s)
	}
}

// checkReleased checks that an ended stream holds no timer, buffer or
// underlying stream.
func checkReleased(t *testing.T, name string, s *Stream) {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	timers := s.windowTimer != nil || s.lingerTimer != nil || s.ackArmed
	if !s.ended || timers || s.att != nil || s.buffered != 0 || len(s.chunks) != 0 {
		t.Errorf("%s: ended %v, timers %v, attachment %v, %d bytes buffered in %d chunks",
			name, s.ended, timers, s.att != nil, s.buffered, len(s.chunks))
	}
}

// TestCloseUnblocks: Close unblocks a Read or Write blocked in another
// goroutine, with net.ErrClosed, as net.Conn.
func TestCloseUnblocks(t *testing.T) {
	a, _ := tcpStreams(t, Config{Buffer: 1 << 10})
	readErr := make(chan error, 1)
	go func() {
		_, err := a.Read(make([]byte, 10))
		readErr <- err
	}()
	writeErr := make(chan error, 1)
	go func() {
		_, err := a.Write(make([]byte, 1<<20)) // the peer does not read: blocks
		writeErr <- err
	}()
	time.Sleep(50 * time.Millisecond)
	_ = a.Close()
	for name, ch := range map[string]chan error{"Read": readErr, "Write": writeErr} {
		select {
		case err := <-ch:
			if !errors.Is(err, net.ErrClosed) {
				t.Errorf("blocked %s after Close: %v, want net.ErrClosed", name, err)
			}
		case <-time.After(5 * time.Second):
			t.Fatalf("Close did not unblock %s", name)
		}
	}
}

func TestDeadlines(t *testing.T) {
	a, b := tcpStreams(t, Config{Buffer: 4 << 10})
	if err := a.SetReadDeadline(time.Now().Add(30 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	_, err := a.Read(make([]byte, 1))
	var ne net.Error
	if !errors.Is(err, os.ErrDeadlineExceeded) || !errors.As(err, &ne) || !ne.Timeout() {
		t.Fatalf("Read past deadline: %v, want os.ErrDeadlineExceeded", err)
	}
	if err := a.SetReadDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	exchange(t, b, a, "after deadline")

	// b does not read: a's replay buffer (4 KiB, as b's queue) fills.
	if err := a.SetWriteDeadline(time.Now().Add(200 * time.Millisecond)); err != nil {
		t.Fatal(err)
	}
	n, err := a.Write(make([]byte, 1<<20))
	if !errors.Is(err, os.ErrDeadlineExceeded) || n == 0 || n >= 1<<20 {
		t.Fatalf("Write past deadline: %d, %v; want part written then os.ErrDeadlineExceeded", n, err)
	}
	// A deadline in the past fails at once; clearing it writes again.
	if err := a.SetDeadline(time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	if _, err := a.Write([]byte("x")); !errors.Is(err, os.ErrDeadlineExceeded) {
		t.Fatalf("Write with a past deadline: %v", err)
	}
	if err := a.SetDeadline(time.Time{}); err != nil {
		t.Fatal(err)
	}
	go func() { _, _ = io.CopyN(io.Discard, b, int64(n)+3) }()
	if _, err := a.Write([]byte("end")); err != nil {
		t.Fatalf("Write after clearing the deadline: %v", err)
	}
}

// TestProtocolErrors feeds a stream a broken peer's frames: each ends the
// stream with ErrProtocol (never a panic), and the peer is told why with a
// Close frame.
func TestProtocolErrors(t *testing.T) {
	tests := []struct {
		name   string
		before string // what the stream writes first (the peer reads it)
		wire   []byte
		want   string
	}{
		{"unknown frame type", "", []byte{9}, "unknown frame type 9"},
		{"empty data frame", "", []byte{1, 0, 0, 0, 0}, "0 bytes"},
		{"oversize data frame", "", []byte{1, 0, 1, 0, 1}, "65537 bytes"},
		{"ack beyond sent", "12345", appendFrame(nil, frame{typ: frameAck, ack: 6}), "ack 6 outside 0..5"},
		{"ack going back", "12345", append(appendFrame(nil, frame{typ: frameAck, ack: 4}),
			appendFrame(nil, frame{typ: frameAck, ack: 3})...), "ack 3 outside 4..5"},
		{"data after fin", "", []byte{3, 1, 0, 0, 0, 1, 'x'}, "data after fin"},
		{"second fin", "", []byte{3, 3}, "second fin"},
		{"close reason with escape", "", []byte{4, 0, 2, 0x1b, 'c'}, "control character"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ca, cb := tcpPair(t)
			s := New(NewID(), ca, Config{})
			defer s.Abort("test over")
			set := NewSet()
			if err := set.Add(s); err != nil {
				t.Fatal(err)
			}
			peer := bufio.NewReader(cb)
			if tt.before != "" {
				if _, err := s.Write([]byte(tt.before)); err != nil {
					t.Fatal(err)
				}
				f, err := readTestFrame(peer)
				if err != nil || string(f.data) != tt.before {
					t.Fatalf("peer read %+v, %v", f, err)
				}
			}
			if _, err := cb.Write(tt.wire); err != nil {
				t.Fatal(err)
			}
			waitClosed(t, s.Done(), 5*time.Second, "the stream ends")
			err := s.Err()
			var e *EndedError
			if !errors.As(err, &e) || !errors.Is(err, ErrProtocol) || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("Err() = %v, want an *EndedError wrapping ErrProtocol mentioning %q", err, tt.want)
			}
			// Read gives the peer's EOF if its Fin came before the error.
			if _, err := s.Read(make([]byte, 10)); !errors.Is(err, ErrProtocol) && err != io.EOF {
				t.Fatalf("Read after a protocol error: %v", err)
			}
			if _, err := s.Write([]byte("x")); !errors.Is(err, ErrProtocol) {
				t.Fatalf("Write after a protocol error: %v", err)
			}
			// The broken peer gets a Close frame saying why, then EOF.
			var closeReason string
			for {
				f, err := readTestFrame(peer)
				if err != nil {
					break
				}
				if f.typ == frameClose {
					closeReason = f.reason
				}
			}
			if !strings.Contains(closeReason, tt.want) {
				t.Errorf("Close frame reason %q, want it to mention %q", closeReason, tt.want)
			}
			waitFor(t, 5*time.Second, "the stream leaves its set", func() bool { return set.Len() == 0 })
			checkReleased(t, "stream", s)
		})
	}
}

// TestProtocolErrorEndsOneStream: a protocol error on one stream of a
// session leaves the session's other streams alone.
func TestProtocolErrorEndsOneStream(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			agentSess, hubSess := dial(t, startListener(t), tr)
			p1 := newPair(t, agentSess, hubSess, Config{}, Config{})
			p2 := newPair(t, agentSess, hubSess, Config{}, Config{})
			exchange(t, p1.hub, p1.agent, "one")
			exchange(t, p2.hub, p2.agent, "two")
			// Garbage on p1's wire, written past the agent's Stream.
			if _, err := under(p1.agent).Write([]byte{0x42}); err != nil {
				t.Fatal(err)
			}
			_, err := p1.hub.Read(make([]byte, 1))
			if !errors.Is(err, ErrProtocol) {
				t.Fatalf("hub Read after garbage: %v, want ErrProtocol", err)
			}
			_, err = p1.agent.Read(make([]byte, 1))
			wantEnded(t, "agent Read after the hub's Close frame", err, ErrAborted, "unknown frame type 66")
			exchange(t, p2.hub, p2.agent, "still fine")
			exchange(t, p2.agent, p2.hub, "both ways")
			select {
			case <-hubSess.Done():
				t.Fatal("the session ended")
			default:
			}
		})
	}
}

// TestAbort: Abort ends both ends at once with the reason, and both leave
// their sets.
func TestAbort(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			agentSess, hubSess := dial(t, startListener(t), tr)
			p := newPair(t, agentSess, hubSess, Config{}, Config{})
			exchange(t, p.agent, p.hub, "hello")
			// What the agent received before the abort stays readable.
			if _, err := p.hub.Write([]byte("last words")); err != nil {
				t.Fatal(err)
			}
			waitFor(t, 5*time.Second, "the agent received the data", func() bool {
				p.agent.mu.Lock()
				defer p.agent.mu.Unlock()
				return p.agent.queued == len("last words")
			})
			p.hub.Abort("access to node-1 withdrawn\x1b[2J")
			_, err := p.hub.Read(make([]byte, 1))
			wantEnded(t, "hub Read after Abort", err, ErrAborted, "access to node-1 withdrawn?[2J")
			_, err = p.hub.Write([]byte("x"))
			wantEnded(t, "hub Write after Abort", err, ErrAborted, "withdrawn")
			waitClosed(t, p.agent.Done(), 5*time.Second, "the agent's stream ends")
			got := make([]byte, 100)
			n, err := p.agent.Read(got)
			if err != nil || string(got[:n]) != "last words" {
				t.Fatalf("agent Read = %q, %v; want the data that arrived before the abort", got[:n], err)
			}
			_, err = p.agent.Read(got)
			wantEnded(t, "agent Read after the peer's abort", err, ErrAborted, "access to node-1 withdrawn")
			_, err = p.agent.Write([]byte("x"))
			wantEnded(t, "agent Write after the peer's abort", err, ErrAborted, "withdrawn")
			waitFor(t, 5*time.Second, "both leave their sets", func() bool {
				return p.hubSet.Len() == 0 && p.agentSet.Len() == 0
			})
		})
	}
}

// TestCloseBeforePeerHalfCloses: Close while the peer still sends is a TCP
// close with unread data: the peer still reads everything and EOF, then its
// writes fail with the reason.
func TestCloseBeforePeerHalfCloses(t *testing.T) {
	a, b := tcpStreams(t, Config{})
	if _, err := a.Write([]byte("bye")); err != nil {
		t.Fatal(err)
	}
	if err := a.Close(); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(b)
	if err != nil || string(got) != "bye" {
		t.Fatalf("peer read %q, %v; want bye then EOF", got, err)
	}
	waitClosed(t, a.Done(), 5*time.Second, "the closed side ends once its Fin is acknowledged")
	waitClosed(t, b.Done(), 5*time.Second, "the peer ends on the Close frame")
	_, err = b.Write([]byte("x"))
	wantEnded(t, "peer Write", err, ErrAborted, "the peer closed the stream")
	if err := a.Err(); err != nil {
		t.Errorf("the closing side ended with %v, want a normal end", err)
	}
}

// TestDetachResume cuts a transfer in the middle, in each way a link can
// die, and resumes it over a new tunnel stream: both directions arrive
// whole, with bytes written while detached, and the half-closes.
func TestDetachResume(t *testing.T) {
	cuts := []struct {
		name string
		cut  func(k *link)
	}{
		{"hub stream closed", func(k *link) { cut(k.p.hub) }},
		{"agent stream closed", func(k *link) { cut(k.p.agent) }},
		{"session closed", func(k *link) { k.redial() }},
	}
	for _, tr := range transports {
		for _, c := range cuts {
			t.Run(tr.String()+"/"+c.name, func(t *testing.T) {
				opts := goleak.IgnoreCurrent()
				t.Cleanup(func() { goleak.VerifyNone(t, opts) })
				var mu sync.Mutex
				var detaches, attaches []string
				cfg := func(side string) Config {
					return Config{
						OnDetach: func(s *Stream, err error) {
							mu.Lock()
							detaches = append(detaches, side)
							mu.Unlock()
						},
						OnAttach: func(*Stream) { mu.Lock(); attaches = append(attaches, side); mu.Unlock() },
					}
				}
				k := newLink(t, tr, cfg("hub"), cfg("agent"))
				a2h := bytes.Repeat([]byte("agent to hub. "), 40000)
				h2a := bytes.Repeat([]byte("hub to agent! "), 40000)
				half := len(a2h) / 2

				write := func(s *Stream, b []byte) {
					if _, err := s.Write(b); err != nil {
						t.Errorf("write: %v", err)
					}
				}
				write(k.p.agent, a2h[:half])
				write(k.p.hub, h2a[:half])
				c.cut(k)
				waitClosed(t, k.p.hub.Detached(), 10*time.Second, "hub stream detaches")
				waitClosed(t, k.p.agent.Detached(), 10*time.Second, "agent stream detaches")
				if got := k.p.hubSet.Detached(); len(got) != 1 || got[0] != k.p.hub {
					t.Fatalf("hub set lists %v as detached", got)
				}
				// Writes go on while detached, into the replay buffer.
				write(k.p.agent, a2h[half:])
				write(k.p.hub, h2a[half:])
				if err := k.p.agent.CloseWrite(); err != nil {
					t.Fatal(err)
				}
				if err := k.p.hub.CloseWrite(); err != nil {
					t.Fatal(err)
				}
				agentSess, _ := k.sessionPair()
				if err := resumeOver(t, agentSess, k.p.agent); err != nil {
					t.Fatalf("Resume: %v", err)
				}
				var fromAgent, fromHub []byte
				var wg sync.WaitGroup
				var errA, errH error
				wg.Go(func() { fromAgent, errA = io.ReadAll(k.p.hub) })
				wg.Go(func() { fromHub, errH = io.ReadAll(k.p.agent) })
				wg.Wait()
				if errA != nil || errH != nil {
					t.Fatalf("read: %v, %v", errA, errH)
				}
				checkSame(t, "agent to hub", a2h, fromAgent)
				checkSame(t, "hub to agent", h2a, fromHub)
				_ = k.p.agent.Close()
				_ = k.p.hub.Close()
				finish(t, k)
				mu.Lock()
				defer mu.Unlock()
				if len(detaches) != 2 || len(attaches) != 2 {
					t.Errorf("hooks: detached %v, attached %v; want each side once", detaches, attaches)
				}
			})
		}
	}
}

// TestResumeWhileAttached: a Resume (or an Accept) on a stream that still
// has a live underlying stream replaces it: the peer reconnecting proves
// the old one dead, whatever the stream thinks.
func TestResumeWhileAttached(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			var mu sync.Mutex
			var detachErrs []error // the agent's
			agentCfg := Config{OnDetach: func(s *Stream, err error) {
				mu.Lock()
				detachErrs = append(detachErrs, err)
				mu.Unlock()
			}}
			k := newLink(t, tr, Config{}, agentCfg)
			exchange(t, k.p.agent, k.p.hub, "before")
			old := under(k.p.agent)
			agentSess, _ := k.sessionPair()
			if err := resumeOver(t, agentSess, k.p.agent); err != nil {
				t.Fatal(err)
			}
			if under(k.p.agent) == old {
				t.Fatal("the agent's underlying stream was not replaced")
			}
			exchange(t, k.p.agent, k.p.hub, "after")
			exchange(t, k.p.hub, k.p.agent, "and back")
			mu.Lock()
			defer mu.Unlock()
			if len(detachErrs) != 1 || !errors.Is(detachErrs[0], errReplaced) {
				t.Errorf("the agent's OnDetach errors %v, want the replacement", detachErrs)
			}
		})
	}
}

// TestCloseLingersWhileDetached: output written and closed during an
// outage (a node's sshd exiting) still reaches the peer after the resume;
// the closed stream stays in its set until then.
func TestCloseLingersWhileDetached(t *testing.T) {
	k := newLink(t, tunnel.TransportTCP, Config{}, Config{})
	k.redial()
	waitClosed(t, k.p.agent.Detached(), 10*time.Second, "agent stream detaches")
	if _, err := k.p.agent.Write([]byte("logout\r\n")); err != nil {
		t.Fatal(err)
	}
	if err := k.p.agent.Close(); err != nil {
		t.Fatal(err)
	}
	if k.p.agentSet.Len() != 1 || len(k.p.agentSet.Detached()) != 1 {
		t.Fatalf("the closed, detached stream left its set: %d in it", k.p.agentSet.Len())
	}
	agentSess, _ := k.sessionPair()
	if err := resumeOver(t, agentSess, k.p.agent); err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(k.p.hub)
	if err != nil || string(got) != "logout\r\n" {
		t.Fatalf("hub read %q, %v", got, err)
	}
	// The agent closed without reading: as after a TCP close with the
	// peer still open, the hub's writes fail from now on.
	waitClosed(t, k.p.hub.Done(), 5*time.Second, "the hub's stream ends")
	_, err = k.p.hub.Write([]byte("x"))
	wantEnded(t, "hub Write", err, ErrAborted, "the peer closed the stream")
	waitClosed(t, k.p.agent.Done(), 5*time.Second, "the agent's stream ends once its Fin is acknowledged")
	if err := k.p.agent.Err(); err != nil {
		t.Fatalf("agent stream ended with %v", err)
	}
	if n := k.p.hubSet.Len() + k.p.agentSet.Len(); n != 0 {
		t.Fatalf("%d streams left in the sets", n)
	}
}

// TestWindowExpiry: a stream detached longer than its Window ends with
// ErrExpired and the ExpiredReason sentence, on both sides; a late resume
// is refused with the reason the other side ended with.
func TestWindowExpiry(t *testing.T) {
	k := newLink(t, tunnel.TransportQUIC,
		Config{Window: 150 * time.Millisecond, ExpiredReason: func(down time.Duration) string {
			return "node-1's link was down too long"
		}},
		Config{Window: 10 * time.Second})
	if _, err := k.p.hub.Write([]byte("unread")); err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the agent received the data", func() bool {
		k.p.agent.mu.Lock()
		defer k.p.agent.mu.Unlock()
		return k.p.agent.queued > 0
	})
	k.redial()
	waitClosed(t, k.p.hub.Done(), 5*time.Second, "hub stream expires")
	_, err := k.p.hub.Read(make([]byte, 1))
	wantEnded(t, "hub Read", err, ErrExpired, "node-1's link was down too long")
	_, err = k.p.hub.Write([]byte("x"))
	wantEnded(t, "hub Write", err, ErrExpired, "down too long")
	if k.p.hubSet.Len() != 0 {
		t.Fatal("the expired stream is still in its set")
	}
	checkReleased(t, "hub", k.p.hub)

	// The agent's window is longer: it resumes, and hears why not.
	agentSess, _ := k.sessionPair()
	err = resumeOver(t, agentSess, k.p.agent)
	wantEnded(t, "late Resume", err, ErrRefused, "node-1's link was down too long")
	// What arrived before the cut is still read, then the end.
	got := make([]byte, 10)
	n, err := k.p.agent.Read(got)
	if err != nil || string(got[:n]) != "unread" {
		t.Fatalf("agent Read = %q, %v", got[:n], err)
	}
	_, err = k.p.agent.Read(got)
	wantEnded(t, "agent Read", err, ErrRefused, "down too long")
	if k.p.agentSet.Len() != 0 {
		t.Fatal("the refused stream is still in its set")
	}
}

// TestBufferFullBlocksWrite: Write blocks once Buffer bytes are
// unacknowledged (detached: until resumed and acknowledged; attached: until
// the peer's reads make room), and goes on after.
func TestBufferFullBlocksWrite(t *testing.T) {
	const buf = 64 << 10
	cfg := Config{Buffer: buf}
	k := newLink(t, tunnel.TransportTCP, cfg, cfg)
	k.redial()
	waitClosed(t, k.p.agent.Detached(), 10*time.Second, "agent stream detaches")
	data := bytes.Repeat([]byte("0123456789abcdef"), 3*buf/16)
	_ = k.p.agent.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	n, err := k.p.agent.Write(data)
	if !errors.Is(err, os.ErrDeadlineExceeded) || n != buf {
		t.Fatalf("Write while detached: %d, %v; want %d bytes then a timeout", n, err, buf)
	}
	_ = k.p.agent.SetWriteDeadline(time.Time{})
	wrote := make(chan error, 1)
	go func() {
		_, err := k.p.agent.Write(data[n:])
		wrote <- err
	}()
	select {
	case err := <-wrote:
		t.Fatalf("Write returned (%v) with the buffer full", err)
	case <-time.After(100 * time.Millisecond):
	}
	agentSess, _ := k.sessionPair()
	if err := resumeOver(t, agentSess, k.p.agent); err != nil {
		t.Fatal(err)
	}
	// Attached, but the hub's application does not read: its queue (64
	// KiB) fills, it stops acknowledging, and the Write stays blocked.
	select {
	case err := <-wrote:
		t.Fatalf("Write returned (%v) while the peer's queue is full", err)
	case <-time.After(300 * time.Millisecond):
	}
	got := make([]byte, len(data))
	if _, err := io.ReadFull(k.p.hub, got); err != nil || !bytes.Equal(got, data) {
		t.Fatalf("hub read %d bytes, %v", len(got), err)
	}
	if err := <-wrote; err != nil {
		t.Fatalf("the blocked Write: %v", err)
	}
}

// TestBudgetShared: the replay buffers of streams sharing a Budget stay
// under its limit together; room comes back as acks arrive and as streams
// end.
func TestBudgetShared(t *testing.T) {
	const limit = 100 << 10
	budget := NewBudget(limit)
	agentCfg := Config{Budget: budget}
	l := startListener(t)
	agentSess, hubSess := dial(t, l, tunnel.TransportTCP)
	hubSet, agentSet := NewSet(), NewSet()
	p1 := newPairIn(t, agentSess, hubSess, Config{}, agentCfg, hubSet, agentSet)
	p2 := newPairIn(t, agentSess, hubSess, Config{}, agentCfg, hubSet, agentSet)
	_ = agentSess.Close()
	waitClosed(t, p1.agent.Detached(), 10*time.Second, "p1 detaches")
	waitClosed(t, p2.agent.Detached(), 10*time.Second, "p2 detaches")

	if _, err := p1.agent.Write(make([]byte, 80<<10)); err != nil {
		t.Fatal(err)
	}
	_ = p2.agent.SetWriteDeadline(time.Now().Add(200 * time.Millisecond))
	n, err := p2.agent.Write(make([]byte, 40<<10))
	if !errors.Is(err, os.ErrDeadlineExceeded) || n != 20<<10 {
		t.Fatalf("Write over the budget: %d, %v; want %d bytes then a timeout", n, err, 20<<10)
	}
	if got := budget.InUse(); got != limit {
		t.Fatalf("InUse = %d, want %d", got, limit)
	}
	_ = p2.agent.SetWriteDeadline(time.Time{})
	rest := make(chan error, 1)
	go func() {
		_, err := p2.agent.Write(make([]byte, 20<<10))
		rest <- err
	}()

	agentSess, hubSess = dial(t, l, tunnel.TransportTCP)
	serveResumes(t, hubSess, hubSet)
	for _, p := range []*pair{p1, p2} {
		if err := resumeOver(t, agentSess, p.agent); err != nil {
			t.Fatal(err)
		}
	}
	// p2's blocked rest goes through once p1's bytes are acknowledged.
	if _, err := io.ReadFull(p1.hub, make([]byte, 80<<10)); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadFull(p2.hub, make([]byte, 40<<10)); err != nil {
		t.Fatal(err)
	}
	if err := <-rest; err != nil {
		t.Fatal(err)
	}
	waitFor(t, 5*time.Second, "the budget empties as acks arrive", func() bool { return budget.InUse() == 0 })
	if _, err := p1.agent.Write(make([]byte, 10<<10)); err != nil {
		t.Fatal(err)
	}
	p1.agent.Abort("done")
	p2.agent.Abort("done")
	if got := budget.InUse(); got != 0 {
		t.Fatalf("InUse after the streams ended = %d", got)
	}
}

// TestBudgetReleasedOnEnd: a stream that ends with unacknowledged bytes
// gives them back.
func TestBudgetReleasedOnEnd(t *testing.T) {
	budget := NewBudget(1 << 20)
	a, _ := tcpStreams(t, Config{Budget: budget, Buffer: 256 << 10})
	cut(a)
	waitClosed(t, a.Detached(), 5*time.Second, "detaches")
	if _, err := a.Write(make([]byte, 100<<10)); err != nil {
		t.Fatal(err)
	}
	if got := budget.InUse(); got != 100<<10 {
		t.Fatalf("InUse = %d", got)
	}
	a.Abort("gone")
	if got := budget.InUse(); got != 0 {
		t.Fatalf("InUse after Abort = %d", got)
	}
}

// TestRefusals: a duplicate id cannot join a set; an unknown id, and a
// received count outside what was sent, are refused with a reason, and the
// latter ends the stream with ErrProtocol.
func TestRefusals(t *testing.T) {
	k := newLink(t, tunnel.TransportQUIC, Config{}, Config{})
	c, _ := tcpPair(t)
	dup := New(k.p.hub.id, c, Config{})
	defer dup.Abort("test over")
	if err := k.p.hubSet.Add(dup); err == nil || !strings.Contains(err.Error(), "already in the set") {
		t.Fatalf("Add of a duplicate id: %v", err)
	}
	if err := k.p.hubSet.Add(k.p.hub); err == nil {
		t.Fatal("Add of a stream twice succeeded")
	}
	if err := NewSet().Add(k.p.hub); err == nil || !strings.Contains(err.Error(), "another set") {
		t.Fatalf("Add of a stream to a second set: %v", err)
	}

	agentSess, _ := k.sessionPair()
	ask := func(req ResumeRequest) ResumeAnswer {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		u, err := agentSess.OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer u.Close()
		if err := WriteResumeRequest(u, req); err != nil {
			t.Fatal(err)
		}
		ans, err := ReadResumeAnswer(u)
		if err != nil {
			t.Fatal(err)
		}
		return ans
	}
	unknown := NewID()
	if ans := ask(ResumeRequest{ID: unknown}); ans.OK || !strings.Contains(ans.Reason, "no stream "+unknown.String()) {
		t.Fatalf("answer for an unknown id: %+v", ans)
	}
	if _, err := k.p.hub.Write([]byte("12345")); err != nil {
		t.Fatal(err)
	}
	ans := ask(ResumeRequest{ID: k.p.hub.id, Received: 6})
	if ans.OK || !strings.Contains(ans.Reason, "received 6, outside") {
		t.Fatalf("answer for a count beyond what was sent: %+v", ans)
	}
	_, err := k.p.hub.Read(make([]byte, 1))
	if !errors.Is(err, ErrProtocol) {
		t.Fatalf("hub stream after a bad resume: %v, want ErrProtocol", err)
	}
	// Its tomb answers a second try with the reason.
	if ans := ask(ResumeRequest{ID: k.p.hub.id, Received: 5}); ans.OK || !strings.Contains(ans.Reason, "has ended") {
		t.Fatalf("answer for an ended stream: %+v", ans)
	}
	// A malformed request is refused too.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	u, err := agentSess.OpenStream(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer u.Close()
	if _, err := u.Write(make([]byte, requestLen)); err != nil {
		t.Fatal(err)
	}
	if ans, err := ReadResumeAnswer(u); err != nil || ans.OK || !strings.Contains(ans.Reason, "version 0") {
		t.Fatalf("answer to a malformed request: %+v, %v", ans, err)
	}
}

// TestFinishedStreamTomb: a peer that missed the last Ack of a stream that
// finished here is told it finished (and finishes too).
func TestFinishedStreamTomb(t *testing.T) {
	k := newLink(t, tunnel.TransportTCP, Config{}, Config{})
	exchange(t, k.p.agent, k.p.hub, "hi")
	for _, s := range []*Stream{k.p.agent, k.p.hub} {
		if err := s.CloseWrite(); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []*Stream{k.p.agent, k.p.hub} {
		if _, err := io.ReadAll(s); err != nil {
			t.Fatal(err)
		}
		waitClosed(t, s.Done(), 5*time.Second, "finished")
	}
	agentSess, _ := k.sessionPair()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, tc := range []struct {
		received uint64
		ok       bool
	}{{1, true}, {0, false}} {
		u, err := agentSess.OpenStream(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if err := WriteResumeRequest(u, ResumeRequest{ID: k.p.hub.id, Received: tc.received}); err != nil {
			t.Fatal(err)
		}
		ans, err := ReadResumeAnswer(u)
		_ = u.Close()
		if err != nil || ans.OK != tc.ok || (ans.OK && ans.Received != 3) {
			t.Errorf("answer for received %d: %+v, %v", tc.received, ans, err)
		}
	}
}

// TestResumeBoundedByContext: a peer that never answers does not hold
// Resume past its context, and the stream stays detached for another try.
func TestResumeBoundedByContext(t *testing.T) {
	a, _ := tcpStreams(t, Config{})
	cut(a)
	waitClosed(t, a.Detached(), 5*time.Second, "detaches")
	silent, _ := tcpPair(t)
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := a.Resume(ctx, silent)
	if err == nil || time.Since(start) > 5*time.Second {
		t.Fatalf("Resume against a silent peer: %v after %v", err, time.Since(start))
	}
	if done(a) {
		t.Fatal("a failed handshake ended the stream")
	}
	if attached, _ := a.State(); attached {
		t.Fatal("attached after a failed handshake")
	}
}

// TestAcksFreeTheReplayBuffer: a trickle of small writes is acknowledged
// within the ack delay, and the replay buffer lets go of its chunks.
func TestAcksFreeTheReplayBuffer(t *testing.T) {
	a, b := tcpStreams(t, Config{})
	for range 10 {
		exchange(t, a, b, "keystroke")
	}
	start := time.Now()
	waitFor(t, 5*time.Second, "everything acknowledged", func() bool {
		a.mu.Lock()
		defer a.mu.Unlock()
		return a.acked == a.wseq && a.buffered == 0 && len(a.chunks) == 0
	})
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("acknowledged after %v, want about %v", d, ackDelay)
	}
}

// TestCloseAll ends every stream of a set with the reason, on both ends.
func TestCloseAll(t *testing.T) {
	set := NewSet()
	var peers []*Stream
	for range 3 {
		a, b := tcpStreams(t, Config{})
		if err := set.Add(a); err != nil {
			t.Fatal(err)
		}
		peers = append(peers, b)
	}
	set.CloseAll("the hub is shutting down")
	if set.Len() != 0 {
		t.Fatalf("%d streams left after CloseAll", set.Len())
	}
	for _, b := range peers {
		_, err := b.Read(make([]byte, 1))
		wantEnded(t, "peer Read", err, ErrAborted, "the hub is shutting down")
	}
}

// TestAcceptReplacesAttached: a Resume request for a stream that still
// thinks its underlying stream alive (the peer's side of it died silently)
// is accepted, and the old underlying stream is closed.
func TestAcceptReplacesAttached(t *testing.T) {
	oldHub, oldPeer := tcpPair(t)
	var detachErr error
	detached := make(chan struct{})
	s := New(NewID(), oldHub, Config{OnDetach: func(_ *Stream, err error) { detachErr = err; close(detached) }})
	defer s.Abort("test over")
	set := NewSet()
	if err := set.Add(s); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte("abc")); err != nil {
		t.Fatal(err)
	}
	// The peer got "abc" but its acknowledgement never arrives.
	if f, err := readTestFrame(oldPeer); err != nil || string(f.data) != "abc" {
		t.Fatalf("peer read %+v, %v", f, err)
	}

	newHub, newPeer := tcpPair(t)
	accepted := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		accepted <- set.Accept(ctx, newHub)
	}()
	if err := WriteResumeRequest(newPeer, ResumeRequest{ID: s.ID(), Received: 3}); err != nil {
		t.Fatal(err)
	}
	ans, err := ReadResumeAnswer(newPeer)
	if err != nil || !ans.OK || ans.Received != 0 {
		t.Fatalf("answer %+v, %v", ans, err)
	}
	if err := <-accepted; err != nil {
		t.Fatalf("Accept: %v", err)
	}
	waitClosed(t, detached, 5*time.Second, "OnDetach")
	if !errors.Is(detachErr, errReplaced) {
		t.Errorf("OnDetach error %v, want the replacement", detachErr)
	}
	_ = oldPeer.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := oldPeer.Read(make([]byte, 1)); err != io.EOF {
		t.Fatalf("the old underlying stream: read %d, %v; want it closed (EOF)", n, err)
	}
	// Nothing is replayed (the peer had it all), and the stream goes on.
	if _, err := newPeer.Write(appendFrame(nil, frame{typ: frameData, data: []byte("xyz")})); err != nil {
		t.Fatal(err)
	}
	got := make([]byte, 3)
	if _, err := io.ReadFull(s, got); err != nil || string(got) != "xyz" {
		t.Fatalf("read %q, %v", got, err)
	}
	if _, err := s.Write([]byte("def")); err != nil {
		t.Fatal(err)
	}
	f, err := readTestFrame(newPeer)
	for err == nil && f.typ == frameAck { // the Ack of "xyz" may come first
		f, err = readTestFrame(newPeer)
	}
	if err != nil || string(f.data) != "def" {
		t.Fatalf("peer read %+v, %v; want the new data only", f, err)
	}
}

// TestCloseLingerBounded: a closed stream whose peer never acknowledges its
// last bytes ends after Window, attached as it is.
func TestCloseLingerBounded(t *testing.T) {
	c, peer := tcpPair(t)
	s := New(NewID(), c, Config{Window: 200 * time.Millisecond})
	set := NewSet()
	if err := set.Add(s); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Write([]byte("unacknowledged")); err != nil {
		t.Fatal(err)
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	waitClosed(t, s.Done(), 5*time.Second, "the lingering stream ends")
	if err := s.Err(); !errors.Is(err, ErrExpired) {
		t.Fatalf("Err() = %v, want ErrExpired", err)
	}
	if set.Len() != 0 {
		t.Fatal("still in its set")
	}
	checkReleased(t, "stream", s)
	// The peer is told.
	var reason string
	for {
		f, err := readTestFrame(peer)
		if err != nil {
			break
		}
		if f.typ == frameClose {
			reason = f.reason
		}
	}
	if !strings.Contains(reason, "did not take the stream's last bytes") {
		t.Fatalf("Close frame reason %q", reason)
	}
}

// TestExpiryAfterFinishIsNormal: a stream whose link died as it finished
// (everything acknowledged but its own Fin, the peer's Fin received) ends
// normally when its window passes: its application missed nothing.
func TestExpiryAfterFinishIsNormal(t *testing.T) {
	c, peer := tcpPair(t)
	s := New(NewID(), c, Config{Window: 150 * time.Millisecond})
	if _, err := peer.Write(appendFrame(nil, frame{typ: frameFin})); err != nil {
		t.Fatal(err)
	}
	if _, err := io.ReadAll(s); err != nil {
		t.Fatal(err)
	}
	if err := s.CloseWrite(); err != nil {
		t.Fatal(err)
	}
	// The peer reads the Ack of its Fin and our Fin, then the link dies.
	for seen := 0; seen < 2; seen++ {
		if _, err := readTestFrame(peer); err != nil {
			t.Fatal(err)
		}
	}
	_ = peer.Close()
	waitClosed(t, s.Done(), 5*time.Second, "the stream ends")
	if err := s.Err(); err != nil {
		t.Fatalf("Err() = %v, want a normal end", err)
	}
}

// TestPayloadPools: a received payload longer than pooledMin comes from the
// pool of the smallest power of two that holds it (so a bulk transfer
// allocates nothing per frame, and a queued payload pins less than twice
// its length); a shorter one is its own allocation, and is never pooled.
func TestPayloadPools(t *testing.T) {
	for _, tc := range []struct{ n, capacity int }{
		{1, 1},
		{512, 512},
		{pooledMin, pooledMin},
		{pooledMin + 1, 2 << 10},
		{2 << 10, 2 << 10},
		{2<<10 + 1, 4 << 10},
		{16<<10 - 5, 16 << 10},
		{32 << 10, 32 << 10},
		{32<<10 + 1, MaxFrame},
		{MaxFrame, MaxFrame},
	} {
		for range 2 { // the second time, from the pool
			b := allocPayload(tc.n)
			if len(b) != tc.n || cap(b) != tc.capacity {
				t.Fatalf("allocPayload(%d): len %d cap %d, want len %d cap %d", tc.n, len(b), cap(b), tc.n,
					tc.capacity)
			}
			freePayload(b)
		}
	}
	// Only the pools' own sizes go back to a pool: a slice of another
	// capacity would be handed out as a bigger one than it is.
	for _, capacity := range []int{pooledMin, 3 << 10, MaxFrame + 1} {
		freePayload(make([]byte, 1, capacity))
	}
	for n := pooledMin + 1; n <= MaxFrame; n *= 2 {
		if b := allocPayload(n); cap(b) < n || cap(b)&(cap(b)-1) != 0 {
			t.Fatalf("allocPayload(%d) after freeing odd capacities: cap %d", n, cap(b))
		}
	}
}
