package tunnel

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"
	"time"
)

// Every test here runs once per transport: the Session and Stream contract
// must not depend on it.

func TestSessionInfo(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			agent, hub := pair(t, tr, nil)
			for _, s := range []Session{agent, hub} {
				if s.Transport() != tr {
					t.Errorf("Transport() = %v, want %v", s.Transport(), tr)
				}
				if p := s.ConnectionState().NegotiatedProtocol; p != ALPN {
					t.Errorf("NegotiatedProtocol = %q, want %q", p, ALPN)
				}
			}
			if certs := hub.ConnectionState().PeerCertificates; len(certs) == 0 || certs[0].Subject.CommonName != "node-1" {
				t.Errorf("hub sees peer certificates %v, want node-1", certs)
			}
			if certs := agent.ConnectionState().PeerCertificates; len(certs) == 0 || certs[0].Subject.CommonName != "hub" {
				t.Errorf("agent sees peer certificates %v, want hub", certs)
			}
			if port(t, hub.RemoteAddr()) != port(t, agent.LocalAddr()) ||
				port(t, agent.RemoteAddr()) != port(t, hub.LocalAddr()) {
				t.Errorf("addresses do not match: agent %v->%v, hub %v->%v",
					agent.LocalAddr(), agent.RemoteAddr(), hub.LocalAddr(), hub.RemoteAddr())
			}
			a, b := openPair(t, hub, agent)
			if a.RemoteAddr().String() != hub.RemoteAddr().String() || b.LocalAddr().String() != agent.LocalAddr().String() {
				t.Errorf("stream addresses differ from the session's")
			}

			if err := agent.Close(); err != nil {
				t.Fatalf("Close: %v", err)
			}
			if err := agent.Close(); err != nil {
				t.Fatalf("second Close: %v", err)
			}
			waitClosed(t, agent.Done(), time.Second, "agent Done after Close")
			waitClosed(t, hub.Done(), 5*time.Second, "hub Done after peer Close")

			ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
			defer cancel()
			for name, s := range map[string]Session{"agent": agent, "hub": hub} {
				if _, err := s.OpenStream(ctx); !errors.Is(err, ErrSessionClosed) {
					t.Errorf("%s OpenStream after close: %v, want ErrSessionClosed", name, err)
				}
				if _, err := s.AcceptStream(ctx); !errors.Is(err, ErrSessionClosed) {
					t.Errorf("%s AcceptStream after close: %v, want ErrSessionClosed", name, err)
				}
			}
		})
	}
}

func port(t testing.TB, a net.Addr) int {
	t.Helper()
	_, p, err := net.SplitHostPort(a.String())
	if err != nil {
		t.Fatalf("address %v: %v", a, err)
	}
	var n int
	fmt.Sscan(p, &n)
	return n
}

// TestStreamsBothDirections runs the Tether stream protocol (header, reply,
// payload) on a hub-opened stream, and checks that the agent can open
// streams too.
func TestStreamsBothDirections(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			agent, hub := pair(t, tr, nil)
			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()

			// hub -> agent, as a jump does.
			hs, err := hub.OpenStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer hs.Close()
			want := Header{Service: ServiceTCP, Port: 8080}
			if err := WriteHeader(hs, want); err != nil {
				t.Fatal(err)
			}
			as, err := agent.AcceptStream(ctx)
			if err != nil {
				t.Fatal(err)
			}
			defer as.Close()
			got, err := ReadHeader(as)
			if err != nil || got != want {
				t.Fatalf("ReadHeader = %v, %v; want %v", got, err, want)
			}
			if err := WriteReply(as, Reply{OK: true}); err != nil {
				t.Fatal(err)
			}
			if rep, err := ReadReply(hs); err != nil || !rep.OK {
				t.Fatalf("ReadReply = %+v, %v", rep, err)
			}
			exchange(t, hs, as, "ping from hub")
			exchange(t, as, hs, "pong from agent")

			// agent -> hub.
			a2, h2 := openPair(t, agent, hub)
			exchange(t, a2, h2, "agent-opened")
			exchange(t, h2, a2, "hub answers")
		})
	}
}

