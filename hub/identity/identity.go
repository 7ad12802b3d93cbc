// Package identity is the hub's own identity: its SSH host key and data
// directory secrets, the names its bastion and TLS certificates carry, and
// the SSH trust it publishes for `tether config ssh`.
package identity

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
)

// LoadOrCreateHostKey returns the hub's SSH host key kept in path (0600),
// making one on first start.
func LoadOrCreateHostKey(path string) (gossh.Signer, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		_, priv, err := ed25519.GenerateKey(rand.Reader)
		if err != nil {
			return nil, err
		}
		block, err := gossh.MarshalPrivateKey(priv, "tether hub host key")
		if err != nil {
			return nil, err
		}
		if err := pki.WriteFileAtomic(path, pem.EncodeToMemory(block), 0o600); err != nil {
			return nil, fmt.Errorf("hub: host key: %w", err)
		}
		return gossh.NewSignerFromKey(priv)
	}
	if err != nil {
		return nil, fmt.Errorf("hub: host key: %w", err)
	}
	signer, err := gossh.ParsePrivateKey(b)
	if err != nil {
		return nil, fmt.Errorf("hub: host key %s: %w", path, err)
	}
	return signer, nil
}

// IssueFunc signs a node certificate chain (leaf first).
type IssueFunc func(ctx context.Context, csrDER []byte, id pki.Identity, cn string, ttl time.Duration) (
	[]*x509.Certificate, error)

// OwnCAIssuer signs node certificates with the hub's own intermediate.
func OwnCAIssuer(c *ca.CA) IssueFunc {
	return func(_ context.Context, csrDER []byte, id pki.Identity, cn string, ttl time.Duration) (
		[]*x509.Certificate, error,
	) {
		cert, err := c.SignCSR(csrDER, id, cn, ttl)
		if err != nil {
			return nil, err
		}
		return []*x509.Certificate{cert, c.Intermediate()}, nil
	}
}

// LoadOrCreateSecret returns a 32-byte secret kept in path (0600).
func LoadOrCreateSecret(path string) (*[32]byte, error) {
	var key [32]byte
	b, err := os.ReadFile(path)
	switch {
	case err == nil && len(b) == len(key):
		copy(key[:], b)
		return &key, nil
	case err == nil:
		return nil, fmt.Errorf("hub: %s holds %d bytes, want %d; delete it to make a new one", path, len(b), len(key))
	case !errors.Is(err, os.ErrNotExist):
		return nil, fmt.Errorf("hub: %w", err)
	}
	if _, err := rand.Read(key[:]); err != nil {
		return nil, err
	}
	if err := pki.WriteFileAtomic(path, key[:], 0o600); err != nil {
		return nil, fmt.Errorf("hub: %w", err)
	}
	return &key, nil
}

// BastionNames are the host names the bastion's host certificate is valid
// for: the SSH listen host (unless a wildcard), the advertised hosts, this
// machine's name, the "tether-hub" alias `tether config ssh` uses, and the
// extras (the node suffix's alias, configured names).
func BastionNames(sshListen string, advertise, extra []string) []string {
	seen := map[string]bool{}
	var out []string
	add := func(h string) {
		if h != "" && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	add(BastionAlias)
	if host, _, err := net.SplitHostPort(sshListen); err == nil {
		if ip := net.ParseIP(host); ip == nil || !ip.IsUnspecified() {
			add(host)
		}
	}
	for _, a := range advertise {
		if host, _, err := net.SplitHostPort(a); err == nil {
			add(host)
		}
	}
	if h, err := os.Hostname(); err == nil {
		add(h)
	}
	for _, h := range extra {
		add(h)
	}
	return out
}

// BastionAlias is the host alias `tether config ssh` gives the bastion of
// a hub with the default node suffix; a hub with --node-suffix S is also
// certified as S-hub (BastionAliasFor), so each hub's ssh profile checks its
// own bastion by a name only that hub's host CA vouches for.
const BastionAlias = "tether-hub"

// BastionAliasFor is the bastion's alias for nodes named NAME.suffix.
func BastionAliasFor(suffix string) string { return suffix + "-hub" }

// TrustedKeys is an SSH CA as SSHTrust reads it.
type TrustedKeys interface{ TrustedKeys() []gossh.PublicKey }

// SSHTrust is what GET /v1/ssh/trust publishes: CA keys and where the
// bastion is, everything `tether config ssh` needs. suffix is the node name
// suffix.
func SSHTrust(sshAddr net.Addr, advertise []string, suffix string, hostCA, userCA TrustedKeys) apitype.SSHTrust {
	host, port, _ := net.SplitHostPort(sshAddr.String())
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
		if len(advertise) > 0 {
			host, _, _ = net.SplitHostPort(advertise[0])
		}
	}
	t := apitype.SSHTrust{
		Bastion:      net.JoinHostPort(host, port),
		BastionAlias: BastionAliasFor(suffix),
		NodeSuffix:   suffix,
	}
	for _, k := range hostCA.TrustedKeys() {
		t.HostCAs = append(t.HostCAs, strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k))))
	}
	for _, k := range userCA.TrustedKeys() {
		t.UserCAs = append(t.UserCAs, strings.TrimSpace(string(gossh.MarshalAuthorizedKey(k))))
	}
	return t
}

// ServingNames are the names and addresses the hub's TLS serving
// certificate carries besides pki.HubServerName, so clients that dial the
// hub by an address it is known under (curl, Prometheus) verify it without
// --resolve: the advertised hosts, the listen host, and for a wildcard
// listen address this machine's loopback names, host name and interface
// addresses.
func ServingNames(listen string, advertise []string) []string {
	seen := map[string]bool{pki.HubServerName: true}
	var out []string
	add := func(h string) {
		h = strings.TrimSuffix(strings.Trim(h, "[]"), ".")
		if h != "" && !seen[h] {
			seen[h] = true
			out = append(out, h)
		}
	}
	for _, a := range advertise {
		if host, _, err := net.SplitHostPort(a); err == nil {
			add(host)
		} else {
			add(a)
		}
	}
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return out
	}
	if ip := net.ParseIP(host); host != "" && (ip == nil || !ip.IsUnspecified()) {
		add(host)
		return out
	}
	add("localhost")
	add("127.0.0.1")
	add("::1")
	if h, err := os.Hostname(); err == nil {
		add(h)
	}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.IsGlobalUnicast() {
				add(n.IP.String())
			}
		}
	}
	return out
}
