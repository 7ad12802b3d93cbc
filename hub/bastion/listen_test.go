package bastion

import (
	"errors"
	"net"
	"strings"
	"syscall"
	"testing"

	gossh "golang.org/x/crypto/ssh"
)

// TestListenAddressInUse: a taken port fails Listen with an error that names
// the address once (the hub prefixes its --ssh-listen flag).
func TestListenAddressInUse(t *testing.T) {
	taken, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer taken.Close()
	addr := taken.Addr().String()
	b, err := New(Config{Addr: addr, HostSigner: newSigner(t), Dialer: noDialer{},
		Authorize: func(string, gossh.PublicKey) bool { return false }})
	if err != nil {
		t.Fatal(err)
	}
	_, err = b.Listen()
	if err == nil {
		t.Fatal("Listen on a taken port succeeded")
	}
	if !errors.Is(err, syscall.EADDRINUSE) || strings.Count(err.Error(), addr) != 1 {
		t.Fatalf("Listen error %q: want EADDRINUSE naming %s once", err, addr)
	}
}