// exchange writes msg on w and reads it back on r.
func exchange(t testing.TB, w, r Stream, msg string) {
	t.Helper()
	if _, err := w.Write([]byte(msg)); err != nil {
		t.Fatalf("write %q: %v", msg, err)
	}
	buf := make([]byte, len(msg))
	if _, err := io.ReadFull(r, buf); err != nil || string(buf) != msg {
		t.Fatalf("read %q, %v; want %q", buf, err, msg)
	}
}

// TestEcho8MiB sends 8 MiB through an echoing peer and compares checksums.
func TestEcho8MiB(t *testing.T) {
	const size = 8 << 20
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			agent, hub := pair(t, tr, nil)
			a, b := openPair(t, hub, agent)
			echoDone := make(chan error, 1)
			go func() {
				_, err := io.Copy(b, b)
				if err == nil {
					err = b.CloseWrite()
				}
				echoDone <- err
			}()

			data := make([]byte, size)
			_, _ = rand.Read(data)
			sent := sha256.Sum256(data)
			writeDone := make(chan error, 1)
			go func() {
				_, err := a.Write(data)
				if err == nil {
					err = a.CloseWrite()
				}
				writeDone <- err
			}()
			h := sha256.New()
			n, err := io.Copy(h, a)
			if err != nil {
				t.Fatalf("read echo: %v", err)
			}
			if err := <-writeDone; err != nil {
				t.Fatalf("write: %v", err)
			}
			if err := <-echoDone; err != nil {
				t.Fatalf("echo: %v", err)
			}
			if n != size || !bytes.Equal(h.Sum(nil), sent[:]) {
				t.Fatalf("echo returned %d bytes with checksum %x, want %d bytes %x", n, h.Sum(nil), size, sent)
			}
		})
	}
}

func TestHalfClose(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			agent, hub := pair(t, tr, nil)
			a, b := openPair(t, hub, agent)

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
			// The half-closed side still reads what the peer sends.
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
		})
	}
}

// TestCloseUnblocks checks the net.Conn rule that Close unblocks a Read or
// Write blocked in another goroutine, and that a full Close reaches the
// peer as EOF.
func TestCloseUnblocks(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			agent, hub := pair(t, tr, nil)

			a, b := openPair(t, hub, agent)
			readErr := make(chan error, 1)
			go func() {
				_, err := a.Read(make([]byte, 10))
				readErr <- err
			}()
			time.Sleep(50 * time.Millisecond)
			_ = a.Close()
			select {
			case err := <-readErr:
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("blocked Read after Close: %v, want net.ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close did not unblock Read")
			}
			if _, err := io.ReadAll(b); err != nil {
				t.Errorf("peer of a closed stream reads %v, want EOF", err)
			}

			// Nobody reads c's peer, so a large write blocks on flow control.
			c, _ := openPair(t, hub, agent)
			writeErr := make(chan error, 1)
			go func() {
				_, err := c.Write(make([]byte, 64<<20))
				writeErr <- err
			}()
			time.Sleep(200 * time.Millisecond)
			_ = c.Close()
			select {
			case err := <-writeErr:
				if !errors.Is(err, net.ErrClosed) {
					t.Errorf("blocked Write after Close: %v, want net.ErrClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("Close did not unblock Write")
			}
		})
	}
}

func TestStreamDeadline(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			agent, hub := pair(t, tr, nil)
			a, b := openPair(t, hub, agent)
			if err := a.SetReadDeadline(time.Now().Add(50 * time.Millisecond)); err != nil {
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
		})
	}
}

