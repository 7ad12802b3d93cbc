package tunnel

import (
	"context"
	"fmt"
	"net"

	"github.com/quic-go/quic-go"
)

// UDPSocket is one local UDP socket that carries the QUIC sessions of many
// dials (Dialer.UDP). An agent normally dials from a socket of its own; a
// process that runs thousands of agents (the agent simulator in bench/)
// shares a few sockets instead of holding a file descriptor per session.
// QUIC tells the sessions apart by connection ID, so the hub sees nothing
// unusual.
type UDPSocket struct {
	conn  *net.UDPConn
	tr    *quic.Transport
	hints *hintBox // the hub's retry hints for refused dials (see quicBusyMagic)
	stop  context.CancelFunc
}

// ListenUDP binds a UDP socket for Dialer.UDP on addr ("127.0.0.2:0").
func ListenUDP(addr string) (*UDPSocket, error) {
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		return nil, fmt.Errorf("tunnel: listen udp %q: %w", addr, err)
	}
	c, err := net.ListenUDP("udp", ua)
	if err != nil {
		return nil, fmt.Errorf("tunnel: listen udp %s: %w", addr, err)
	}
	s := &UDPSocket{conn: c, tr: &quic.Transport{Conn: c}}
	ctx, stop := context.WithCancel(context.Background())
	s.hints, s.stop = watchHints(ctx, s.tr, 1024), stop
	return s, nil
}

// LocalAddr is the socket's address.
func (s *UDPSocket) LocalAddr() net.Addr { return s.conn.LocalAddr() }

// Close ends every session dialed on the socket and closes it.
func (s *UDPSocket) Close() error {
	s.stop()
	<-s.hints.done
	err := s.tr.Close()
	if cerr := s.conn.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("tunnel: close udp socket: %w", err)
	}
	return nil
}
