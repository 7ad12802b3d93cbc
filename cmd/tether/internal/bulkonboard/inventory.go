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
	// Name is the node name asked for (tether-edge onboard --name): the
	// line's name=NAME, else what NameHosts made of --name-pattern; ""
	// lets the hub name the node after the machine's host name.
	Name string
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

// NameField is the inventory field that names a host's node (name=NODE):
// a field of the line, not a label the machine reports.
const NameField = "name"

// ParseInventory reads an inventory: one machine per line,
//
//	[USER@]HOST[:PORT] [name=NODE] [KEY=VALUE...]
//
// with an IPv6 address in brackets when a port follows ([2001:db8::1]:2222),
// blank lines, and comments from # to the end of a line. It reports every
// bad line (with its number), not only the first, a machine listed twice
// (same user, host and port) and a node name asked for twice.
func ParseInventory(r io.Reader) ([]Host, error) {
	var hosts []Host
	var errs []error
	seen := map[string]int{}
	names := map[string]int{}
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
		if first, dup := names[h.Name]; dup && h.Name != "" {
			errs = append(errs, fmt.Errorf("line %d: node name %q is already asked for on line %d", n, h.Name, first))
			continue
		}
		seen[key], names[h.Name] = n, n
		hosts = append(hosts, h)
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("after line %d: %w", n, err))
	}
	if len(errs) > 0 {
		return nil, fmt.Errorf("%w: %w", ErrInventory, errors.Join(errs...))
	}
	if len(hosts) == 0 {
		return nil, fmt.Errorf("%w: no hosts in it (one [USER@]HOST[:PORT] [name=NODE] [KEY=VALUE...] per line)",
			ErrInventory)
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
			return h, fmt.Errorf("%q: want name=NODE and KEY=VALUE labels after the host", kv)
		}
		if k == NameField {
			if h.Name != "" {
				return h, fmt.Errorf("%s= given twice", NameField)
			}
			if err := validate.NodeName(v); err != nil {
				return h, fmt.Errorf("%q: node %w", kv, err)
			}
			h.Name = v
			continue
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

// NameHosts names, from pattern, every host whose line asks for no name:
// {n} is the host's position in the inventory (1, 2, …), {host} its HOST
// lowercased with every character a node name cannot hold turned into '-'
// (10.0.0.7 → 10-0-0-7, shop-8.example → shop-8-example). Every name must
// be a valid node name and no two hosts may ask for the same one; the
// error names each line that fails. An empty pattern names no host (the
// hub then names each node after the machine's host name).
func NameHosts(hosts []Host, pattern string) error {
	if pattern == "" {
		return nil
	}
	if !strings.Contains(pattern, "{n}") && !strings.Contains(pattern, "{host}") && len(hosts) > 1 {
		return fmt.Errorf(
			"--name-pattern %q: give every host its own name with {n} (its position) or {host} (its address)",
			pattern,
		)
	}
	var errs []error
	names := map[string]int{}
	for _, h := range hosts {
		if h.Name != "" {
			names[h.Name] = h.Line
		}
	}
	for i := range hosts {
		h := &hosts[i]
		if h.Name != "" {
			continue
		}
		name := strings.NewReplacer("{n}", strconv.Itoa(i+1), "{host}", hostLabel(h.Host)).Replace(pattern)
		if err := validate.NodeName(name); err != nil {
			errs = append(errs, fmt.Errorf("line %d: --name-pattern %q gives node %w; put name=NODE on the line",
				h.Line, pattern, err))
			continue
		}
		if first, dup := names[name]; dup {
			errs = append(errs, fmt.Errorf("line %d: --name-pattern %q gives node name %q, already that of line %d",
				h.Line, pattern, name, first))
			continue
		}
		names[name], h.Name = h.Line, name
	}
	if len(errs) > 0 {
		return fmt.Errorf("%w: %w", ErrInventory, errors.Join(errs...))
	}
	return nil
}

// hostLabel is host as a part of a node name: lowercase letters, digits
// and inner dashes.
func hostLabel(host string) string {
	b := []byte(strings.ToLower(host))
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			b[i] = '-'
		}
	}
	return strings.Trim(string(b), "-")
}
