// Package blobs is the hub's content-addressed file store (job uploads, cluster engine scripts,
// upgrade artifacts pulled from registries) and its garbage collection. Jobs, upgrades and the
// artifact client share it; it imports nothing of the hub.
package blobs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// ErrNotFound is returned for a digest the hub does not hold.
var ErrNotFound = errors.New("blob not found")

// ErrTooLarge is returned when an upload exceeds the size limit.
var ErrTooLarge = errors.New("blob too large")

// ErrDigestMismatch is returned when content does not hash to the
// digest it was announced with; nothing is stored then.
var ErrDigestMismatch = errors.New("blob digest mismatch")

// Store is a content-addressed file store for job uploads, engine scripts
// and upgrade artifacts fetched from registries: files are named by their
// SHA-256, so a job spec or an upgrade that names a digest always gets the
// same bytes, including on a rerun. GC removes what nothing references.
type Store struct {
	dir     string
	maxSize int64
}

// New opens (creating) the blob directory.
func New(dir string, maxSize int64) (*Store, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("blobs: blob dir: %w", err)
	}
	return &Store{dir: dir, maxSize: maxSize}, nil
}

// ValidDigest reports whether d is a lowercase hex SHA-256 (which also makes
// it safe as a file name).
func ValidDigest(d string) bool {
	if len(d) != 64 {
		return false
	}
	for _, c := range d {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// Put stores what r yields (at most the size limit) and returns its digest
// and size. If want is not empty the content must hash to it.
func (b *Store) Put(r io.Reader, want string) (digest string, size int64, err error) {
	if want != "" && !ValidDigest(want) {
		return "", 0, fmt.Errorf("jobs: digest %q is not a hex SHA-256", want)
	}
	tmp, err := os.CreateTemp(b.dir, tempPrefix+"*")
	if err != nil {
		return "", 0, fmt.Errorf("jobs: store blob: %w", err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(tmp, h), io.LimitReader(r, b.maxSize+1))
	if err != nil {
		return "", 0, fmt.Errorf("jobs: store blob: %w", err)
	}
	if n > b.maxSize {
		return "", 0, fmt.Errorf("jobs: %w: more than %d bytes", ErrTooLarge, b.maxSize)
	}
	digest = hex.EncodeToString(h.Sum(nil))
	if want != "" && want != digest {
		return "", 0, fmt.Errorf(
			"jobs: %w: upload hashes to sha256:%s, not the announced sha256:%s (corrupted in transit?)",
			ErrDigestMismatch, digest, want,
		)
	}
	if err := tmp.Sync(); err != nil {
		return "", 0, fmt.Errorf("jobs: store blob: %w", err)
	}
	if err := tmp.Close(); err != nil {
		return "", 0, fmt.Errorf("jobs: store blob: %w", err)
	}
	if err := os.Rename(tmp.Name(), filepath.Join(b.dir, digest)); err != nil {
		return "", 0, fmt.Errorf("jobs: store blob: %w", err)
	}
	return digest, n, nil
}

// hash returns the digest of p.
func (*Store) hash(p []byte) (string, int64, error) {
	h := sha256.Sum256(p)
	return hex.EncodeToString(h[:]), int64(len(p)), nil
}

// PutBytes stores p.
func (b *Store) PutBytes(p []byte) (string, error) {
	d, _, err := b.Put(bytes.NewReader(p), "")
	return d, err
}

// Open returns the blob with the digest and its size.
func (b *Store) Open(digest string) (*os.File, int64, error) {
	if !ValidDigest(digest) {
		return nil, 0, fmt.Errorf("jobs: digest %q is not a hex SHA-256", digest)
	}
	f, err := os.Open(filepath.Join(b.dir, digest))
	if errors.Is(err, os.ErrNotExist) {
		return nil, 0, fmt.Errorf("jobs: sha256:%s: %w (upload it again)", digest, ErrNotFound)
	}
	if err != nil {
		return nil, 0, fmt.Errorf("jobs: open blob: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, fmt.Errorf("jobs: open blob: %w", err)
	}
	return f, st.Size(), nil
}

// Has reports whether the blob is stored.
func (b *Store) Has(digest string) bool {
	if !ValidDigest(digest) {
		return false
	}
	_, err := os.Stat(filepath.Join(b.dir, digest))
	return err == nil
}

// tempPrefix names uploads in progress (renamed to their digest when done).
const tempPrefix = ".upload-"

// GCStats is what one GC pass did.
type GCStats struct {
	Kept         int   // blobs referenced or younger than the minimum age
	Removed      int   // blobs and abandoned temporary files removed
	BytesRemoved int64 // their size
}

// GC removes the blobs keep does not name that are older than minAge, and
// temporary files abandoned longer than minAge (a crash mid-upload). keep's
// keys are hex digests, with or without "sha256:". The age protects a blob
// between its upload and the job or upgrade that will name it: Put always
// writes a new file, so a blob stored again is young again.
func (b *Store) GC(keep map[string]bool, minAge time.Duration) (GCStats, error) {
	norm := make(map[string]bool, len(keep))
	for k := range keep {
		norm[strings.TrimPrefix(k, "sha256:")] = true
	}
	entries, err := os.ReadDir(b.dir)
	if err != nil {
		return GCStats{}, fmt.Errorf("blobs: blob gc: %w", err)
	}
	var st GCStats
	cutoff := time.Now().Add(-minAge)
	var errs []error
	for _, e := range entries {
		name := e.Name()
		if !e.Type().IsRegular() || !(ValidDigest(name) || strings.HasPrefix(name, tempPrefix)) {
			continue // not ours
		}
		info, err := e.Info()
		if err != nil {
			continue // removed meanwhile
		}
		if norm[name] || info.ModTime().After(cutoff) {
			st.Kept++
			continue
		}
		if err := os.Remove(filepath.Join(b.dir, name)); err != nil && !errors.Is(err, os.ErrNotExist) {
			errs = append(errs, err)
			continue
		}
		st.Removed++
		st.BytesRemoved += info.Size()
	}
	if len(errs) > 0 {
		return st, fmt.Errorf("blobs: blob gc: %w", errors.Join(errs...))
	}
	return st, nil
}

// Referencer returns digests (hex, with or without "sha256:") that must
// stay in the blob store: those of jobs, of upgrades, ….
type Referencer func(ctx context.Context) ([]string, error)

// CollectGarbage runs one GC pass keeping what every referencer names. A
// referencer that fails stops the pass: a blob must never go because its
// owner could not be asked.
func (b *Store) CollectGarbage(ctx context.Context, minAge time.Duration, refs ...Referencer) (GCStats, error) {
	keep := map[string]bool{}
	for _, r := range refs {
		ds, err := r(ctx)
		if err != nil {
			return GCStats{}, fmt.Errorf("blobs: blob gc: listing referenced blobs: %w", err)
		}
		for _, d := range ds {
			keep[d] = true
		}
	}
	return b.GC(keep, minAge)
}
