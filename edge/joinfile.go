package edge

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"os"
	"strings"
)

// DefaultJoinFile is where a package, an image build or cloud-init puts the
// join string for the agent's first start (`tether-edge run --join-file`).
// A file keeps the secret out of the process list and out of the unit.
const DefaultJoinFile = "/etc/tether-edge/join"

// ErrNoJoinString means an agent that has not joined a hub yet was given no
// join string to join with. `tether-edge run` exits with a status of its own
// for it, which the systemd unit does not restart on: a machine that was
// never given a join string would otherwise restart its agent every few
// seconds from every boot on.
var ErrNoJoinString = errors.New("no join string was given")

// NoJoinString is the error of an agent in stateDir that must join first
// and has no join string: it names where the agent looked and the commands
// that give it one. joinFile is the agent's --join-file ("" for none);
// unit is the systemd unit the agent runs in ("" for none), which the
// last command restarts (else it says to run the agent again). It matches
// ErrNotJoined and ErrNoJoinString.
func NoJoinString(stateDir, joinFile, unit string) error {
	if joinFile == "" {
		return fmt.Errorf("%w (no %s in %s) and %w (--join, TETHER_JOIN): create one on the hub with "+
			"`tether token create` and give it with --join or TETHER_JOIN",
			ErrNotJoined, configFile, stateDir, ErrNoJoinString)
	}
	again := "\nthen run this command again"
	if unit != "" {
		again = "\n  systemctl restart " + unit
	}
	return fmt.Errorf("%w (no %s in %s) and %w (--join, TETHER_JOIN, or a line in %s): "+
		"create one on the hub with `tether token create`, then, as root on this machine:\n"+
		"  install -D -m 0600 /dev/null %s\n"+
		"  echo 'JOIN_STRING' > %s%s",
		ErrNotJoined, configFile, stateDir, ErrNoJoinString, joinFile, joinFile, joinFile, again)
}

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
