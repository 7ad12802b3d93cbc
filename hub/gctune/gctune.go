// Package gctune is the hub process's garbage-collection policy: a lower
// GOGC for a large live heap of long-lived sessions, with a floor of
// headroom while relaying allocates fast. The hub calls Start once.
package gctune

import (
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"sync"
	"time"
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

// gcMinHeadroom is the least garbage a busy hub lets grow between two
// collections. Relaying allocates a fresh slice for every SSH packet the
// bastion receives (golang.org/x/crypto/ssh does, by design), so a hub
// with a small live heap and GOGC 50 collected every few megabytes and
// spent 18–28 % of its relaying CPU on it (bench P2 profiles). With this
// floor a small hub collects about as often as at GOGC 400+, while from
// 2·gcMinHeadroom of live heap up (several hundred idle agents) the target
// is gcPercent again, so a large fleet's memory per agent is unchanged.
const gcMinHeadroom = 32 << 20

// gcBusyRate is the allocation rate (bytes per second, between the last
// two collections) above which the floor applies. An idle hub, whatever
// its size, allocates far less (heartbeats, the forced collection every
// two minutes) and keeps plain gcPercent, so its resting memory, and a
// memory baseline taken from it, are what they were; one relayed stream
// allocates hundreds of MB/s.
const gcBusyRate = 16 << 20

var gcTunerOnce sync.Once

// Start starts the hub's GC policy (gcPercent with a floor of
// gcMinHeadroom while busy) unless the operator chose a GOGC. The tuner is
// process-wide and lasts for the process; a later call (another hub in the
// same process) only sets gcPercent again until the next cycle.
func Start() {
	if _, set := os.LookupEnv("GOGC"); set {
		return
	}
	debug.SetGCPercent(gcPercent)
	gcTunerOnce.Do(func() {
		t := &gcTuner{sample: []metrics.Sample{{Name: "/gc/heap/live:bytes"}, {Name: "/gc/heap/allocs:bytes"}}}
		t.at = time.Now()
		t.arm()
	})
}

// gcTuner re-sets the GC percent after every collection from the live heap
// it left. It runs from a finalizer, which the runtime calls (on its
// finalizer goroutine) once per completed cycle, so it needs no goroutine
// or timer of its own and costs nothing while the hub does not allocate.
type gcTuner struct {
	sample []metrics.Sample
	at     time.Time // when the previous cycle was seen
	allocs uint64    // cumulative bytes allocated then
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
	if t.sample[0].Value.Kind() != metrics.KindUint64 || t.sample[1].Value.Kind() != metrics.KindUint64 {
		return
	}
	now, allocs := time.Now(), t.sample[1].Value.Uint64()
	p := gcPercentFor(t.sample[0].Value.Uint64(), allocs-min(allocs, t.allocs), now.Sub(t.at))
	t.at, t.allocs = now, allocs
	// Set every cycle, not only on a change: a cycle is milliseconds
	// apart at the least, and nothing else in the hub sets the percent.
	debug.SetGCPercent(p)
}

// gcPercentFor is the GC percent for a live heap of live bytes, after
// allocated bytes were allocated in the interval since the previous
// cycle. A busy hub (at least gcBusyRate, over at least a megabyte, so
// that two collections in a row say nothing) gets at least gcMinHeadroom
// of headroom; every other case, and every live heap from 2·gcMinHeadroom
// up, gets gcPercent. The percent is rounded up to a step of 10 so that a
// live heap moving a little does not change the setting every cycle.
func gcPercentFor(live, allocated uint64, interval time.Duration) int {
	if allocated < 1<<20 || interval <= 0 || float64(allocated)/interval.Seconds() < gcBusyRate {
		return gcPercent
	}
	p := uint64(gcMinHeadroom) * 100 / max(live, 1)
	if p <= gcPercent {
		return gcPercent
	}
	p = (p + 9) / 10 * 10
	return int(min(p, 10000))
}
