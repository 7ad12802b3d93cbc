package artifacts

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/blobs"
)

// The blob store's garbage collection: the hub's content-addressed blob
// store (blobs.Store) holds jobs' uploads and the artifacts this package
// fetches; what nothing references any more is removed.
const (
	// blobGCInterval is how often unreferenced blobs are collected.
	blobGCInterval = time.Hour
	// blobMinAge protects a blob between its upload and the job that will
	// name it (tether run uploads first, then creates the job).
	blobMinAge = 24 * time.Hour
)

// Referencers are the blob referencers besides jobs (upgrades register
// theirs); the zero value is ready to use.
type Referencers struct {
	mu   sync.Mutex // guards refs
	refs []blobs.Referencer
}

// Add makes GC keep the digests f returns (the upgrades' pinned blobs);
// every pass asks every referencer.
func (r *Referencers) Add(f blobs.Referencer) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.refs = append(r.refs, f)
}

// All is every referencer added so far.
func (r *Referencers) All() []blobs.Referencer {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]blobs.Referencer(nil), r.refs...)
}

// StartBlobGC collects the blobs none of refs() references now and every
// hour until ctx ends; the returned func waits for it to stop.
func StartBlobGC(ctx context.Context, blobs *blobs.Store, refs func() []blobs.Referencer,
	log *slog.Logger) (wait func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(blobGCInterval)
		defer t.Stop()
		for {
			collectBlobs(ctx, blobs, refs(), log)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

func collectBlobs(ctx context.Context, blobs *blobs.Store, refs []blobs.Referencer, log *slog.Logger) {
	st, err := blobs.CollectGarbage(ctx, blobMinAge, refs...)
	if err != nil {
		if ctx.Err() == nil {
			log.Warn("blob gc: nothing removed", "err", err)
		}
		return
	}
	if st.Removed > 0 {
		log.Info("blob gc: removed unreferenced blobs", "removed", st.Removed, "bytes", st.BytesRemoved, "kept", st.Kept)
	}
}
