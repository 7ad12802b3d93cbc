package edge

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"runtime"
	"strconv"
	"strings"

	"github.com/tether-dev/tether/internal/validate"
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

// DefaultLabelsFile is where the agent reads the labels it reports.
const DefaultLabelsFile = "/etc/tether/labels"

// maxLabelsFile bounds what is read of a labels file.
const maxLabelsFile = 64 << 10

// ReadLabels reads the labels a node reports about itself: KEY=VALUE lines
// (blank lines and lines starting with '#' are skipped), checked with the
// label rules every part of Tether shares. A missing file is no labels.
// The hub shows reported labels beside the ones it sets and never selects
// a node by them.
func ReadLabels(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("labels file: %w", err)
	}
	defer f.Close()
	return parseLabels(path, io.LimitReader(f, maxLabelsFile+1))
}

func parseLabels(path string, r io.Reader) (map[string]string, error) {
	out := map[string]string{}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 4096), maxLabelsFile+2) // a too long file is said so, not "token too long"
	read, line := 0, 0
	for sc.Scan() {
		line++
		read += len(sc.Bytes()) + 1
		if read > maxLabelsFile {
			return nil, fmt.Errorf("labels file %s: longer than %d bytes", path, maxLabelsFile)
		}
		text := strings.TrimSpace(sc.Text())
		if text == "" || strings.HasPrefix(text, "#") {
			continue
		}
		k, v, ok := strings.Cut(text, "=")
		if !ok {
			return nil, fmt.Errorf("labels file %s line %d: %q: want KEY=VALUE", path, line, text)
		}
		k, v = strings.TrimSpace(k), strings.TrimSpace(v)
		if _, dup := out[k]; dup {
			return nil, fmt.Errorf("labels file %s line %d: label %q given twice", path, line, k)
		}
		out[k] = v
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("labels file %s: %w", path, err)
	}
	if err := validate.Labels(out); err != nil {
		return nil, fmt.Errorf("labels file %s: %w", path, err)
	}
	return out, nil
}
