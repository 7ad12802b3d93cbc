package blobs

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/store"
)

// GC keeps what jobs and upgrades reference and what is younger than the
// minimum age, and removes the rest (and abandoned temporary files).
func TestBlobGC(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	b, err := New(filepath.Join(dir, "blobs"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	put := func(s string, age time.Duration) string {
		d, err := b.PutBytes([]byte(s))
		if err != nil {
			t.Fatal(err)
		}
		old := time.Now().Add(-age)
		if err := os.Chtimes(filepath.Join(b.dir, d), old, old); err != nil {
			t.Fatal(err)
		}
		return d
	}
	jobBlob := put("uploaded for a job", 48*time.Hour)
	upgradeBlob := put("an agent binary", 48*time.Hour)
	recent := put("uploaded a minute ago, its job not created yet", time.Minute)
	orphan := put("nobody's", 48*time.Hour)
	tmp := filepath.Join(b.dir, tempPrefix+"abandoned")
	if err := os.WriteFile(tmp, []byte("half an upload"), 0o600); err != nil {
		t.Fatal(err)
	}
	old := time.Now().Add(-48 * time.Hour)
	if err := os.Chtimes(tmp, old, old); err != nil {
		t.Fatal(err)
	}
	other := filepath.Join(b.dir, "README")
	if err := os.WriteFile(other, []byte("not a blob"), 0o600); err != nil {
		t.Fatal(err)
	}
	spec := store.JobSpec{Command: "true", Uploads: []store.Upload{{Name: "f", SHA256: jobBlob, Size: 1, Dest: "/tmp/f"}}}
	if err := st.CreateJob(
		ctx, store.Job{ID: "j1", Kind: "run", Spec: spec, State: store.JobSucceeded, CreatedAt: old}, nil,
	); err != nil {
		t.Fatal(err)
	}
	upgrades := func(context.Context) ([]string, error) { return []string{"sha256:" + upgradeBlob}, nil }

	// A referencer that fails stops the pass: nothing is removed.
	failing := func(context.Context) ([]string, error) { return nil, errors.New("store down") }
	if _, err := b.CollectGarbage(ctx, time.Hour, st.JobBlobDigests, failing); err == nil || !b.Has(orphan) {
		t.Fatalf("GC with a failing referencer: %v, orphan kept: %v", err, b.Has(orphan))
	}

	stats, err := b.CollectGarbage(ctx, time.Hour, st.JobBlobDigests, upgrades)
	if err != nil {
		t.Fatal(err)
	}
	for name, d := range map[string]string{"job's": jobBlob, "upgrade's": upgradeBlob, "recent": recent} {
		if !b.Has(d) {
			t.Errorf("the %s blob was removed", name)
		}
	}
	if b.Has(orphan) {
		t.Error("the unreferenced old blob was kept")
	}
	if _, err := os.Stat(tmp); !errors.Is(err, os.ErrNotExist) {
		t.Error("the abandoned temporary file was kept")
	}
	if _, err := os.Stat(other); err != nil {
		t.Error("a file that is not a blob was removed")
	}
	if stats.Removed != 2 || stats.Kept != 3 || stats.BytesRemoved != int64(len("nobody's")+len("half an upload")) {
		t.Errorf("stats %+v", stats)
	}
}