// TestManyConcurrentStreams echoes on 64 streams at once.
func TestManyConcurrentStreams(t *testing.T) {
	const (
		streams = 64
		size    = 128 << 10
	)
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			agent, hub := pair(t, tr, nil)
			var wg sync.WaitGroup
			defer wg.Wait()
			defer agent.Close()
			wg.Go(func() { serveEcho(agent, &wg) })

			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			errs := make(chan error, streams)
			var clients sync.WaitGroup
			for i := range streams {
				clients.Go(func() { errs <- echoOnce(ctx, hub, i, size) })
			}
			clients.Wait()
			close(errs)
			for err := range errs {
				if err != nil {
					t.Error(err)
				}
			}
		})
	}
}

// serveEcho accepts streams on s and echoes each until s ends.
func serveEcho(s Session, wg *sync.WaitGroup) {
	for {
		st, err := s.AcceptStream(context.Background())
		if err != nil {
			return
		}
		wg.Go(func() {
			defer st.Close()
			if _, err := io.Copy(st, st); err == nil {
				_ = st.CloseWrite()
				_, _ = io.Copy(io.Discard, st)
			}
		})
	}
}

// echoOnce sends size bytes on a new stream of s and checks the echo.
func echoOnce(ctx context.Context, s Session, id, size int) error {
	st, err := s.OpenStream(ctx)
	if err != nil {
		return fmt.Errorf("stream %d: open: %w", id, err)
	}
	defer st.Close()
	data := bytes.Repeat([]byte{byte(id)}, size)
	werr := make(chan error, 1)
	go func() {
		_, err := st.Write(data)
		if err == nil {
			err = st.CloseWrite()
		}
		werr <- err
	}()
	got, err := io.ReadAll(st)
	if err != nil {
		return fmt.Errorf("stream %d: read: %w", id, err)
	}
	if err := <-werr; err != nil {
		return fmt.Errorf("stream %d: write: %w", id, err)
	}
	if !bytes.Equal(got, data) {
		return fmt.Errorf("stream %d: echo differs (%d bytes, want %d)", id, len(got), len(data))
	}
	return nil
}

