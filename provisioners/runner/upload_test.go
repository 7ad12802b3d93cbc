package runner

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// failingReader yields n bytes of r, then err.
type failingReader struct {
	r   io.Reader
	n   int
	err error
}

func (f *failingReader) Read(p []byte) (int, error) {
	if f.n <= 0 {
		return 0, f.err
	}
	if len(p) > f.n {
		p = p[:f.n]
	}
	n, err := f.r.Read(p)
	f.n -= n
	return n, err
}

// blockingReader yields n bytes of r, then signals reached and blocks
// until release is closed.
type blockingReader struct {
	r       io.Reader
	n       int
	reached chan struct{}
	release chan struct{}
}

func (b *blockingReader) Read(p []byte) (int, error) {
	if b.n <= 0 {
		close(b.reached)
		<-b.release
		return 0, io.ErrClosedPipe
	}
	if len(p) > b.n {
		p = p[:b.n]
	}
	n, err := b.r.Read(p)
	b.n -= n
	return n, err
}

func randomBytes(t *testing.T, n int) []byte {
	t.Helper()
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		t.Fatal(err)
	}
	return b
}

// dirNames lists dir's entries, to catch leftover temporary files.
func dirNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

func TestUpload(t *testing.T) {
	forEachServer(t, func(t *testing.T, s *testServer) {
		c := s.connect(t)
		ctx := context.Background()
		dir := t.TempDir()
		dst := filepath.Join(dir, "payload.bin")
		data := randomBytes(t, 8<<20)
		want := sha256.Sum256(data)

		t.Run("8 MiB", func(t *testing.T) {
			start := time.Now()
			sum, err := c.Upload(ctx, bytes.NewReader(data), int64(len(data)), dst, UploadOptions{Mode: 0o640})
			if err != nil {
				t.Fatalf("Upload: %v", err)
			}
			t.Logf("8 MiB upload + remote sha256 took %v", time.Since(start).Round(time.Millisecond))
			if sum != hex.EncodeToString(want[:]) {
				t.Errorf("returned sum %s, want %x", sum, want)
			}
			got, err := os.ReadFile(dst)
			if err != nil || sha256.Sum256(got) != want {
				t.Fatalf("file on the node: %d bytes, err %v, content differs", len(got), err)
			}
			if fi, _ := os.Stat(dst); fi.Mode().Perm() != 0o640 {
				t.Errorf("mode %v, want 0640", fi.Mode().Perm())
			}
			if names := dirNames(t, dir); len(names) != 1 {
				t.Errorf("directory holds %v, want only the file", names)
			}
		})

		t.Run("replaces an existing file", func(t *testing.T) {
			testenv.WriteFile(t, dst, []byte("old"), 0o600)
			if _, err := c.Upload(ctx, strings.NewReader("new content"), 11, dst, UploadOptions{Mode: 0o755}); err != nil {
				t.Fatal(err)
			}
			got, _ := os.ReadFile(dst)
			fi, _ := os.Stat(dst)
			if string(got) != "new content" || fi.Mode().Perm() != 0o755 {
				t.Errorf("content %q mode %v", got, fi.Mode().Perm())
			}
		})

		t.Run("empty file, default mode", func(t *testing.T) {
			p := filepath.Join(dir, "empty")
			sum, err := c.Upload(ctx, strings.NewReader(""), 0, p, UploadOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if empty := sha256.Sum256(nil); sum != hex.EncodeToString(empty[:]) {
				t.Errorf("sum %s", sum)
			}
			if fi, err := os.Stat(p); err != nil || fi.Size() != 0 || fi.Mode().Perm() != 0o644 {
				t.Errorf("empty file: %v %v", fi, err)
			}
			os.Remove(p)
		})

		// A failing source leaves the destination as it was and no
		// temporary file behind.
		srcErr := errors.New("source broke")
		for name, src := range map[string]struct {
			r       io.Reader
			wantErr error
		}{
			"source fails midway": {&failingReader{r: bytes.NewReader(data), n: 1 << 20, err: srcErr}, srcErr},
			"source too short":    {bytes.NewReader(data[:1000]), io.ErrUnexpectedEOF},
		} {
			t.Run(name, func(t *testing.T) {
				testenv.WriteFile(t, dst, []byte("previous"), 0o644)
				_, err := c.Upload(ctx, src.r, int64(len(data)), dst, UploadOptions{})
				if !errors.Is(err, src.wantErr) {
					t.Fatalf("Upload: %v, want %v", err, src.wantErr)
				}
				if got, _ := os.ReadFile(dst); string(got) != "previous" {
					t.Errorf("destination changed to %d bytes", len(got))
				}
				if names := dirNames(t, dir); len(names) != 1 {
					t.Errorf("directory holds %v, want only the file", names)
				}
			})
		}

		t.Run("cancelled midway", func(t *testing.T) {
			testenv.WriteFile(t, dst, []byte("previous"), 0o644)
			ctx, cancel := context.WithCancel(ctx)
			br := &blockingReader{
				r:       bytes.NewReader(data),
				n:       1 << 20,
				reached: make(chan struct{}),
				release: make(chan struct{}),
			}
			go func() {
				<-br.reached
				cancel()
				close(br.release)
			}()
			_, err := c.Upload(ctx, br, int64(len(data)), dst, UploadOptions{})
			if !errors.Is(err, ErrCanceled) || !errors.Is(err, context.Canceled) {
				t.Fatalf("Upload: %v, want ErrCanceled", err)
			}
			if got, _ := os.ReadFile(dst); string(got) != "previous" {
				t.Errorf("destination changed to %d bytes", len(got))
			}
			if names := dirNames(t, dir); len(names) != 1 {
				t.Errorf("directory holds %v, want only the file", names)
			}
			// The client still works.
			if _, err := c.Upload(context.Background(), strings.NewReader("after"), 5, dst, UploadOptions{}); err != nil {
				t.Fatalf("Upload after a cancelled one: %v", err)
			}
		})

		t.Run("missing parent", func(t *testing.T) {
			p := filepath.Join(dir, "a", "b", "file")
			_, err := c.Upload(ctx, strings.NewReader("x"), 1, p, UploadOptions{})
			// Users read this message (tether run --upload): it says what to
			// do, not which Go option to set.
			if !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "mkdir -p") ||
				strings.Contains(err.Error(), "MkdirParents") {
				t.Fatalf("Upload without parents: %v, want fs.ErrNotExist saying mkdir -p", err)
			}
			if _, err := c.Upload(ctx, strings.NewReader("x"), 1, p, UploadOptions{MkdirParents: true}); err != nil {
				t.Fatalf("Upload with MkdirParents: %v", err)
			}
			if got, _ := os.ReadFile(p); string(got) != "x" {
				t.Errorf("content %q", got)
			}
		})

		t.Run("Exists", func(t *testing.T) {
			for p, want := range map[string]bool{
				dst:                           true,
				dir:                           true,
				"/":                           true,
				filepath.Join(dir, "missing"): false,
			} {
				got, err := c.Exists(ctx, p)
				if err != nil || got != want {
					t.Errorf("Exists(%s) = %v, %v; want %v", p, got, err, want)
				}
			}
		})

		t.Run("bad requests", func(t *testing.T) {
			if _, err := c.Upload(
				ctx, strings.NewReader(""), 0, dst, UploadOptions{Mode: fs.ModeDir | 0o755},
			); !errors.Is(err, ErrInvalid) {
				t.Errorf("directory mode: %v, want ErrInvalid", err)
			}
			if _, err := c.Upload(ctx, strings.NewReader(""), -1, dst, UploadOptions{}); !errors.Is(err, ErrInvalid) {
				t.Errorf("negative size: %v, want ErrInvalid", err)
			}
		})
	})
}

