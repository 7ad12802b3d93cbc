package runner

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"
)

// Client is one SSH connection to a node, reused across the steps of one
// job, with an SFTP session opened on first use. Its methods are safe for
// concurrent use; each Run opens its own session channel. Close it when the
// job is done.
type Client struct {
	r        *Runner
	node     string
	log      *slog.Logger
	ssh      *ssh.Client
	connDone chan struct{} // closed when the SSH connection has ended
	// wrap: commands run under the wrapper (see the package
	// documentation); false on edge/sshserver, which kills sessions itself.
	wrap bool

	mu     sync.Mutex // guards the following fields
	sftp   *sftp.Client
	closed bool
}

func newClient(r *Runner, node string, sc *ssh.Client) *Client {
	c := &Client{
		r:        r,
		node:     node,
		log:      r.log.With("node", node),
		ssh:      sc,
		connDone: make(chan struct{}),
		wrap:     string(sc.ServerVersion()) != embeddedServerVersion,
	}
	go func() {
		sc.Wait()
		close(c.connDone)
	}()
	return c
}

// Node returns the node name the client is connected to.
func (c *Client) Node() string { return c.node }

// Close closes the SFTP session and the connection. A command still running
// is killed by its wrapper (its stdin closes) or, on the embedded server,
// by the server when the connection ends. Close is idempotent.
func (c *Client) Close() error {
	c.mu.Lock()
	c.closed = true
	s := c.sftp
	c.sftp = nil
	c.mu.Unlock()
	if s != nil {
		s.Close()
	}
	err := c.ssh.Close()
	<-c.connDone
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}

// connLost reports whether the connection has ended, allowing the goroutine
// watching it a moment to notice: x/crypto closes the channels of a dead
// connection just before its Wait returns.
func (c *Client) connLost() bool {
	t := time.NewTimer(time.Second)
	defer t.Stop()
	select {
	case <-c.connDone:
		return true
	case <-t.C:
		return false
	}
}

// Run runs cmd on the node with stdout and stderr copied to the given
// writers (nil discards) and returns when the command has ended and all its
// output was written. A non-zero exit status is not an error: it is in
// Result.ExitCode. Errors are for what prevented a normal run: ErrInvalid,
// ErrTimeout or ErrCanceled (the command and everything it started was
// killed; Result says how it ended, usually ExitCode 137 and Signal
// "KILL"), ErrConnLost, ErrAuth (the node refused a session), or a failed
// script upload. stdout and stderr may be the same writer; writes to them
// are serialized. They must not block indefinitely: Run waits for them.
func (c *Client) Run(ctx context.Context, cmd Command, stdout, stderr io.Writer) (Result, error) {
	res := Result{ExitCode: -1}
	if err := cmd.validate(c.node); err != nil {
		return res, err
	}
	if err := ctx.Err(); err != nil {
		return res, ctxError(c.node, "run", err)
	}
	var script string
	if cmd.Script != nil {
		var err error
		script, err = c.uploadScript(ctx, cmd.Script)
		if err != nil {
			return res, err
		}
		// The wrapper removes it too; this covers a run that never
		// started. A connection that is gone cannot remove anything.
		defer c.removeScript(script)
	}
	return c.exec(ctx, c.line(script, cmd.argv(script)), stdout, stderr)
}

// line is the exec request's command line for argv: under the wrapper, or
// plain on the embedded server.
func (c *Client) line(removeFile string, argv []string) string {
	if c.wrap {
		return remoteLine(removeFile, argv)
	}
	return plainLine(argv)
}

