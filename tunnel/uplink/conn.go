package uplink

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/tether-dev/tether/tunnel"
	"github.com/tether-dev/tether/tunnel/control"
)

// Peer says who is at the other end of an uplink, for its errors and logs.
type Peer struct {
	// Name is the peer in messages: "hub" for an agent, "parent hub" for
	// a site hub.
	Name string
	// Refused is the error a fatal notice from the peer wraps (the role's
	// sentinel: the peer refuses this identity for good). Required.
	Refused error
}

// Conn is one session with the peer: the tunnel and its control stream
// (see control's protocol: hello, welcome, then heartbeats, renewals and
// whatever the role exchanges).
type Conn struct {
	tun  tunnel.Session
	peer Peer
	log  *slog.Logger
	ctrl tunnel.Stream // set by Start

	sendMu sync.Mutex // serializes writes on ctrl
}

// NewConn wraps a dialed tunnel; log is the session's logger.
func NewConn(tun tunnel.Session, peer Peer, log *slog.Logger) *Conn {
	return &Conn{tun: tun, peer: peer, log: log}
}

// NewControlConn is a Conn on an already open control stream and no
// tunnel (Start, Heartbeat's close and Tunnel are then unusable): a role's
// unit tests exchange control messages over a pipe this way.
func NewControlConn(ctrl tunnel.Stream, peer Peer, log *slog.Logger) *Conn {
	return &Conn{ctrl: ctrl, peer: peer, log: log}
}

// Tunnel is the session's tunnel.
func (c *Conn) Tunnel() tunnel.Session { return c.tun }

// Control is the control stream (nil before Start).
func (c *Conn) Control() tunnel.Stream { return c.ctrl }

// Start opens the control stream, sends hello and waits for the welcome.
// A fatal notice instead of the welcome is Peer.Refused. On an error the
// control stream is closed; the tunnel is the caller's.
func (c *Conn) Start(ctx context.Context, hello *control.Message) (*control.Welcome, error) {
	octx, cancel := context.WithTimeout(ctx, OpenCtlTimeout)
	ctrl, err := c.tun.OpenStream(octx)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("open control stream: %w", err)
	}
	c.ctrl = ctrl
	w, err := c.handshake(hello)
	if err != nil {
		ctrl.Close()
		return nil, err
	}
	return w, nil
}

func (c *Conn) handshake(hello *control.Message) (*control.Welcome, error) {
	if err := c.Send(hello); err != nil {
		return nil, err
	}
	_ = c.ctrl.SetReadDeadline(time.Now().Add(WelcomeTimeout))
	msg, err := control.Read(c.ctrl)
	if err != nil {
		return nil, fmt.Errorf("waiting for welcome: %w", err)
	}
	switch {
	case msg.Type == control.TypeNotice && msg.Fatal:
		return nil, fmt.Errorf("%w: %s", c.peer.Refused, msg.Notice)
	case msg.Type == control.TypeNotice:
		return nil, fmt.Errorf("%s: %s", c.peer.Name, msg.Notice)
	case msg.Type != control.TypeWelcome:
		return nil, fmt.Errorf("%s sent %s instead of welcome", c.peer.Name, msg.Type)
	}
	_ = c.ctrl.SetReadDeadline(time.Time{})
	return msg.Welcome, nil
}

// Send writes one control message; safe for concurrent use.
func (c *Conn) Send(m *control.Message) error {
	return c.Write(func(w io.Writer) error { return control.Write(w, m) })
}

// Write runs f on the control stream under the send lock and a write
// deadline; heartbeats go through it pre-encoded (control.WriteHeartbeat).
func (c *Conn) Write(f func(io.Writer) error) error {
	c.sendMu.Lock()
	defer c.sendMu.Unlock()
	_ = c.ctrl.SetWriteDeadline(time.Now().Add(SendTimeout))
	return f(c.ctrl)
}

// Heartbeat sends a heartbeat every interval until ctx ends; a failed send
// closes the tunnel.
func (c *Conn) Heartbeat(ctx context.Context, every time.Duration) {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := c.Write(control.WriteHeartbeat); err != nil {
				c.tun.Close()
				return
			}
		}
	}
}

// ReadControl reads the peer's control messages until the stream fails,
// the peer falls silent for longer than silent once it has heartbeaten, a
// fatal notice arrives (Peer.Refused), or handle returns an error. It logs
// notices; every other message, heartbeats and non-fatal notices included,
// goes to handle, in order, on this reader (so handle must not block long).
func (c *Conn) ReadControl(silent time.Duration, handle func(*control.Message) error) error {
	beats := false // set by the peer's first heartbeat
	for {
		if beats {
			// A peer that heartbeats and falls silent is gone, or the link
			// is half-open: close explicitly (the peer hears of it if its
			// direction still works) before QUIC's idle timeout, which
			// never fires while packets still arrive, would end it silently.
			_ = c.ctrl.SetReadDeadline(time.Now().Add(silent))
		}
		msg, err := control.Read(c.ctrl)
		if err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("the %s closed the control stream", c.peer.Name)
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return fmt.Errorf("no heartbeat from the %s for %s: the %s is gone or the link is half-open",
					c.peer.Name, silent, c.peer.Name)
			}
			return fmt.Errorf("control stream: %w", err)
		}
		switch msg.Type {
		case control.TypeHeartbeat:
			beats = true
		case control.TypeNotice:
			c.log.Warn(c.peer.Name+" notice", "notice", msg.Notice)
			if msg.Fatal {
				return fmt.Errorf("%w: %s", c.peer.Refused, msg.Notice)
			}
		}
		if err := handle(msg); err != nil {
			return err
		}
	}
}
