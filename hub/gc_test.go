package hub

import (
	"os"
	"runtime"
	"runtime/debug"
	"testing"
	"time"
)

// TestGCPercentFor: a small live heap gets at least gcMinHeadroom of
// headroom, a large one gcPercent.
func TestGCPercentFor(t *testing.T) {
	for _, tc := range []struct {
		live uint64
		want int
	}{
		{0, 10000},
		{1 << 20, 3200},
		{8 << 20, 400},
		{30 << 20, 110}, // 106.7 rounds up to a step of 10
		{gcMinHeadroom * 100 / gcPercent, gcPercent},
		{1 << 30, gcPercent},
	} {
		if got := gcPercentFor(tc.live); got != tc.want {
			t.Errorf("gcPercentFor(%d MiB) = %d, want %d", tc.live>>20, got, tc.want)
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
		tuneGC()
		if got := debug.SetGCPercent(100); got != 100 {
			t.Errorf("GOGC=%q: GC percent %d, want it left at 100", env, got)
		}
	}

	t.Setenv("GOGC", "") // restored at cleanup
	_ = os.Unsetenv("GOGC")
	debug.SetGCPercent(100)
	tuneGC()
	if got := gcPercentNow(); got < gcPercent || got == 100 {
		t.Errorf("GOGC unset: GC percent %d after tuneGC, want %d or the tuner's setting", got, gcPercent)
	}
	// The test binary's live heap is far below 2·gcMinHeadroom, so after a
	// collection the tuner must raise the target above gcPercent.
	deadline := time.Now().Add(10 * time.Second)
	for {
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

// gcPercentNow reads the GC percent (SetGCPercent is its only reader).
func gcPercentNow() int {
	p := debug.SetGCPercent(100)
	debug.SetGCPercent(p)
	return p
}
