// Package tick runs periodic work on timers and tickers the caller owns, so
// per-session periodic work costs no goroutine of its own.
package tick

import (
	"context"
	"sync"
	"time"
)

// Every calls fn with the tick's time every interval until ctx ends,
// on the caller's goroutine.
func Every(ctx context.Context, interval time.Duration, fn func(now time.Time)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			fn(now)
		}
	}
}

// Repeat calls fn every interval until fn returns false or stop is called;
// stop waits for a call in flight. It runs from a timer, not a goroutine of
// its own: at 100k idle nodes every parked goroutine's stack counts.
func Repeat(interval time.Duration, fn func() bool) (stop func()) {
	var (
		mu      sync.Mutex
		stopped bool
		t       *time.Timer
		running sync.WaitGroup
	)
	tick := func() {
		mu.Lock()
		if stopped {
			mu.Unlock()
			return
		}
		running.Add(1)
		mu.Unlock()
		defer running.Done()
		again := fn()
		mu.Lock()
		defer mu.Unlock()
		if again && !stopped {
			t.Reset(interval)
		}
	}
	mu.Lock()
	t = time.AfterFunc(interval, tick)
	mu.Unlock()
	return func() {
		mu.Lock()
		stopped = true
		t.Stop()
		mu.Unlock()
		running.Wait()
	}
}
