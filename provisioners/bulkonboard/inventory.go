package bulkonboard

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/internal/validate"
)

// ErrInventory is wrapped by every inventory parse error.
var ErrInventory = errors.New("bulkonboard: invalid inventory")

// Host is one machine of the inventory.
type Host struct {
	// Line is the inventory line it came from (1-based), for messages.
	Line int
	// User is the SSH login; "" means the caller's default (--ssh-user).
	User string
	// Host is a DNS name or an IP address (IPv6 without brackets).
	Host string
	// Port is the SSH port (22 when the line names none).
	Port int
	// Labels are asked for at onboarding (tether-edge onboard --labels),
	// in the order the line gives them: the machine's reported labels,
	// written to its labels file. The hub's labels come from the
	// credential.
	Labels []Label
}

// Label is one KEY=VALUE label.
type Label struct{ Key, Value string }

// Addr is HOST:PORT for dialing and for known_hosts.
func (h Host) Addr() string { return net.JoinHostPort(h.Host, strconv.Itoa(h.Port)) }

// String is the host as the inventory names it: [USER@]HOST[:PORT].
func (h Host) String() string {
	s := h.Host
	if strings.Contains(s, ":") {
		s = "[" + s + "]"
	}
	if h.Port != 22 {
		s += ":" + strconv.Itoa(h.Port)
	}
	if h.User != "" {
		s = h.User + "@" + s
	}
	return s
}

// maxInventoryLine bounds one inventory line; a longer one is an error, not
// a truncation.
const maxInventoryLine = 64 << 10

// ParseInventory reads an inventory: one machine per line,
//
//	[USER@]HOST[:PORT] [KEY=VALUE...]
//
// with an IPv6 address in brackets when a port follows ([2001:db8::1]:2222),
// blank lines, and comments from # to the end of a line. It reports every
// bad line (with its number), not only the first, and a machine listed twice
// (same user, host and port).
func ParseInventory(r io.Reader) ([]Host, error) {
	var hosts []Host
	var errs []error
	seen := map[string]int{}
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, maxInventoryLine)
	n := 0
	for sc.Scan() {
		n++
		line, _, _ := strings.Cut(sc.Text(), "#")
		fields := strings.Fields(line)
		if len(fields) == 0 {
			continue
		}
		h, err := parseHostLine(n, fields)
		if err != nil {
			errs = append(errs, fmt.Errorf("line %d: %w", n, err))
			continue
		}
		key := h.User + "@" + h.Addr()
		if first, dup := seen[key]; dup {
			errs = append(errs, fmt.Errorf("line %d: %s is already listed on line %d", n, h, first))
			continue
		}
		seen[key] = n
		hosts = append(hosts, h)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("after line %d: %w", n, err))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInventory, errors.Join(errs...))
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("%w: no hosts in it (one [USER@]HOST[:PORT] [KEY=VALUE...] per line)", ErrInventory)
	}
	return hosts, nil
}

func parseHostLine(n int, fields []string) (Host, error) {
	h := Host{Line: n, Port: 22}
	target := fields[0]
	if user, rest, ok := strings.Cut(target, "@"); ok {
		if err := validate.Login(user); err != nil {
			return h, fmt.Errorf("user in %q: %w", target, err)
		}
		h.User, target = user, rest
	}
	host, port, err := splitHostPort(target)
	if err != nil {
		return h, fmt.Errorf("%q: %w", fields[0], err)
	}
	h.Host, h.Port = host, port
	keys := map[string]bool{}
	for _, kv := range fields[1:] {
		k, v, ok := strings.Cut(kv, "=")
		if !ok {
			return h, fmt.Errorf("%q: want KEY=VALUE labels after the host", kv)
		}
		if err := validate.LabelKey(k); err != nil {
			return h, fmt.Errorf("label %q: %w", kv, err)
		}
		if err := validate.LabelValue(v); err != nil {
			return h, fmt.Errorf("label %q: %w", kv, err)
		}
		if keys[k] {
			return h, fmt.Errorf("label %q given twice", k)
		}
		keys[k] = true
		h.Labels = append(h.Labels, Label{k, v})
	}
	return h, nil
}

// splitHostPort accepts HOST, HOST:PORT, an IPv6 address alone, and
// [IPV6]:PORT.
func splitHostPort(s string) (string, int, error) {
	host, port := s, ""
	switch {
	case strings.HasPrefix(s, "["):
		end := strings.Index(s, "]")
		if end < 0 {
			return "", 0, errors.New("unclosed [ of an IPv6 address")
		}
		host, port = s[1:end], strings.TrimPrefix(s[end+1:], ":")
		if s[end+1:] != "" && !strings.HasPrefix(s[end+1:], ":") {
			return "", 0, errors.New("want [IPV6]:PORT")
		}
		if _, err := netip.ParseAddr(host); err != nil || !strings.Contains(host, ":") {
			return "", 0, fmt.Errorf("%q in brackets is not an IPv6 address", host)
		}
	case strings.Count(s, ":") > 1:
		if _, err := netip.ParseAddr(s); err != nil {
			return "", 0, errors.New("not an IPv6 address (put it in brackets to give a port: [2001:db8::1]:2222)")
		}
	case strings.Contains(s, ":"):
		host, port, _ = strings.Cut(s, ":")
	}
	p := 22
	if port != "" || strings.HasSuffix(s, ":") {
		v, err := strconv.Atoi(port)
		if err != nil || v < 1 || v > 65535 || port != strconv.Itoa(v) {
			return "", 0, fmt.Errorf("port %q: want 1-65535", port)
		}
		p = v
	}
	if err := checkHostName(host); err != nil {
		return "", 0, err
	}
	return host, p, nil
}

// checkHostName accepts an IP address or a DNS name (letters, digits, -
// and . ; labels of at most 63 characters, 253 in all).
func checkHostName(s string) error {
	if _, err := netip.ParseAddr(s); err == nil {
		return nil
	}
	if s == "" || len(s) > 253 {
		return errors.New("empty or overlong host name")
	}
	for _, label := range strings.Split(strings.TrimSuffix(s, "."), ".") {
		if label == "" || len(label) > 63 || label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("host %q: not a DNS name or IP address", s)
		}
		if i := slices.IndexFunc([]byte(label), func(c byte) bool {
			return !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_')
		}); i >= 0 {
			return fmt.Errorf("host %q: character %q is not allowed in a host name", s, label[i])
		}
	}
	return nil
}
