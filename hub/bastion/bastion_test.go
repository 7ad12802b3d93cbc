package bastion

import (
	"errors"
	"testing"

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
	}
	for _, tc := range cases {
		node, h, err := Target(tc.host, tc.port, ".tether")
		if tc.refused {
			if !errors.Is(err, ErrNotANode) {
				t.Errorf("Target(%q, %d) = %q, %v; want ErrNotANode", tc.host, tc.port, node, err)
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
