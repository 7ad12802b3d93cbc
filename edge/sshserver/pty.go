package sshserver

import (
	"fmt"
	"io"
	"math"
	"os"
	"os/exec"
	"sync"
	"syscall"

	"github.com/creack/pty"
	"github.com/gliderlabs/ssh"
	"golang.org/x/sys/unix"
)

// runPTY runs cmd on a new pseudo-terminal whose size follows the client's
// window changes. The terminal is the process's controlling terminal, so
// job control and ^C work as on a real login.
func (s *Server) runPTY(sctx *sessionContext, cmd *exec.Cmd, req ssh.Pty) exitResult {
	proc := &sctx.proc
	ch := sctx.rawChannel()
	master, tty, err := openPTY()
	if err != nil {
		return startFailed(ch.Stderr(), "\r\n", err)
	}
	setWinsize(master, req.Window)
	if req.Term != "" {
		cmd.Env = append(cmd.Env, "TERM="+req.Term)
	}
	cmd.Env = append(cmd.Env, "SSH_TTY="+tty.Name())
	cmd.Stdin, cmd.Stdout, cmd.Stderr = tty, tty, tty
	// Ctty 0 is the child's stdin, the terminal.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
	err = cmd.Start()
	tty.Close()
	if err != nil {
		master.Close()
		return startFailed(ch.Stderr(), "\r\n", err)
	}
	proc.setPTY(master)
	defer func() {
		proc.setPTY(nil)
		master.Close()
	}()
	// Client EOF on a terminal session is not passed on: there is no
	// "close stdin" for a terminal, and sshd does not hang up either.
	sctx.state.tasks.goTracked(func() { io.Copy(master, ch) })
	var out sync.WaitGroup
	out.Add(1)
	go func() {
		defer out.Done()
		// Ends with EIO once no process holds the terminal any more.
		io.Copy(ch, master)
	}()
	res := supervise(sctx, cmd, true)
	drainOutput(sctx, &out, master)
	return res
}

// openPTY opens a pseudo-terminal pair. creack/pty leaves the master in
// blocking mode (its ioctls go through File.Fd), where Close cannot
// interrupt a pending Read. The master is duplicated into a non-blocking
// descriptor that the runtime poller manages, so closing it always ends the
// output copy, even if some escaped process still holds the terminal.
func openPTY() (master, tty *os.File, err error) {
	m, t, err := pty.Open()
	if err != nil {
		return nil, nil, fmt.Errorf("open pty: %w", err)
	}
	fd, err := unix.FcntlInt(m.Fd(), unix.F_DUPFD_CLOEXEC, 0)
	m.Close()
	if err != nil {
		t.Close()
		return nil, nil, fmt.Errorf("dup pty master: %w", err)
	}
	if err := unix.SetNonblock(fd, true); err != nil {
		unix.Close(fd)
		t.Close()
		return nil, nil, fmt.Errorf("pty master non-blocking: %w", err)
	}
	return os.NewFile(uintptr(fd), "/dev/ptmx"), t, nil
}

// setWinsize resizes the terminal. It goes through SyscallConn rather than
// Fd so the master stays non-blocking, and fails harmlessly once closed.
func setWinsize(master *os.File, w ssh.Window) error {
	rc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	ws := &unix.Winsize{Row: clampUint16(w.Height), Col: clampUint16(w.Width)}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, ws)
	}); err != nil {
		return err
	}
	return ierr
}

func clampUint16(n int) uint16 {
	return uint16(min(max(n, 0), math.MaxUint16))
}