// exec runs line in a new session channel; see the package documentation
// for how cancellation kills it.
func (c *Client) exec(ctx context.Context, line string, stdout, stderr io.Writer) (Result, error) {
	res := Result{ExitCode: -1}
	if err := ctx.Err(); err != nil {
		return res, ctxError(c.node, "command", err)
	}
	sess, err := c.newSession()
	if err != nil {
		return res, err
	}
	defer sess.Close()
	// Kept open, never written: its EOF is the wrapper's kill switch.
	stdin, err := sess.StdinPipe()
	if err != nil {
		return res, fmt.Errorf("runner: node %q: session stdin: %w", c.node, err)
	}
	defer stdin.Close()
	if stdout == nil {
		stdout = io.Discard
	}
	if stderr == nil {
		stderr = io.Discard
	}
	// x/crypto copies the two streams in two goroutines; one lock lets a
	// caller pass the same writer for both (combined output).
	var mu sync.Mutex
	sess.Stdout = &lockedWriter{mu: &mu, w: stdout}
	sess.Stderr = &lockedWriter{mu: &mu, w: stderr}

	if !c.wrap {
		// The embedded server then kills everything the command leaves in
		// its session when it ends, instead of only hanging it up.
		if _, err := sess.SendRequest(killOnEndRequest, true, nil); err != nil {
			return res, c.sessionError("start command", err)
		}
	}
	start := time.Now()
	if err := sess.Start(line); err != nil {
		return res, c.sessionError("start command", err)
	}
	if !c.wrap {
		// No wrapper to swap stdin for /dev/null: end-of-file now gives
		// the command the same empty stdin.
		_ = stdin.Close()
	}
	done := make(chan error, 1)
	go func() { done <- sess.Wait() }()

	var werr, ctxErr error
	select {
	case werr = <-done:
	case <-ctx.Done():
		select {
		case werr = <-done: // it ended anyway: report how
		default:
			ctxErr = ctx.Err()
			werr = c.kill(sess, stdin, done)
		}
	}
	res.Duration = time.Since(start)

	var exitErr *ssh.ExitError
	switch {
	case werr == nil:
		res.ExitCode = 0
	case errors.As(werr, &exitErr):
		res.ExitCode, res.Signal = exitErr.ExitStatus(), exitErr.Signal()
	}
	c.log.Debug("command ended", "exit", res.ExitCode, "signal", res.Signal, "took", res.Duration, "ctx_err", ctxErr)
	switch {
	case ctxErr != nil:
		return res, fmt.Errorf("%w; the command and its children were killed", ctxError(c.node, "command", ctxErr))
	case werr == nil || exitErr != nil:
		return res, nil
	case c.connLost():
		return res, fmt.Errorf(
			"runner: node %q: %w while the command ran (it is killed on the node when its session ends): %w",
			c.node, ErrConnLost, werr,
		)
	}
	return res, fmt.Errorf("runner: node %q: command: %w", c.node, werr)
}

// lockedWriter serializes writes to w with a lock shared by stdout and
// stderr.
type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// copyBufs backs lockedWriter.ReadFrom: x/crypto copies a session's stdout
// and stderr with io.Copy, which otherwise allocates 32 KiB for each, twice
// per command (a quarter of the hub's allocations in a fan-out of `true`,
// bench P6).
var copyBufs = sync.Pool{New: func() any { b := make([]byte, 32<<10); return &b }}

// ReadFrom copies r to the writer through a pooled buffer.
func (l *lockedWriter) ReadFrom(r io.Reader) (int64, error) {
	bp := copyBufs.Get().(*[]byte)
	defer copyBufs.Put(bp)
	return io.CopyBuffer(writerOnly{l}, r, *bp)
}

// writerOnly hides lockedWriter's ReadFrom from io.CopyBuffer, which would
// otherwise call it again.
type writerOnly struct{ io.Writer }

// kill ends a running session whose context is done and returns what Wait
// returned. Each step alone suffices for the wrapper to SIGKILL the
// command's process group; they are escalated in case the node (or the
// link to it) does not respond.
func (c *Client) kill(sess *ssh.Session, stdin io.Closer, done <-chan error) error {
	grace := c.r.cfg.KillGrace
	if c.wrap {
		_ = sess.Signal(ssh.SIGTERM) // the wrapper's trap
		_ = stdin.Close()            // the wrapper's watchdog
	} else {
		// The embedded server kills the rest of the session once its
		// process is gone.
		_ = sess.Signal(ssh.SIGKILL)
	}
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case err := <-done:
		return err
	case <-t.C:
	}
	c.log.Warn("command did not end after cancellation; closing its session", "grace", grace)
	_ = sess.Close()
	t.Reset(grace)
	select {
	case err := <-done:
		return err
	case <-t.C:
	}
	// The node does not even answer a channel close: the link is dead or
	// the node hung. Dropping the connection unblocks Wait and, if the
	// node is still there, makes sshd close the command's stdin.
	c.log.Warn("node did not close the session; closing the connection", "grace", grace)
	_ = c.ssh.Close()
	return <-done
}

// Session opens a session channel on the connection for a caller that
// drives it itself (the web console's terminal: a pty and a shell).
func (c *Client) Session() (*ssh.Session, error) { return c.newSession() }

// newSession opens a session channel, mapping refusals to sentinels.
func (c *Client) newSession() (*ssh.Session, error) {
	c.mu.Lock()
	closed := c.closed
	c.mu.Unlock()
	if closed {
		return nil, fmt.Errorf("runner: node %q: client is closed: %w", c.node, net.ErrClosed)
	}
	sess, err := c.ssh.NewSession()
	if err != nil {
		return nil, c.sessionError("open session", err)
	}
	return sess, nil
}

