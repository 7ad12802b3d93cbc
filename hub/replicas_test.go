package hub

import (
	"net"
	"os"
	"testing"
)

// A replica shows its own listeners: the bound address, with the
// machine's name for a wildcard (as --peer-advertise defaults).
func TestOwnAddr(t *testing.T) {
	host, err := os.Hostname()
	if err != nil {
		t.Skip(err)
	}
	for _, tt := range []struct {
		bound net.Addr
		want  string
	}{
		{&net.TCPAddr{IP: net.IPv4(127, 0, 0, 1), Port: 7443}, "127.0.0.1:7443"},
		{&net.TCPAddr{IP: net.IPv6loopback, Port: 7443}, "[::1]:7443"},
		{&net.TCPAddr{IP: net.IPv4zero, Port: 2222}, net.JoinHostPort(host, "2222")},
		{&net.TCPAddr{IP: net.IPv6unspecified, Port: 2222}, net.JoinHostPort(host, "2222")},
	} {
		if got := ownAddr(tt.bound); got != tt.want {
			t.Errorf("ownAddr(%s) = %q, want %q", tt.bound, got, tt.want)
		}
	}
}
