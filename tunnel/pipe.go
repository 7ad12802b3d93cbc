package tunnel

import (
	"io"
	"sync"
	"sync/atomic"
)

// pipeBufSize is large enough that one copy moves a full TLS record or QUIC
// packet batch; buffers are pooled so an idle relay holds none.
const pipeBufSize = 64 << 10

var pipeBufs = sync.Pool{New: func() any { b := make([]byte, pipeBufSize); return &b }}

type closeWriter interface{ CloseWrite() error }

// PipeCounts are the bytes Pipe moved each way.
type PipeCounts struct {
	AtoB, BtoA int64
}

// Pipe copies a->b and b->a until both directions end, half-closing the
// destination when its source ends (when it supports CloseWrite), then
// closes both. onBytes, if non-nil, is called with every chunk so callers can
// keep live byte counters.
func Pipe(a, b io.ReadWriteCloser, onBytes func(aToB bool, n int)) PipeCounts {
	var counts PipeCounts
	var wg sync.WaitGroup
	var closeOnce sync.Once
	closeBoth := func() { closeOnce.Do(func() { a.Close(); b.Close() }) }
	var done atomic.Int32
	cp := func(dst, src io.ReadWriteCloser, aToB bool, total *int64) {
		defer wg.Done()
		bp := pipeBufs.Get().(*[]byte)
		defer pipeBufs.Put(bp)
		buf := *bp
		var err error
		for {
			n, rerr := src.Read(buf)
			if n > 0 {
				if _, werr := dst.Write(buf[:n]); werr != nil {
					err = werr
				}
				*total += int64(n)
				if onBytes != nil {
					onBytes(aToB, n)
				}
			}
			if rerr != nil || err != nil {
				if rerr != io.EOF || err != nil {
					err = rerr
				}
				break
			}
		}
		if cw, ok := dst.(closeWriter); ok && err == nil {
			_ = cw.CloseWrite()
		} else {
			// An error in one direction ends both: the other side would
			// otherwise wait forever on a peer that is gone.
			closeBoth()
		}
		if done.Add(1) == 2 {
			closeBoth()
		}
	}
	wg.Add(2)
	go cp(b, a, true, &counts.AtoB)
	go cp(a, b, false, &counts.BtoA)
	wg.Wait()
	closeBoth()
	return counts
}
