package hub

import (
	"os"
	"runtime/debug"
	"testing"
)

// TestTuneGC: the hub lowers the GC target, unless GOGC is set.
func TestTuneGC(t *testing.T) {
	orig := debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetGCPercent(orig) })
	for _, tc := range []struct {
		env  string // "" leaves GOGC unset
		want int
	}{{"", gcPercent}, {"100", 100}, {"off", 100}} {
		debug.SetGCPercent(100)
		if tc.env != "" {
			t.Setenv("GOGC", tc.env)
		} else {
			t.Setenv("GOGC", "") // restored at cleanup
			_ = os.Unsetenv("GOGC")
		}
		tuneGC()
		if got := debug.SetGCPercent(100); got != tc.want {
			t.Errorf("GOGC=%q: GC percent %d, want %d", tc.env, got, tc.want)
		}
	}
}
