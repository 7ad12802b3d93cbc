package runner

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"strings"

	"github.com/pkg/sftp"
)

// UploadOptions tune Upload.
type UploadOptions struct {
	// Mode is the file's mode: permission bits plus optionally
	// os.ModeSetuid, os.ModeSetgid, os.ModeSticky. Zero means 0644.
	Mode os.FileMode
	// MkdirParents creates missing parent directories (mode 0755 before
	// the umask). Without it a missing parent is an error wrapping
	// fs.ErrNotExist.
	MkdirParents bool
}

// Upload copies exactly size bytes from src to dst, an absolute path on the
// node, and returns their SHA-256 in hex. The data goes to a temporary file
// in dst's directory, whose SHA-256 the node computes (sha256sum, shasum or
// openssl over the same connection) and which is renamed over dst only if
// it matches what was sent (else ErrChecksum): dst is never partial, and if
// anything fails it is left as it was and the temporary file is removed
// (unless the connection itself is gone). The file is owned by the login
// user; an existing dst's owner and mode are not kept.
func (c *Client) Upload(ctx context.Context, src io.Reader, size int64, dst string, opt UploadOptions) (string, error) {
	if err := checkPath(c.node, dst); err != nil {
		return "", err
	}
	if dst == "/" {
		return "", fmt.Errorf("runner: node %q: upload destination %q is a directory: %w", c.node, dst, ErrBadPath)
	}
	if size < 0 {
		return "", fmt.Errorf("runner: node %q: upload to %s: negative size %d: %w", c.node, dst, size, ErrInvalid)
	}
	mode := opt.Mode & (fs.ModePerm | fs.ModeSetuid | fs.ModeSetgid | fs.ModeSticky)
	if opt.Mode == 0 {
		mode = 0o644
	}
	if mode != opt.Mode && opt.Mode != 0 {
		return "", fmt.Errorf(
			"runner: node %q: upload to %s: mode %v is not a plain file mode: %w",
			c.node, dst, opt.Mode, ErrInvalid,
		)
	}

	dir, base := path.Split(dst)
	dir = path.Clean(dir)
	// Hidden, recognisable, unique; short enough for any NAME_MAX.
	if len(base) > 64 {
		base = base[:64]
	}
	tmp := path.Join(dir, "."+base+".tether-"+randomHex(6)+".tmp")

	created := false
	var sum string
	err := c.withSFTP(ctx, "upload "+dst, func(s *sftp.Client) error {
		if opt.MkdirParents {
			if err := s.MkdirAll(dir); err != nil {
				return fmt.Errorf("create parent directory %s: %w", dir, err)
			}
		}
		f, err := s.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL)
		if errors.Is(err, fs.ErrNotExist) {
			return fmt.Errorf(
				"parent directory %s does not exist on the node; create it first (tether run -- mkdir -p %s): %w",
				dir, dir, err,
			)
		}
		if err != nil {
			return fmt.Errorf("create temporary file %s: %w", tmp, err)
		}
		created = true
		sum, err = writeFile(ctx, f, src, size, mode)
		return err
	})
	if err == nil {
		err = c.verifyAndRename(ctx, tmp, dst, sum)
	}
	if err != nil {
		if created {
			c.removeTemp(tmp)
		}
		if errors.Is(err, ErrTimeout) || errors.Is(err, ErrCanceled) || errors.Is(err, ErrConnLost) {
			return "", err // already names the node and the operation
		}
		return "", fmt.Errorf("runner: node %q: upload to %s: %w", c.node, dst, err)
	}
	c.log.Debug("uploaded", "path", dst, "size", size, "sha256", sum)
	return sum, nil
}

