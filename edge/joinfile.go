package edge

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strings"
)

// DefaultJoinFile is where a package, an image build or cloud-init puts the
// join string for the agent's first start (`tether-edge run --join-file`).
// A file keeps the secret out of the process list and out of the unit.
const DefaultJoinFile = "/etc/tether-edge/join"

// ReadJoinFile returns the join string held in path: its first line that is
// neither blank nor a # comment, trimmed. A missing file is an error that
// matches fs.ErrNotExist, so that callers can treat "not configured" apart
// from "unreadable"; a file with no join string in it is an error naming
// the file.
func ReadJoinFile(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("join file: %w", err)
	}
	return parseJoinFile(path, b)
}

func parseJoinFile(path string, b []byte) (string, error) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 64<<10)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		return line, nil
	}
	if err := sc.Err(); err != nil {
		return "", fmt.Errorf("join file %s: %w", path, err)
	}
	return "", fmt.Errorf("join file %s holds no join string (put the line `tether token create` printed into it)", path)
}
