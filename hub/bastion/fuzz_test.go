package bastion

import (
	"bytes"
	"errors"
	"net"
	"strings"
	"testing"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
)

// FuzzTarget: a direct-tcpip destination of any content is refused, or is
// a valid node name (never an address, never localhost) with a header that
// encodes.
func FuzzTarget(f *testing.F) {
	for _, s := range []string{
		"n1", "N1.tether", "127.0.0.1", "[::1]", "localhost.tether", "2130706433", "a..b", "n1\x00", "xn--80ak6aa92e",
	} {
		f.Add(s, uint32(22))
	}
	f.Add("n1", uint32(0))
	f.Add("n1", uint32(65536))
	f.Fuzz(func(t *testing.T, host string, port uint32) {
		node, h, err := Target(host, port, ".tether")
		if err != nil {
			if !errors.Is(err, ErrNotANode) {
				t.Fatalf("Target(%q, %d): error without ErrNotANode: %v", host, port, err)
			}
			return
		}
		if pki.ValidateName(node) != nil || net.ParseIP(node) != nil || net.ParseIP(strings.Trim(host, "[]")) != nil ||
			node == "localhost" {
			t.Fatalf("Target(%q, %d) accepted node %q", host, port, node)
		}
		if err := tunnel.WriteHeader(&bytes.Buffer{}, h); err != nil {
			t.Fatalf("Target(%q, %d) gave header %+v that does not encode: %v", host, port, h, err)
		}
	})
}
