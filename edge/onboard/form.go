package onboard

import (
	"bufio"
	"context"
	"errors"
	"io"
)

// ErrAborted means the person left the form (ctrl+c, esc).
var ErrAborted = errors.New("onboard: aborted by the user; nothing was sent to the hub after the last step shown")

// Form is the interactive Prompter, with the current value as the default;
// what needs the hub (reachability) is checked after enter, and the
// question comes back with the reason until it passes. The agent binary
// asks with plain line prompts (prompt.go); built with -tags tui it shows
// a full-screen form per input instead (form_tui.go), whose terminal UI
// library is most of a megabyte the agent would otherwise carry on every
// node for one first-boot dialogue.
type Form struct {
	Ctx context.Context
	In  io.Reader
	Out io.Writer
	// Accessible uses plain line prompts instead of the full-screen form
	// (screen readers, dumb terminals: TERM=dumb); without the tui build
	// tag every prompt is a line prompt.
	Accessible bool

	rd lineReader // the line prompts' buffered input

	// size is the terminal's width and height for a form whose output is
	// not a terminal (tests); lastFrame is what the last question left on
	// the screen.
	size      [2]int
	lastFrame string
}

// lineReader is the buffered reader over the line prompts' input, kept
// across questions (a terminal may deliver several answers in one read).
type lineReader struct {
	src io.Reader
	br  *bufio.Reader
}

// ErrInputEnded means the input closed (ctrl+d, a pipe that ended) while a
// question was open.
var ErrInputEnded = errors.New(
	"onboard: the input ended before every question was answered; use --non-interactive with flags for scripts")
