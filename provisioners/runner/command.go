package runner

import (
	"bytes"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/tether-dev/tether/internal/validate"
)

// Command is what Run executes. Exactly one of Line and Script is set. The
// command runs as the login user in its home directory (as sshd and
// edge/sshserver start sessions), with stdin from /dev/null.
type Command struct {
	// Line is a shell command line, run with /bin/sh -c.
	Line string
	// Script is a script, uploaded to a fresh temporary file and run by
	// the interpreter its #! line names (with its optional argument, as
	// the kernel would), or by /bin/sh without one.
	Script []byte
	// Env is added to the command's environment. Names must pass
	// validate.EnvName ([A-Za-z_][A-Za-z0-9_]*); values must not contain NUL.
	Env map[string]string
}

// Result is how a command ended.
type Result struct {
	// ExitCode is the command's exit status; 128+n if it was killed by
	// signal n (a killed step typically reports 137, SIGKILL); -1 if the
	// node reported no status (the connection was lost).
	ExitCode int
	// Signal is the RFC 4254 name ("KILL", "TERM", ...) of the signal
	// that killed the command's wrapper, if the node reported one. A
	// timed-out or cancelled Run usually has "KILL".
	Signal string
	// Duration is the time from starting the command to its end.
	Duration time.Duration
}

// wrapper is the shell program every command runs under; see the package
// documentation for why. $1 is a file to remove when done ("" for none),
// the remaining arguments are the command's argv. It is written for any
// POSIX sh (dash, bash, busybox ash) and uses only builtins plus rm.
//
//   - fd 3 keeps the channel's stdin (the hub never writes to it); the
//     wrapper's own stdin becomes /dev/null.
//   - The watchdog subshell reads fd 3 until EOF, then removes the script
//     and SIGKILLs the process group (kill 0). Subshells reset caught traps,
//     so a TERM to the group simply ends it. Its stdout and stderr go to
//     /dev/null so it never holds the channel open.
//   - The command runs in the background without fd 3; an asynchronous
//     list gets stdin from /dev/null.
//   - wait returns early when a trapped signal arrives, and the trap kills
//     the group, this shell included. Its stderr is silenced because dash
//     reports a job killed by a signal ("Terminated") there, which is not
//     the command's output.
const wrapper = `f=$1
shift
exec 3<&0 </dev/null
trap '[ -z "$f" ] || rm -f -- "$f"; kill -KILL 0' HUP INT TERM
(
	while read -r l; do :; done
	[ -z "$f" ] || rm -f -- "$f"
	kill -KILL 0
) <&3 >/dev/null 2>&1 &
"$@" 3<&- &
wait "$!" 2>/dev/null
s=$?
[ -z "$f" ] || rm -f -- "$f"
exit "$s"`

// wrapperArg0 is $0 of the wrapper shell, visible in ps on the node.
const wrapperArg0 = "tether-run"

// shellQuote quotes s as one word for any POSIX shell.
func shellQuote(s string) string {
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}

// remoteLine builds the line sent in the exec request: the wrapper started
// with exec (so it is the session's process, the one sshd signals) and
// given removeFile and argv as quoted words. Every argument was checked for
// NUL by the caller.
func remoteLine(removeFile string, argv []string) string {
	var b strings.Builder
	b.WriteString("exec /bin/sh -c ")
	b.WriteString(shellQuote(wrapper))
	b.WriteString(" " + wrapperArg0 + " ")
	b.WriteString(shellQuote(removeFile))
	for _, a := range argv {
		b.WriteByte(' ')
		b.WriteString(shellQuote(a))
	}
	return b.String()
}

// embeddedServerVersion is the SSH version string of edge/sshserver, the
// agent's embedded server. Asked with killOnEndRequest, it kills a
// session's whole process tree itself (when the session's process exits,
// when the channel closes and when the connection drops) and delivers a "signal" request to the session's
// process, so the wrapper would only add processes there: a node's step
// then costs one process instead of three.
const embeddedServerVersion = "SSH-2.0-Tether"

