package pki

import (
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
)

// JoinString is everything a new node needs to join a hub securely:
//
//	tether://ID.SECRET@host1:7443,host2:7443?ca=sha256:<64 hex>
//
// The pin is the SHA-256 of the hub root CA certificate; the agent refuses a
// hub whose chain does not contain that certificate, so joining is never
// trust-on-first-use.
type JoinString struct {
	Addrs []string // hub host:port list, tried in order
	Token string   // ID.SECRET
	CAPin string   // lowercase hex SHA-256 of the root CA certificate
}

// ErrBadJoinString is returned for any malformed join string.
var ErrBadJoinString = errors.New("invalid join string")

const maxJoinStringLen = 4096

// String encodes the join string.
func (j JoinString) String() string {
	u := url.URL{Scheme: "tether", User: url.User(j.Token), Host: strings.Join(j.Addrs, ","),
		RawQuery: "ca=sha256:" + j.CAPin}
	return u.String()
}

// ParseJoinString decodes and validates a join string.
func ParseJoinString(s string) (JoinString, error) {
	s = strings.TrimSpace(s)
	if len(s) > maxJoinStringLen {
		return JoinString{}, fmt.Errorf("%w: longer than %d bytes", ErrBadJoinString, maxJoinStringLen)
	}
	const prefix = "tether://"
	if !strings.HasPrefix(s, prefix) {
		return JoinString{}, fmt.Errorf(
			"%w: must start with %q (copy it whole from `tether token create`)",
			ErrBadJoinString, prefix,
		)
	}
	// net/url rejects comma-separated hosts with ports, so split by hand.
	rest := s[len(prefix):]
	auth, rest, ok := strings.Cut(rest, "@")
	if !ok {
		return JoinString{}, fmt.Errorf("%w: missing token", ErrBadJoinString)
	}
	hosts, query, _ := strings.Cut(rest, "?")
	hosts = strings.TrimSuffix(hosts, "/")
	if _, _, err := SplitToken(auth); err != nil {
		return JoinString{}, fmt.Errorf("%w: %v", ErrBadJoinString, err)
	}
	j := JoinString{Token: auth}
	for _, h := range strings.Split(hosts, ",") {
		if err := ValidateHubAddr(h); err != nil {
			return JoinString{}, fmt.Errorf("%w: hub address %q: %v", ErrBadJoinString, h, err)
		}
		j.Addrs = append(j.Addrs, h)
	}
	q, err := url.ParseQuery(query)
	if err != nil {
		return JoinString{}, fmt.Errorf("%w: %v", ErrBadJoinString, err)
	}
	pin, ok := strings.CutPrefix(q.Get("ca"), "sha256:")
	if !ok {
		return JoinString{}, fmt.Errorf("%w: missing ca=sha256:<pin>", ErrBadJoinString)
	}
	if b, err := hex.DecodeString(pin); err != nil || len(b) != 32 || strings.ToLower(pin) != pin {
		return JoinString{}, fmt.Errorf("%w: ca pin must be 64 lowercase hex characters", ErrBadJoinString)
	}
	j.CAPin = pin
	return j, nil
}

// ValidateHubAddr checks a hub address as join strings and node configs
// carry it: HOST:PORT, the host an IP address without a zone or a DNS name.
func ValidateHubAddr(hp string) error {
	host, port, err := net.SplitHostPort(hp)
	if err != nil {
		return err
	}
	if host == "" {
		return errors.New("empty host")
	}
	if err := validateHost(host); err != nil {
		return err
	}
	p, err := strconv.Atoi(port)
	if err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("port %q out of range", port)
	}
	return nil
}

// validateHost accepts an IP address without a zone (a zone names an
// interface of one machine, meaningless to a node elsewhere) or a DNS name:
// dot-separated labels of letters, digits and inner hyphens, 1 to 63
// bytes each, 253 in all.
func validateHost(host string) error {
	if a, err := netip.ParseAddr(host); err == nil {
		if a.Zone() != "" {
			return errors.New("an IPv6 zone (%...) cannot be used in a join string; give a routable address or a name")
		}
		return nil
	}
	if len(host) > 253 {
		return errors.New("host name longer than 253 bytes")
	}
	for _, label := range strings.Split(strings.TrimSuffix(host, "."), ".") {
		if len(label) == 0 || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("host %q is neither an IP address nor a DNS name (empty, too long or hyphen-edged label)", host)
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("host %q is neither an IP address nor a DNS name (character %q)", host, c)
			}
		}
	}
	return nil
}
