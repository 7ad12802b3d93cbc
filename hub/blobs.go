package hub

import (
	"context"
	"sync"
	"time"

	"github.com/tether-dev/tether/hub/artifacts"
	"github.com/tether-dev/tether/hub/jobs"
)

// Blob store housekeeping: the registry client that fills the blob store
// with upgrade artifacts, and the garbage collection that empties it of
// what no job or upgrade references.
const (
	// blobGCInterval is how often unreferenced blobs are collected.
	blobGCInterval = time.Hour
	// blobMinAge protects a blob between its upload and the job that will
	// name it (tether run uploads first, then creates the job).
	blobMinAge = 24 * time.Hour
)

// blobRefs are the blob referencers besides jobs (upgrades register theirs).
type blobRefs struct {
	mu   sync.Mutex // guards the following fields
	refs []jobs.BlobReferencer
}

// addBlobReferencer makes GC keep the digests f returns (the upgrades'
// pinned blobs); every pass asks every referencer.
func (s *Server) addBlobReferencer(f jobs.BlobReferencer) {
	s.blobRefs.mu.Lock()
	defer s.blobRefs.mu.Unlock()
	s.blobRefs.refs = append(s.blobRefs.refs, f)
}

// newArtifacts is the registry client upgrades pin and fetch with
// (--registry-ca, --registry-auth); its byte counter is a hub metric.
func (s *Server) newArtifacts(blobs *jobs.Blobs) (*artifacts.Client, func(), error) {
	c, err := artifacts.New(artifacts.Config{CAFile: s.cfg.RegistryCA, AuthFile: s.cfg.RegistryAuth, Blobs: blobs,
		Log: s.log.With("component", "artifacts")})
	if err != nil {
		return nil, nil, err
	}
	if err := s.metrics.Registry.Register(c.Collector()); err != nil {
		return nil, nil, err
	}
	return c, func() { s.metrics.Registry.Unregister(c.Collector()) }, nil
}

// startBlobGC collects unreferenced blobs now and every blobGCInterval
// until ctx ends; the returned func waits for it to stop.
func (s *Server) startBlobGC(ctx context.Context, blobs *jobs.Blobs) (wait func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(blobGCInterval)
		defer t.Stop()
		for {
			s.collectBlobs(ctx, blobs)
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
		}
	}()
	return func() { cancel(); <-done }
}

func (s *Server) collectBlobs(ctx context.Context, blobs *jobs.Blobs) {
	s.blobRefs.mu.Lock()
	refs := append([]jobs.BlobReferencer{s.store.JobBlobDigests}, s.blobRefs.refs...)
	s.blobRefs.mu.Unlock()
	st, err := blobs.CollectGarbage(ctx, blobMinAge, refs...)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("blob gc: nothing removed", "err", err)
		}
		return
	}
	if st.Removed > 0 {
		s.log.Info("blob gc: removed unreferenced blobs", "removed", st.Removed, "bytes", st.BytesRemoved, "kept", st.Kept)
	}
}