// writeFile fills f (a new, empty file) from src, returning the SHA-256 of
// what was sent, and closes f.
func writeFile(ctx context.Context, f *sftp.File, src io.Reader, size int64, mode os.FileMode) (sum string, err error) {
	defer func() {
		if cerr := f.Close(); err == nil && cerr != nil {
			err = fmt.Errorf("close: %w", cerr)
		}
	}()
	// Set the mode while the file is empty, so content meant to be
	// private is never readable by others.
	if err := f.Chmod(mode); err != nil {
		return "", fmt.Errorf("chmod %v: %w", mode, err)
	}
	h := sha256.New()
	r := &srcReader{ctx: ctx, r: io.TeeReader(io.LimitReader(src, size), h)}
	// Reads stay sequential (so the hash sees the bytes in order) while
	// the writes are pipelined.
	n, err := f.ReadFromWithConcurrency(r, 0)
	switch {
	case r.err != nil:
		return "", fmt.Errorf("read source after %d of %d bytes: %w", r.n, size, r.err)
	case err != nil:
		return "", fmt.Errorf("write after %d of %d bytes: %w", n, size, err)
	case n != size:
		return "", fmt.Errorf("source ended after %d of %d bytes: %w", n, size, io.ErrUnexpectedEOF)
	}
	// Durable before it replaces anything; servers without fsync@openssh.com
	// (pkg/sftp, which edge/sshserver uses) get the kernel's usual flush.
	if err := f.Sync(); err != nil {
		var se *sftp.StatusError
		if !errors.As(err, &se) || se.FxCode() != sftp.ErrSSHFxOpUnsupported {
			return "", fmt.Errorf("fsync: %w", err)
		}
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}

// srcReader stops an upload when ctx ends and records the source's own
// error (pkg/sftp's ReadFrom does not say which side failed).
type srcReader struct {
	ctx context.Context
	r   io.Reader
	n   int64
	err error
}

func (s *srcReader) Read(p []byte) (int, error) {
	if err := s.ctx.Err(); err != nil {
		s.err = err
		return 0, err
	}
	n, err := s.r.Read(p)
	s.n += int64(n)
	if err != nil && err != io.EOF {
		s.err = err
	}
	return n, err
}

// verifyAndRename has the node hash tmp and, if it matches sum, renames it
// over dst.
func (c *Client) verifyAndRename(ctx context.Context, tmp, dst, sum string) error {
	got, err := c.remoteSHA256(ctx, tmp)
	if err != nil {
		return err
	}
	if got != sum {
		return fmt.Errorf("%w: sent %s, the node has %s; the destination was not replaced", ErrChecksum, sum, got)
	}
	return c.withSFTP(ctx, "rename "+tmp, func(s *sftp.Client) error {
		// posix-rename replaces dst atomically; the plain SFTP rename
		// refuses an existing target.
		if err := s.PosixRename(tmp, dst); err != nil {
			return fmt.Errorf("rename %s to %s: %w", tmp, dst, err)
		}
		return nil
	})
}

// sha256Line prints the SHA-256 of the file in $1 with the first tool the
// node has; every tool prints the hex digest as the first word.
const sha256Line = `if command -v sha256sum >/dev/null 2>&1; then sha256sum <"$1"
elif command -v shasum >/dev/null 2>&1; then shasum -a 256 <"$1"
elif command -v openssl >/dev/null 2>&1; then openssl dgst -sha256 -r <"$1"
else echo "no sha256sum, shasum or openssl on the node" >&2; exit 127; fi`

// remoteSHA256 has the node hash the file at p.
func (c *Client) remoteSHA256(ctx context.Context, p string) (string, error) {
	var out, errOut bytes.Buffer
	res, err := c.exec(ctx, c.line("", []string{"/bin/sh", "-c", sha256Line, "sha256", p}), &out, &errOut)
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return "", fmt.Errorf("hash %s on the node: exit %d: %s", p, res.ExitCode, strings.TrimSpace(errOut.String()))
	}
	f := strings.Fields(out.String())
	if len(f) == 0 || len(f[0]) != sha256.Size*2 {
		return "", fmt.Errorf("hash %s on the node: unexpected output %q", p, out.String())
	}
	sum := strings.ToLower(f[0])
	if _, err := hex.DecodeString(sum); err != nil {
		return "", fmt.Errorf("hash %s on the node: unexpected output %q", p, out.String())
	}
	return sum, nil
}

// removeTemp removes a failed upload's temporary file, on a fresh SFTP
// session if a cancellation closed the one in use.
func (c *Client) removeTemp(tmp string) {
	ctx, cancel := context.WithTimeout(context.Background(), c.r.cfg.KillGrace)
	defer cancel()
	err := c.withSFTP(ctx, "remove "+tmp, func(s *sftp.Client) error { return s.Remove(tmp) })
	if err != nil && !errors.Is(err, fs.ErrNotExist) {
		c.log.Warn("could not remove temporary upload file", "path", tmp, "err", err)
	}
}

// Exists reports whether path exists on the node (following symlinks: a
// dangling symlink does not exist).
func (c *Client) Exists(ctx context.Context, p string) (bool, error) {
	if err := checkPath(c.node, p); err != nil {
		return false, err
	}
	var exists bool
	err := c.withSFTP(ctx, "stat "+p, func(s *sftp.Client) error {
		_, err := s.Stat(p)
		switch {
		case err == nil:
			exists = true
		case errors.Is(err, fs.ErrNotExist):
			err = nil
		}
		return err
	})
	if err != nil {
		if errors.Is(err, ErrTimeout) || errors.Is(err, ErrCanceled) || errors.Is(err, ErrConnLost) {
			return false, err
		}
		return false, fmt.Errorf("runner: node %q: stat %s: %w", c.node, p, err)
	}
	return exists, nil
}

// checkPath accepts absolute, clean paths without "." or ".." components
// and without control characters (which no provisioning path needs and
// which make logs and tool output ambiguous).
func checkPath(node, p string) error {
	bad := func(why string) error {
		return fmt.Errorf("runner: node %q: remote path %q %s: %w", node, p, why, ErrBadPath)
	}
	switch {
	case p == "":
		return bad("is empty")
	case !strings.HasPrefix(p, "/"):
		return bad("is not absolute")
	case strings.ContainsFunc(p, func(r rune) bool { return r < ' ' || r == 0x7f }):
		return bad("contains NUL or control characters")
	}
	for _, part := range strings.Split(p[1:], "/") {
		if part == "." || part == ".." {
			return bad(`contains a "." or ".." component`)
		}
	}
	if path.Clean(p) != p {
		return bad("is not clean (double or trailing slash)")
	}
	return nil
}
