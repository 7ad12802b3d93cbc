package edge

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/tunnel/control"
)

// GatherFacts describes this machine: hostname, OS (from /etc/os-release),
// architecture and machine id. Missing sources leave fields empty.
func GatherFacts() control.Facts {
	f := control.Facts{Arch: runtime.GOARCH}
	f.Hostname, _ = os.Hostname()
	osr := readOSRelease("/etc/os-release")
	if len(osr) == 0 {
		osr = readOSRelease("/usr/lib/os-release")
	}
	f.OS, f.OSID, f.OSVersion = osr["PRETTY_NAME"], osr["ID"], osr["VERSION_ID"]
	if f.OS == "" {
		f.OS = runtime.GOOS
	}
	if b, err := os.ReadFile("/etc/machine-id"); err == nil {
		f.MachineID = strings.TrimSpace(string(b))
	}
	for _, p := range []*string{&f.Hostname, &f.OS, &f.OSID, &f.OSVersion, &f.MachineID} {
		if len(*p) > 200 {
			*p = (*p)[:200]
		}
	}
	return f
}

// readOSRelease parses os-release(5): KEY=value lines, values optionally quoted.
func readOSRelease(path string) map[string]string {
	out := map[string]string{}
	f, err := os.Open(path)
	if err != nil {
		return out
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		k, v, ok := strings.Cut(line, "=")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		if uq, err := strconv.Unquote(v); err == nil {
			v = uq
		} else {
			v = strings.Trim(v, `'"`)
		}
		out[k] = v
	}
	return out
}

// DefaultName derives a node name from the hostname: lowercased, invalid
// characters replaced by dashes, cut to 63 characters.
func DefaultName() string {
	h, _ := os.Hostname()
	h, _, _ = strings.Cut(strings.ToLower(h), ".")
	var b strings.Builder
	for _, r := range h {
		if (r >= 'a' && r <= 'z') || (r >= '0' && r <= '9') {
			b.WriteRune(r)
		} else {
			b.WriteByte('-')
		}
	}
	name := strings.Trim(b.String(), "-")
	if len(name) > 63 {
		name = strings.Trim(name[:63], "-")
	}
	if name == "" {
		name = "node"
	}
	return name
}
