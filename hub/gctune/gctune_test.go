package gctune

import (
	"os"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

// TestGCPercentFor: a busy hub with a small live heap gets at least
// gcMinHeadroom of headroom; an idle one, or a large heap, gcPercent.
func TestGCPercentFor(t *testing.T) {
	const busy, sec = 256 << 20, time.Second // 256 MiB/s: a relaying hub
	for _, tc := range []struct {
		name      string
		live      uint64
		allocated uint64
		interval  time.Duration
		want      int
	}{
		{"busy, empty heap", 0, busy, sec, 10000},
		{"busy, 1 MiB live", 1 << 20, busy, sec, 3200},
		{"busy, 8 MiB live", 8 << 20, busy, sec, 400},
		{"busy, 30 MiB live (106.7 rounds up)", 30 << 20, busy, sec, 110},
		{"busy, live heap at the floor's end", gcMinHeadroom * 100 / gcPercent, busy, sec, gcPercent},
		{"busy, 1 GiB live", 1 << 30, busy, sec, gcPercent},
		{"idle: 1 MiB/s", 8 << 20, 1 << 20, sec, gcPercent},
		{"idle: forced collection after two minutes", 8 << 20, 64 << 20, 2 * time.Minute, gcPercent},
		{"two collections in a row (little allocated)", 8 << 20, 64 << 10, time.Millisecond, gcPercent},
		{"no interval", 8 << 20, busy, 0, gcPercent},
	} {
		if got := gcPercentFor(tc.live, tc.allocated, tc.interval); got != tc.want {
			t.Errorf("%s: gcPercentFor = %d, want %d", tc.name, got, tc.want)
		}
	}
}

// TestTuneGC: the hub's policy replaces the default, unless GOGC is set.
func TestTuneGC(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })

	for _, env := range []string{"100", "off"} {
		t.Setenv("GOGC", env)
		debug.SetGCPercent(100)
		Start()
		if got := debug.SetGCPercent(100); got != 100 {
			t.Errorf("GOGC=%q: GC percent %d, want it left at 100", env, got)
		}
	}

	t.Setenv("GOGC", "") // restored at cleanup
	_ = os.Unsetenv("GOGC")
	debug.SetGCPercent(100)
	Start()
	if got := gcPercentNow(); got < gcPercent || got == 100 {
		t.Errorf("GOGC unset: GC percent %d after Start, want %d or the tuner's setting", got, gcPercent)
	}
	// The test binary's live heap is far below 2·gcMinHeadroom, so once it
	// allocates fast the tuner must raise the target above gcPercent.
	deadline := time.Now().Add(10 * time.Second)
	for {
		for range 64 {
			gcSink = make([]byte, 1<<20)
		}
		runtime.GC()
		p := gcPercentNow()
		if p > gcPercent {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("GC percent still %d after collections; want the tuner to raise it for a small heap", p)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

var gcSink []byte

// gcPercentNow reads the GC percent (SetGCPercent is its only reader).
func gcPercentNow() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}
