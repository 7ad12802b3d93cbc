package edge

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"

	"github.com/tether-dev/tether/internal/validate"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// GatherFacts describes this machine (uplink.GatherFacts).
func GatherFacts() control.Facts { return uplink.GatherFacts() }

// ReadOSRelease reads os-release(5) at path (a missing file is an empty
// map); onboarding reads it under another root in its tests.
func ReadOSRelease(path string) map[string]string { return uplink.ReadOSRelease(path) }

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