func TestBadPaths(t *testing.T) {
	s := newServer(t, "embedded", hostCertOK)
	c := s.connect(t)
	ctx := context.Background()
	for _, p := range []string{
		"", "relative/file", "file", "./file", "/a/../b", "/..", "/a/./b", "/a/.",
		"/a//b", "/a/", "/a\x00b", "/a\nb", "/a\tb", "/a\x7fb",
	} {
		if _, err := c.Upload(ctx, strings.NewReader("x"), 1, p, UploadOptions{}); !errors.Is(err, ErrBadPath) {
			t.Errorf("Upload(%q): %v, want ErrBadPath", p, err)
		}
		if _, err := c.Exists(ctx, p); !errors.Is(err, ErrBadPath) {
			t.Errorf("Exists(%q): %v, want ErrBadPath", p, err)
		}
	}
	if _, err := c.Upload(ctx, strings.NewReader("x"), 1, "/", UploadOptions{}); !errors.Is(err, ErrBadPath) {
		t.Errorf("Upload(/): %v, want ErrBadPath", err)
	}
	// Unusual but valid names pass through quoted.
	dir := t.TempDir()
	for _, name := range []string{"it's", "$(id)", "a b", "-n", "ünï"} {
		p := filepath.Join(dir, name)
		if _, err := c.Upload(ctx, strings.NewReader(name), int64(len(name)), p, UploadOptions{}); err != nil {
			t.Errorf("Upload(%q): %v", p, err)
		} else if got, _ := os.ReadFile(p); string(got) != name {
			t.Errorf("%q holds %q", p, got)
		}
	}
}
