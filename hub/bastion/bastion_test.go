package bastion

import (
	"errors"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel"
)

func TestTarget(t *testing.T) {
	cases := []struct {
		host    string
		port    uint32
		node    string
		service tunnel.Service
		tcpPort uint16
		refused bool
	}{
		{host: "n1", port: 22, node: "n1", service: tunnel.ServiceSSH},
		{host: "N1", port: 22, node: "n1", service: tunnel.ServiceSSH},
		{host: "n1.tether", port: 22, node: "n1", service: tunnel.ServiceSSH},
		{host: "n1", port: 8080, node: "n1", service: tunnel.ServiceTCP, tcpPort: 8080},
		{host: "127.0.0.1", port: 22, refused: true},
		{host: "10.0.0.7", port: 22, refused: true},
		{host: "::1", port: 22, refused: true},
		{host: "[::1]", port: 22, refused: true},
		{host: "localhost", port: 22, refused: true},
		{host: "localhost.tether", port: 22, refused: true},
		{host: "hub.tether.internal", port: 7443, refused: true},
		{host: "n1.example.com", port: 22, refused: true},
		{host: "", port: 22, refused: true},
		{host: "n1", port: 0, refused: true},
		{host: "n1", port: 70000, refused: true},
		{host: "2130706433", port: 22, refused: true}, // 127.0.0.1 as an integer
		{host: "n1\x00", port: 22, refused: true},
		// Names that read as addresses, with or without the suffix: the
		// same rule refuses them as node names at join.
		{host: "0x7f000001", port: 22, refused: true},
		{host: "0x7f000001.tether", port: 22, refused: true},
		{host: "ip6-localhost.tether", port: 22, refused: true},
		{host: "127-0-0-1.tether", port: 22, refused: true},
		{host: "1e3", port: 22, refused: true},
		{host: "127.1", port: 22, refused: true},
	}
	for _, tc := range cases {
		node, h, err := Target(tc.host, tc.port, ".tether")
		if tc.refused {
			if !errors.Is(err, ErrNotANode) {
				t.Errorf("Target(%q, %d) = %q, %v; want ErrNotANode", tc.host, tc.port, node, err)
			}
			if tc.port == 22 && pki.ValidateName(strings.TrimSuffix(strings.ToLower(tc.host), ".tether")) == nil {
				t.Errorf("Target(%q) refused a name a node may take: %v", tc.host, err)
			}
			continue
		}
		if err != nil || node != tc.node || h.Service != tc.service || h.Port != tc.tcpPort {
			t.Errorf("Target(%q, %d) = %q, %+v, %v", tc.host, tc.port, node, h, err)
		}
	}
}

func TestSiteTarget(t *testing.T) {
	isSite := func(s string) bool { return s == "berlin" }
	for _, tc := range []struct {
		host, node string
		refused    bool
	}{
		{host: "n7.berlin", node: "n7.berlin"},
		{host: "N7.Sub.Berlin.tether", node: "n7.sub.berlin"},
		{host: "n1", node: "n1"},
		{host: "n7.paris", refused: true},
		{host: "n1.example.com", refused: true},
		{host: "127.0.0.1", refused: true},
		{host: "10.0.0.berlin", refused: true},
		{host: ".berlin", refused: true},
	} {
		node, _, err := SiteTarget(tc.host, 22, ".tether", isSite)
		if tc.refused != (err != nil) || (!tc.refused && node != tc.node) {
			t.Errorf("SiteTarget(%q) = %q, %v; want %q refused %v", tc.host, node, err, tc.node, tc.refused)
		}
	}
}

// TestNoShellHint: a shell asked of the bastion is refused with an example
// jump whose target carries the node suffix, the name under which the
// operator's ssh verifies a node's host certificate.
func TestNoShellHint(t *testing.T) {
	for _, tc := range []struct {
		suffix, want string
	}{
		{"", "root@NODE.tether`"},
		{".edge", "root@NODE.edge`"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			op := newSigner(t)
			_, addr := startBastion(t, Config{
				Addr: "127.0.0.1:0", HostSigner: newSigner(t), Dialer: noDialer{}, NodeSuffix: tc.suffix,
				Authorize: func(user string, k gossh.PublicKey) bool {
					return user == "alice" && string(k.Marshal()) == string(op.PublicKey().Marshal())
				},
			})
			client, err := gossh.Dial("tcp", addr, &gossh.ClientConfig{User: "alice",
				Auth:            []gossh.AuthMethod{gossh.PublicKeys(op)},
				HostKeyCallback: gossh.InsecureIgnoreHostKey(), Timeout: 5 * time.Second})
			if err != nil {
				t.Fatal(err)
			}
			defer client.Close()
			sess, err := client.NewSession()
			if err != nil {
				t.Fatal(err)
			}
			defer sess.Close()
			var stderr strings.Builder
			sess.Stderr = &stderr
			err = sess.Run("id")
			var exit *gossh.ExitError
			if !errors.As(err, &exit) || exit.ExitStatus() != 1 {
				t.Fatalf("a command on the bastion: %v, want exit status 1", err)
			}
			if got := stderr.String(); !strings.Contains(got, "no shell") || !strings.Contains(got, tc.want) {
				t.Fatalf("stderr %q, want the no-shell hint with %q", got, tc.want)
			}
		})
	}
}