func (c *Client) sessionError(op string, err error) error {
	var oce *ssh.OpenChannelError
	switch {
	case errors.As(err, &oce) && oce.Reason == ssh.Prohibited:
		// edge/sshserver refuses sessions when the certificate does not
		// allow the login after all.
		return fmt.Errorf("runner: node %q: %s: %w: %w", c.node, op, ErrAuth, err)
	case c.connLost():
		return fmt.Errorf("runner: node %q: %s: %w: %w", c.node, op, ErrConnLost, err)
	}
	return fmt.Errorf("runner: node %q: %s: %w", c.node, op, err)
}

// sftpClient returns the SFTP session, opening it on first use (and again
// after a cancelled transfer closed it).
func (c *Client) sftpClient() (*sftp.Client, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil, fmt.Errorf("runner: node %q: client is closed: %w", c.node, net.ErrClosed)
	}
	if c.sftp != nil {
		return c.sftp, nil
	}
	s, err := sftp.NewClient(c.ssh, sftp.UseConcurrentWrites(true))
	if err != nil {
		return nil, c.sessionError("start SFTP (the node's SSH server needs the sftp subsystem)", err)
	}
	c.sftp = s
	return s, nil
}

// dropSFTP closes s, the SFTP session a cancelled operation was blocked on,
// so the operation returns; the next one opens a new session.
func (c *Client) dropSFTP(s *sftp.Client) {
	c.mu.Lock()
	if c.sftp == s {
		c.sftp = nil
	}
	c.mu.Unlock()
	s.Close()
}

// withSFTP runs f with the SFTP session, aborting it (by closing the
// session) if ctx ends first. The result is ctx's error in that case.
func (c *Client) withSFTP(ctx context.Context, op string, f func(*sftp.Client) error) error {
	if err := ctx.Err(); err != nil {
		return ctxError(c.node, op, err)
	}
	s, err := c.sftpClient()
	if err != nil {
		return err
	}
	stop := context.AfterFunc(ctx, func() { c.dropSFTP(s) })
	err = f(s)
	if !stop() {
		return fmt.Errorf("%w (%v)", ctxError(c.node, op, ctx.Err()), err)
	}
	if err != nil && (errors.Is(err, sftp.ErrSSHFxConnectionLost) || errors.Is(err, io.EOF)) && c.connLost() {
		return fmt.Errorf("runner: node %q: %s: %w: %w", c.node, op, ErrConnLost, err)
	}
	return err
}

// scriptDir is where scripts are uploaded. /tmp exists everywhere; the
// interpreter is named explicitly, so noexec does not matter.
const scriptDir = "/tmp"

// uploadScript writes script to a fresh file only the login user can read,
// created with O_EXCL so nothing already there (a planted symlink, say) is
// followed or reused.
func (c *Client) uploadScript(ctx context.Context, script []byte) (string, error) {
	var path string
	created := false
	err := c.withSFTP(ctx, "upload script", func(s *sftp.Client) error {
		var f *sftp.File
		var err error
		for range 3 { // a collision of 64 random bits is only a formality
			path = scriptDir + "/.tether-run-" + randomHex(8)
			f, err = s.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL)
			if !errors.Is(err, fs.ErrExist) {
				break
			}
		}
		if err != nil {
			return err
		}
		created = true
		// Still empty: tighten the mode before the content arrives.
		err = f.Chmod(0o700)
		if err == nil {
			_, err = f.Write(script)
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		return err
	})
	if err != nil {
		if created {
			c.removeScript(path)
		}
		if errors.Is(err, ErrTimeout) || errors.Is(err, ErrCanceled) || errors.Is(err, ErrConnLost) {
			return "", err // already names the node and the operation
		}
		return "", fmt.Errorf("runner: node %q: upload script to %s: %w", c.node, scriptDir, err)
	}
	return path, nil
}

// removeScript removes an uploaded script after its run. The wrapper has
// usually done it already.
func (c *Client) removeScript(path string) {
	ctx, cancel := context.WithTimeout(context.Background(), c.r.cfg.KillGrace)
	defer cancel()
	err := c.withSFTP(ctx, "remove script", func(s *sftp.Client) error { return s.Remove(path) })
	if err != nil && !errors.Is(err, fs.ErrNotExist) && !errors.Is(err, ErrConnLost) {
		c.log.Warn("could not remove uploaded script", "path", path, "err", err)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b) // never fails (crypto/rand panics instead)
	return hex.EncodeToString(b)
}
