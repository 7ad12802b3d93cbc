package e2e

import (
	"context"
	"os/exec"
	"time"
)

// execCommand is exec.Command with a deadline that cannot leak: the context
// is released by a timer after the deadline.
func execCommand(timeout time.Duration, bin string, args ...string) *exec.Cmd {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	time.AfterFunc(timeout+time.Second, cancel)
	return exec.CommandContext(ctx, bin, args...)
}