// TestMaxStreams checks both ends of the limit: the opener cannot have more
// than MaxStreams streams open, and the accepter never gets more than its
// MaxStreams at once even from a peer with a higher limit. A closed stream
// frees its slot.
func TestMaxStreams(t *testing.T) {
	const limit = 4
	for _, tr := range transports {
		t.Run(tr.String()+"/opener", func(t *testing.T) {
			cfg := &Config{MaxStreams: limit}
			agent, hub := pair(t, tr, cfg)
			var hubSide, agentSide []Stream
			for range limit {
				a, b := openPair(t, hub, agent)
				hubSide, agentSide = append(hubSide, a), append(agentSide, b)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
			defer cancel()
			if st, err := hub.OpenStream(ctx); !errors.Is(err, context.DeadlineExceeded) {
				if st != nil {
					st.Close()
				}
				t.Fatalf("open beyond MaxStreams: %v, want it to block until ctx expires", err)
			}
			_ = hubSide[0].Close()
			_ = agentSide[0].Close()
			openPair(t, hub, agent) // succeeds once a slot is free
		})

		t.Run(tr.String()+"/accepter", func(t *testing.T) {
			l := startListener(t, &Config{MaxStreams: 2 * limit})
			agent, hub := dialAccept(t, l, l.Addr().String(), tr, &Config{MaxStreams: limit})

			ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
			defer cancel()
			opened := make(chan Stream, limit+1)
			go func() {
				defer close(opened)
				for range limit + 1 {
					st, err := hub.OpenStream(ctx)
					if err != nil {
						return
					}
					if _, err := st.Write([]byte{'!'}); err != nil {
						st.Close()
						return
					}
					opened <- st
				}
			}()
			defer func() {
				cancel()
				for st := range opened {
					st.Close()
				}
			}()
			var accepted []Stream
			for range limit {
				st, err := agent.AcceptStream(ctx)
				if err != nil {
					t.Fatalf("accept within limit: %v", err)
				}
				defer st.Close()
				accepted = append(accepted, st)
			}
			short, cancelShort := context.WithTimeout(ctx, 500*time.Millisecond)
			defer cancelShort()
			if st, err := agent.AcceptStream(short); !errors.Is(err, context.DeadlineExceeded) {
				if st != nil {
					st.Close()
				}
				t.Fatalf("accept beyond MaxStreams: %v, want it to block until ctx expires", err)
			}
			first := <-opened
			_ = first.Close()
			_ = accepted[0].Close()
			st, err := agent.AcceptStream(ctx)
			if err != nil {
				t.Fatalf("accept after a slot was freed: %v", err)
			}
			st.Close()
		})
	}
}

// TestDeadPeer cuts the link silently (no FIN, no RST, no ICMP) and expects
// keepalives to end both sessions within about IdleTimeout.
func TestDeadPeer(t *testing.T) {
	cfg := &Config{KeepAliveInterval: 500 * time.Millisecond, IdleTimeout: 2 * time.Second}
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			l := startListener(t, cfg)
			var (
				addr      string
				blackhole func()
			)
			if tr == TransportQUIC {
				p := newUDPProxy(t, l.Addr().String())
				addr, blackhole = p.addr(), p.blackhole
			} else {
				p := newTCPProxy(t, l.Addr().String())
				addr, blackhole = p.addr(), p.blackhole
			}
			agent, hub := dialAccept(t, l, addr, tr, cfg)
			a, _ := openPair(t, hub, agent)
			readErr := make(chan error, 1)
			go func() {
				_, err := a.Read(make([]byte, 1))
				readErr <- err
			}()

			blackhole()
			start := time.Now()
			waitClosed(t, agent.Done(), 6*time.Second, "agent session after link died")
			waitClosed(t, hub.Done(), 6*time.Second, "hub session after link died")
			t.Logf("%v: dead peer noticed after %v", tr, time.Since(start).Round(10*time.Millisecond))

			select {
			case err := <-readErr:
				if !errors.Is(err, ErrSessionClosed) {
					t.Errorf("blocked Read when the session died: %v, want ErrSessionClosed", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("blocked Read not released when the session died")
			}
			if _, err := hub.OpenStream(t.Context()); !errors.Is(err, ErrSessionClosed) {
				t.Errorf("OpenStream on dead session: %v, want ErrSessionClosed", err)
			}
		})
	}
}

// TestPeerCloseEndsStreams: when the peer closes its session (a hub that
// stops cleanly), a blocked Read on a stream of ours ends with
// ErrSessionClosed, never a clean io.EOF that would pass for the stream's
// own end, and so does AcceptStream; on QUIC both say the peer closed it
// rather than quoting quic-go's "Application error 0x0 (remote)".
func TestPeerCloseEndsStreams(t *testing.T) {
	for _, tr := range transports {
		t.Run(tr.String(), func(t *testing.T) {
			l := startListener(t, nil)
			agent, hub := dialAccept(t, l, l.Addr().String(), tr, nil)
			_, onAgent := openPair(t, hub, agent)
			readErr := make(chan error, 1)
			go func() {
				_, err := onAgent.Read(make([]byte, 4))
				readErr <- err
			}()
			hub.Close()
			select {
			case err := <-readErr:
				if !errors.Is(err, ErrSessionClosed) || errors.Is(err, io.EOF) {
					t.Errorf("Read after the peer closed the session: %v, want ErrSessionClosed and no io.EOF", err)
				}
				if tr == TransportQUIC && !strings.Contains(err.Error(), "session closed by the peer") {
					t.Errorf("Read after the peer closed the session: %q, want it to say the peer closed it", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("blocked Read not released when the peer closed the session")
			}
			_, err := agent.AcceptStream(t.Context())
			if !errors.Is(err, ErrSessionClosed) {
				t.Errorf("AcceptStream after the peer closed the session: %v, want ErrSessionClosed", err)
			}
			if tr == TransportQUIC && !strings.Contains(fmt.Sprint(err), "session closed by the peer") {
				t.Errorf("AcceptStream after the peer closed the session: %v, want it to say the peer closed it", err)
			}
		})
	}
}
