package uplink

import (
	"bufio"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/tunnel/control"
)

// GatherFacts describes this machine: hostname, OS (from /etc/os-release),
// architecture, machine id and the management interface (the default
// route's). Missing sources leave fields empty.
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
	f.Interface, f.Address, f.MAC = managementInterface()
	for _, p := range []*string{&f.Hostname, &f.OS, &f.OSID, &f.OSVersion, &f.MachineID, &f.Interface} {
		if len(*p) > 200 {
			*p = (*p)[:200]
		}
	}
	return f
}

// ReadOSRelease reads os-release(5) at path (a missing file is an empty
// map); onboarding reads it under another root in its tests.
func ReadOSRelease(path string) map[string]string { return readOSRelease(path) }

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
