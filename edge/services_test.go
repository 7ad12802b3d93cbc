package edge

import (
	"context"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel"
)

// pipeStream is one end of an in-memory stream (net.Pipe has no half-close;
// these tests never need one).
type pipeStream struct{ net.Conn }

func (p pipeStream) CloseWrite() error { return p.Close() }

// TestSSHStreamWaitsForTrust: an ssh stream that arrives before the hub's
// first SSH trust of the session is applied reaches the SSH server only
// once it is, so the server never answers without its host certificate
// (clients refuse a node whose host certificate they cannot check).
func TestSSHStreamWaitsForTrust(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan net.Conn, 1)
	go func() {
		if c, err := ln.Accept(); err == nil {
			accepted <- c
		}
	}()
	a := &Agent{cfg: Config{SSHTarget: ln.Addr().String()}, log: slog.New(slog.DiscardHandler), allow: map[uint16]bool{}}
	hubEnd, agentEnd := net.Pipe()
	defer hubEnd.Close()
	trusted := make(chan struct{})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		a.serveStream(ctx, pipeStream{agentEnd}, trusted, a.log, nil)
	}()
	if err := tunnel.WriteHeader(hubEnd, tunnel.Header{Service: tunnel.ServiceSSH}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-accepted:
		t.Fatal("the ssh stream reached the SSH server before the hub's SSH trust was applied")
	case <-time.After(300 * time.Millisecond):
	}
	close(trusted)
	select {
	case c := <-accepted:
		c.Close()
	case <-time.After(trustWait):
		t.Fatal("the ssh stream did not reach the SSH server once trust was applied")
	}
	if rep, err := tunnel.ReadReply(hubEnd); err != nil || !rep.OK {
		t.Fatalf("reply: %+v, %v", rep, err)
	}
	hubEnd.Close()
	cancel()
	<-done
}
