package uplink

import (
	"errors"
	"log/slog"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/control"
)

type pipeStream struct{ net.Conn }

func (p pipeStream) CloseWrite() error { return p.Close() }

var errTestRefused = errors.New("test: refused for good")

// pipeConn is a Conn whose peer end is returned for the test to play the
// hub on.
func pipeConn(t *testing.T) (*Conn, net.Conn) {
	t.Helper()
	ours, theirs := net.Pipe()
	t.Cleanup(func() { ours.Close(); theirs.Close() })
	return NewControlConn(pipeStream{ours}, Peer{Name: "parent hub", Refused: errTestRefused},
		slog.New(slog.DiscardHandler)), theirs
}

// TestHandshake: the hello goes out, and the peer's answer is a welcome,
// or an error that names the peer (a fatal notice: Peer.Refused).
func TestHandshake(t *testing.T) {
	for _, tc := range []struct {
		name    string
		answer  *control.Message
		wantErr string
		refused bool
	}{
		{name: "welcome", answer: &control.Message{Type: control.TypeWelcome,
			Welcome: &control.Welcome{NodeID: "id1", Name: "n1"}}},
		{name: "fatal notice", answer: &control.Message{Type: control.TypeNotice, Notice: "revoked", Fatal: true},
			wantErr: "revoked", refused: true},
		{name: "notice", answer: &control.Message{Type: control.TypeNotice, Notice: "busy"},
			wantErr: "parent hub: busy"},
		{name: "not a welcome", answer: &control.Message{Type: control.TypeHeartbeat},
			wantErr: "parent hub sent heartbeat instead of welcome"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, hub := pipeConn(t)
			got := make(chan *control.Message, 1)
			go func() {
				m, err := control.Read(hub)
				if err != nil {
					close(got)
					return
				}
				got <- m
				if err := control.Write(hub, tc.answer); err != nil {
					t.Errorf("write the answer: %v", err)
				}
			}()
			w, err := c.handshake(&control.Message{Type: control.TypeHello, Hello: &control.Hello{
				ProtocolVersion: control.ProtocolVersion, Name: "n1"}})
			if m := <-got; m == nil || m.Type != control.TypeHello || m.Hello.Name != "n1" {
				t.Fatalf("the hub read %+v, want the hello", m)
			}
			switch {
			case tc.wantErr == "" && (err != nil || w == nil):
				t.Fatalf("handshake = %v, %v; want the welcome", w, err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("handshake error %v, want one with %q", err, tc.wantErr)
			case errors.Is(err, errTestRefused) != tc.refused:
				t.Fatalf("handshake error %v: refused %v, want %v", err, !tc.refused, tc.refused)
			}
		})
	}
}

// TestReadControl: every message but a fatal notice reaches the role's
// handler in order; the reader ends on the peer's close, a fatal notice
// (Peer.Refused), the handler's error, or silence past the deadline once
// the peer has heartbeaten (and not before its first heartbeat).
func TestReadControl(t *testing.T) {
	stop := errors.New("handler stops")
	hb := &control.Message{Type: control.TypeHeartbeat}
	for _, tc := range []struct {
		name     string
		send     []*control.Message
		close    bool // the hub closes after sending
		handler  error
		wantErr  string
		wantSeen int
		refused  bool
	}{
		{name: "closed", send: []*control.Message{hb, {Type: control.TypeNotice, Notice: "hi"}}, close: true,
			wantErr: "the parent hub closed the control stream", wantSeen: 2},
		{name: "fatal notice", send: []*control.Message{hb, {Type: control.TypeNotice, Notice: "removed", Fatal: true}},
			wantErr: "removed", wantSeen: 1, refused: true},
		{name: "handler error", send: []*control.Message{hb}, handler: stop,
			wantErr: stop.Error(), wantSeen: 1},
		{name: "silent after heartbeat", send: []*control.Message{hb},
			wantErr: "no heartbeat from the parent hub for 50ms", wantSeen: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, hub := pipeConn(t)
			go func() {
				for _, m := range tc.send {
					if control.Write(hub, m) != nil {
						return
					}
				}
				if tc.close {
					hub.Close()
				}
			}()
			seen := 0
			done := make(chan error, 1)
			go func() {
				done <- c.ReadControl(50*time.Millisecond, func(*control.Message) error { seen++; return tc.handler })
			}()
			var err error
			select {
			case err = <-done:
			case <-time.After(10 * time.Second):
				t.Fatal("ReadControl did not return")
			}
			if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
				t.Fatalf("ReadControl = %v, want an error with %q", err, tc.wantErr)
			}
			if errors.Is(err, errTestRefused) != tc.refused {
				t.Fatalf("ReadControl = %v: refused %v, want %v", err, !tc.refused, tc.refused)
			}
			if seen != tc.wantSeen {
				t.Errorf("handler saw %d messages, want %d", seen, tc.wantSeen)
			}
		})
	}
}

// TestReadControlWaitsForFirstHeartbeat: a peer that has not heartbeaten
// yet is not held to the silence deadline (a hub without heartbeats).
func TestReadControlWaitsForFirstHeartbeat(t *testing.T) {
	c, hub := pipeConn(t)
	done := make(chan error, 1)
	go func() { done <- c.ReadControl(20*time.Millisecond, func(*control.Message) error { return nil }) }()
	select {
	case err := <-done:
		t.Fatalf("ReadControl ended before any heartbeat: %v", err)
	case <-time.After(200 * time.Millisecond):
	}
	hub.Close()
	if err := <-done; err == nil || !strings.Contains(err.Error(), "closed the control stream") {
		t.Fatalf("ReadControl = %v after the close", err)
	}
}
