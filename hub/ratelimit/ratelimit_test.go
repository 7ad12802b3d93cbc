package ratelimit

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time             { return c.t }
func (c *clock) advance(d time.Duration)    { c.t = c.t.Add(d) }
func newClock() *clock                      { return &clock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)} }
func newTest(c *clock, cfg Config) *Limiter { cfg.Now = c.now; return New(cfg) }

func TestSource(t *testing.T) {
	for in, want := range map[string]string{
		"127.0.0.1:2222":             "127.0.0.1",
		"127.0.0.2":                  "127.0.0.2",
		"[::ffff:10.0.0.1]:22":       "10.0.0.1",
		"[2001:db8:1:2:3:4:5:6]:443": "2001:db8:1:2::/64",
		"[2001:db8:1:2::9]:443":      "2001:db8:1:2::/64",
		"[fe80::1%eth0]:22":          "fe80::/64",
		"not an address":             "not an address",
	} {
		if got := Source(in); got != want {
			t.Errorf("Source(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestBurstThenRefill: a source may fail Burst times, is then refused with
// a retry hint, and is let in again once one failure is forgiven; other
// sources never notice.
func TestBurstThenRefill(t *testing.T) {
	c := newClock()
	l := newTest(c, Config{Burst: 3, Every: 10 * time.Second})
	for i := range 3 {
		if ok, _ := l.Allow("a"); !ok {
			t.Fatalf("attempt %d refused within the burst", i)
		}
		l.Fail("a")
	}
	ok, retry := l.Allow("a")
	if ok || retry < 9*time.Second || retry > 10*time.Second {
		t.Fatalf("after the burst: ok %v retry %s", ok, retry)
	}
	if ok, _ := l.Allow("b"); !ok {
		t.Fatal("another source was refused")
	}
	c.advance(10 * time.Second)
	if ok, _ := l.Allow("a"); !ok {
		t.Fatal("still refused after one interval")
	}
	l.Fail("a")
	if ok, _ := l.Allow("a"); ok {
		t.Fatal("one forgiven failure allowed two")
	}
}

// TestRefusedReportsOncePerInterval: a flood yields one report per
// ReportEvery carrying the count of refusals in between, and a clear
// explanation at most once per ExplainEvery.
func TestRefusedReportsOncePerInterval(t *testing.T) {
	c := newClock()
	l := newTest(c, Config{Burst: 1, Every: time.Hour, ReportEvery: time.Minute, ExplainEvery: 2 * time.Second})
	l.Fail("a")
	reports, explains, suppressed := 0, 0, 0
	for range 600 { // 10 refusals a second for a minute
		r := l.Refused("a")
		if r.Report {
			reports++
			suppressed += r.Suppressed
		}
		if r.Explain {
			explains++
		}
		c.advance(100 * time.Millisecond)
	}
	r := l.Refused("a") // a minute later: reported with the count
	if !r.Report || r.Suppressed != 599 {
		t.Fatalf("report after a minute: %+v", r)
	}
	if reports != 1 || suppressed != 0 {
		t.Fatalf("%d reports (%d suppressed) during the first minute, want 1", reports, suppressed)
	}
	if explains != 30 {
		t.Fatalf("%d explanations in 60 s at one per 2 s", explains)
	}
}

// TestTableBounded: many sources never grow the table past MaxSources;
// once it is full of limited sources, new ones share one bucket.
func TestTableBounded(t *testing.T) {
	c := newClock()
	l := newTest(c, Config{Burst: 1, Every: time.Hour, MaxSources: 100})
	for i := range 1000 {
		src := fmt.Sprintf("10.0.%d.%d", i/256, i%256)
		l.Fail(src)
	}
	if n := l.Tracked(); n != 100 {
		t.Fatalf("%d sources tracked, want the cap of 100", n)
	}
	if ok, _ := l.Allow("192.0.2.1"); ok {
		t.Fatal("new source allowed while the overflow bucket is empty")
	}
	// Once buckets are full again, old entries are swept for new ones.
	c.advance(2 * time.Hour)
	l.Fail("192.0.2.1")
	if ok, _ := l.Allow("192.0.2.2"); !ok {
		t.Fatal("new source refused after everything refilled")
	}
	if n := l.Tracked(); n > 100 {
		t.Fatalf("%d sources tracked after sweep", n)
	}
}

// TestAttemptsInFlightCount: attempts under way count against the source,
// so n concurrent ones cannot all get in on one remaining failure; a
// success gives its share back.
func TestAttemptsInFlightCount(t *testing.T) {
	c := newClock()
	l := newTest(c, Config{Burst: 3, Every: time.Hour})
	var as []*Attempt
	for range 3 {
		a, _ := l.Begin("a")
		if a == nil {
			t.Fatal("attempt within the burst refused")
		}
		as = append(as, a)
	}
	if a, retry := l.Begin("a"); a != nil || retry < time.Second {
		t.Fatalf("fourth concurrent attempt: %v, retry %s", a, retry)
	}
	as[0].Done(false) // succeeded: its share is back
	a, _ := l.Begin("a")
	if a == nil {
		t.Fatal("share of a successful attempt not given back")
	}
	a.Done(true)
	as[1].Done(true)
	as[2].Done(true)
	if a, _ := l.Begin("a"); a != nil {
		t.Fatal("three failures of three allowed a fourth attempt")
	}
}

// TestMaxInflight: with MaxInflight, many concurrent attempts of one source
// begin (a NAT'd site joining at once) up to the cap, and failures still
// drain the bucket.
func TestMaxInflight(t *testing.T) {
	c := newClock()
	l := newTest(c, Config{Burst: 3, Every: time.Hour, MaxInflight: 10})
	var as []*Attempt
	for i := range 10 {
		a, _ := l.Begin("a")
		if a == nil {
			t.Fatalf("concurrent attempt %d of 10 refused", i+1)
		}
		as = append(as, a)
	}
	if a, retry := l.Begin("a"); a != nil || retry < time.Second {
		t.Fatalf("attempt beyond MaxInflight: %v, retry %s", a, retry)
	}
	if a, _ := l.Begin("b"); a == nil {
		t.Fatal("another source refused")
	} else {
		a.Done(false)
	}
	for _, a := range as[:7] {
		a.Done(false)
	}
	for _, a := range as[7:] {
		a.Done(true)
	}
	if a, _ := l.Begin("a"); a != nil {
		t.Fatal("three failures of a burst of three allowed another attempt")
	}
}

func TestConcurrentUse(t *testing.T) {
	l := New(Config{Burst: 5, Every: time.Millisecond})
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			src := fmt.Sprint("s", i%3)
			for j := range 1000 {
				if ok, _ := l.Allow(src); ok {
					l.Fail(src)
				} else {
					l.Refused(src)
				}
				if a, _ := l.Begin(src); a != nil {
					a.Done(j%2 == 0)
				}
			}
		})
	}
	wg.Wait()
}

// TestMaxInflightDebt: a wave of concurrent failures larger than the burst
// is paid back in full before the source may try again, so concurrency
// cannot beat the long-run rate.
func TestMaxInflightDebt(t *testing.T) {
	c := newClock()
	l := newTest(c, Config{Burst: 3, Every: time.Minute, MaxInflight: 10})
	var as []*Attempt
	for range 10 {
		a, _ := l.Begin("a")
		if a == nil {
			t.Fatal("attempt of a source with no failures refused")
		}
		as = append(as, a)
	}
	for _, a := range as {
		a.Done(true)
	}
	c.advance(7 * time.Minute) // 7 failures forgiven: the debt of 7 is paid, the bucket is empty
	if a, retry := l.Begin("a"); a != nil || retry < time.Second {
		t.Fatalf("after paying back the debt only: %v, retry %s; want a refusal", a, retry)
	}
	c.advance(time.Minute)
	a, _ := l.Begin("a")
	if a == nil {
		t.Fatal("still refused once the debt is paid and one failure forgiven")
	}
	a.Done(false)
}