// killOnEndRequest is edge/sshserver.KillOnEndRequest: without it the
// embedded server only hangs up what a session leaves behind (as sshd
// does), so nohup'ed leftovers of a step would survive it.
const killOnEndRequest = "kill-on-end@tether.dev"

// plainLine is the exec line for the embedded server: argv as quoted words
// after exec, so the login shell replaces itself with the command.
func plainLine(argv []string) string {
	var b strings.Builder
	b.WriteString("exec")
	for _, a := range argv {
		b.WriteByte(' ')
		b.WriteString(shellQuote(a))
	}
	return b.String()
}

// validate checks cmd without contacting the node.
func (cmd *Command) validate(node string) error {
	switch {
	case cmd.Line == "" && cmd.Script == nil:
		return fmt.Errorf("runner: node %q: Command has neither Line nor Script: %w", node, ErrInvalid)
	case cmd.Line != "" && cmd.Script != nil:
		return fmt.Errorf("runner: node %q: Command has both Line and Script; set one: %w", node, ErrInvalid)
	case strings.IndexByte(cmd.Line, 0) >= 0:
		return fmt.Errorf("runner: node %q: command line contains a NUL byte: %w", node, ErrInvalid)
	}
	for name, value := range cmd.Env {
		if err := validate.EnvName(name); err != nil {
			return fmt.Errorf("runner: node %q: %w: %w", node, err, ErrInvalid)
		}
		if strings.IndexByte(value, 0) >= 0 {
			return fmt.Errorf("runner: node %q: environment variable %s contains a NUL byte: %w", node, name, ErrInvalid)
		}
	}
	if cmd.Script != nil {
		if _, _, err := interpreter(cmd.Script); err != nil {
			return fmt.Errorf("runner: node %q: %w", node, err)
		}
	}
	return nil
}

// argv is the command's argument vector on the node; scriptPath is where
// the script was uploaded (Script only).
func (cmd *Command) argv(scriptPath string) []string {
	var argv []string
	if len(cmd.Env) > 0 {
		// env(1) rather than "env" channel requests, which sshd drops
		// unless AcceptEnv lists the name. Sorted for a stable line.
		argv = append(argv, "env")
		for _, name := range slices.Sorted(maps.Keys(cmd.Env)) {
			argv = append(argv, name+"="+cmd.Env[name])
		}
	}
	if cmd.Script == nil {
		return append(argv, "/bin/sh", "-c", cmd.Line)
	}
	interp, arg, _ := interpreter(cmd.Script)
	argv = append(argv, interp)
	if arg != "" {
		argv = append(argv, arg)
	}
	return append(argv, scriptPath)
}

// maxShebang is how much of a #! line is honoured, like Linux's
// BINPRM_BUF_SIZE.
const maxShebang = 256

// interpreter parses the script's #! line the way the kernel does (the
// interpreter, then everything after the first blank as one optional
// argument) and returns /bin/sh without one. The script is handed to the
// interpreter explicitly rather than executed, so a noexec /tmp does not
// matter.
func interpreter(script []byte) (interp, arg string, err error) {
	if !bytes.HasPrefix(script, []byte("#!")) {
		return "/bin/sh", "", nil
	}
	line := script[2:]
	if i := bytes.IndexByte(line, '\n'); i >= 0 {
		line = line[:i]
	}
	if len(line) > maxShebang {
		return "", "", fmt.Errorf("script's #! line is longer than %d bytes: %w", maxShebang, ErrInvalid)
	}
	s := strings.TrimRight(strings.TrimLeft(string(line), " \t"), " \t\r")
	if strings.IndexByte(s, 0) >= 0 {
		return "", "", fmt.Errorf("script's #! line contains a NUL byte: %w", ErrInvalid)
	}
	interp = s
	if i := strings.IndexAny(s, " \t"); i >= 0 {
		interp, arg = s[:i], strings.Trim(s[i+1:], " \t")
	}
	if interp == "" {
		return "/bin/sh", "", nil
	}
	return interp, arg, nil
}
