package hub

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
)

// gcPercent is the hub's garbage-collection target (GOGC) for a large live
// heap. A hub's memory is mostly small objects that live as long as a
// node's session (TLS and QUIC state, stream buffers, goroutine stacks);
// Go's default of 100 lets garbage grow to as much again as that before a
// collection, so at 10k idle agents half the hub's heap was garbage. 50
// keeps it to half as much: per QUIC agent, hub RSS fell from 148 to 97 KiB
// in bench P4 (2,000 agents), with no measurable change in idle CPU (an
// idle hub allocates little, so collections stay rare).
const gcPercent = 50

// gcMinHeadroom is the least garbage the hub lets grow between two
// collections. Relaying allocates a fresh slice for every SSH packet the
// bastion receives (golang.org/x/crypto/ssh does, by design), so a hub
// with a small live heap and GOGC 50 collected every few megabytes and
// spent 10–25 % of its relaying CPU on it (bench P2). With this floor a
// small hub collects about as often as at GOGC 100 or more, while from
// 2·gcMinHeadroom of live heap up (a few hundred idle agents) the target
// is gcPercent again, so a large fleet's memory per agent is unchanged.
const gcMinHeadroom = 32 << 20

var gcTunerOnce sync.Once

// tuneGC starts the hub's GC policy (gcPercent with a floor of
// gcMinHeadroom) unless the operator chose a GOGC. It is process-wide and
// lasts for the process: later calls do nothing.
func tuneGC() {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	gcTunerOnce.Do(func() {
		t := &gcTuner{sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}}}
		t.last = gcPercent
		debug.SetGCPercent(gcPercent)
		t.arm()
	})
}

// gcTuner re-sets the GC percent after every collection from the live heap
// it left. It runs from a finalizer, which the runtime calls (on its
// finalizer goroutine) once per completed cycle, so it needs no goroutine
// or timer of its own and costs nothing while the hub does not allocate.
type gcTuner struct {
	sample []metrics.Sample
	last   int
}

type gcSentinel struct{ t *gcTuner }

func (t *gcTuner) arm() {
	s := &gcSentinel{t: t}
	runtime.SetFinalizer(s, func(s *gcSentinel) {
		s.t.retune()
		s.t.arm()
	})
}

func (t *gcTuner) retune() {
	metrics.Read(t.sample)
	if t.sample[0].Value.Kind() != metrics.KindUint64 {
		return
	}
	p := gcPercentFor(t.sample[0].Value.Uint64())
	if p != t.last {
		t.last = p
		debug.SetGCPercent(p)
	}
}

// gcPercentFor is the GC percent that gives a live heap of live bytes at
// least gcMinHeadroom of headroom, and never less than gcPercent. It is
// rounded to steps of 10 % so that a live heap moving a little does not
// change the setting after every collection.
func gcPercentFor(live uint64) int {
	if live == 0 {
		live = 1
	}
	p := uint64(gcMinHeadroom) * 100 / live
	if p <= gcPercent {
		return gcPercent
	}
	p = (p + 9) / 10 * 10
	return int(min(p, 10000))
}
