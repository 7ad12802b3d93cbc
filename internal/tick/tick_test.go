package tick

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestRepeat(t *testing.T) {
	t.Run("runs until stopped, stop waits for a call in flight", func(t *testing.T) {
		var calls, inFlight atomic.Int32
		stop := Repeat(5*time.Millisecond, func() bool {
			inFlight.Add(1)
			defer inFlight.Add(-1)
			calls.Add(1)
			time.Sleep(2 * time.Millisecond)
			return true
		})
		deadline := time.Now().Add(5 * time.Second)
		for calls.Load() < 3 && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		stop()
		if inFlight.Load() != 0 {
			t.Fatal("stop returned while a call was in flight")
		}
		n := calls.Load()
		if n < 3 {
			t.Fatalf("%d calls in 5 s, want at least 3", n)
		}
		time.Sleep(30 * time.Millisecond)
		if calls.Load() != n {
			t.Fatal("called after stop")
		}
	})
	t.Run("ends when fn returns false", func(t *testing.T) {
		var calls atomic.Int32
		stop := Repeat(time.Millisecond, func() bool { return calls.Add(1) < 2 })
		defer stop()
		time.Sleep(50 * time.Millisecond)
		if n := calls.Load(); n != 2 {
			t.Fatalf("%d calls, want 2 (the second said stop)", n)
		}
	})
}
