// Package ratelimit bounds failed attempts per source address: bad SSH
// logins at the bastion, bad join requests at the join endpoint, refused
// tunnel sessions in the audit log. Each source has a token bucket
// (golang.org/x/time/rate) that failures drain and time refills; a source
// with an empty bucket is refused until it refills, while every other
// source is unaffected.
//
// Sources are IPv4 addresses and IPv6 /64 prefixes (one host usually has a
// whole /64). Memory is bounded: at most MaxSources are tracked, and once
// the table is full of sources that are still limited, new ones share one
// bucket, so an attacker with many addresses limits only them.
package ratelimit

import (
	"net"
	"net/netip"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// Config tunes a Limiter. Zero fields take defaults.
type Config struct {
	// Burst is how many failures a source may have at once, default 20.
	Burst int
	// Every is how often one failure is forgiven, default 2s.
	Every time.Duration
	// MaxSources bounds the sources tracked, default 10000.
	MaxSources int
	// ReportEvery is how often a source that stays refused is reported
	// again (for an audit event that counts the refusals in between),
	// default 1 minute.
	ReportEvery time.Duration
	// ExplainEvery is how often a refused source is given a full
	// explanation (which costs the server more than a bare refusal),
	// default 2s.
	ExplainEvery time.Duration
	// MaxInflight, when positive, lets a source with no recent failure (a
	// full bucket) have up to MaxInflight attempts under way at once
	// without drawing on the bucket: for endpoints where one address
	// legitimately makes many attempts at once, such as a site behind NAT
	// whose machines all join when it powers up. Once it has failed,
	// attempts under way count against its bucket again, and failures
	// beyond the bucket put it in debt, so the long-run rate stays one
	// failure per Every. Zero always counts attempts under way (see
	// Attempt), which bounds how many slow handshakes one source can hold
	// open.
	MaxInflight int
	// Now is the clock, for tests; default time.Now.
	Now func() time.Time
}

// Limiter tracks failures per source. It is safe for concurrent use.
type Limiter struct {
	cfg Config

	mu       sync.Mutex
	sources  map[string]*entry
	overflow *entry // shared by new sources while the table is full
}

type entry struct {
	bucket      *rate.Limiter
	lastReport  time.Time // last refusal reported
	lastExplain time.Time
	suppressed  int // refusals since lastReport
	refusing    bool
	inflight    int // attempts begun and not done
}

// New returns a Limiter.
func New(cfg Config) *Limiter {
	if cfg.Burst <= 0 {
		cfg.Burst = 20
	}
	if cfg.Every <= 0 {
		cfg.Every = 2 * time.Second
	}
	if cfg.MaxSources <= 0 {
		cfg.MaxSources = 10000
	}
	if cfg.ReportEvery <= 0 {
		cfg.ReportEvery = time.Minute
	}
	if cfg.ExplainEvery <= 0 {
		cfg.ExplainEvery = 2 * time.Second
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	l := &Limiter{cfg: cfg, sources: map[string]*entry{}}
	l.overflow = l.newEntry()
	return l
}

func (l *Limiter) newEntry() *entry {
	return &entry{bucket: rate.NewLimiter(rate.Every(l.cfg.Every), l.cfg.Burst)}
}

// Source is the key of a remote address ("IP:PORT" or "IP"): the IPv4
// address, or the /64 of an IPv6 one. Anything unparseable is its own key.
func Source(remote string) string {
	host := remote
	if h, _, err := net.SplitHostPort(remote); err == nil {
		host = h
	}
	a, err := netip.ParseAddr(host)
	if err != nil {
		// The whole string, not the host part: a key fed back in must map
		// to itself ("[:]:" has host ":", whose own host part is "").
		return remote
	}
	a = a.Unmap().WithZone("")
	if a.Is4() {
		return a.String()
	}
	p, _ := a.Prefix(64)
	return p.String()
}

// get returns src's entry, creating it if there is room. Caller holds mu.
func (l *Limiter) get(src string, create bool, now time.Time) *entry {
	if e, ok := l.sources[src]; ok {
		return e
	}
	if !create {
		return nil
	}
	if len(l.sources) >= l.cfg.MaxSources {
		l.sweep(now)
	}
	if len(l.sources) >= l.cfg.MaxSources {
		return l.overflow
	}
	e := l.newEntry()
	l.sources[src] = e
	return e
}

// sweep forgets sources whose bucket is full again and that have nothing
// left to report: they are indistinguishable from new ones.
func (l *Limiter) sweep(now time.Time) {
	for k, e := range l.sources {
		if e.bucket.TokensAt(now) >= float64(l.cfg.Burst) && e.suppressed == 0 && e.inflight == 0 {
			delete(l.sources, k)
		}
	}
}

// Allow reports whether src may make an attempt now (its bucket holds at
// least one failure's worth); if not, retry is how long until it may.
func (l *Limiter) Allow(src string) (ok bool, retry time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Now()
	e := l.get(src, false, now)
	if e == nil {
		if len(l.sources) < l.cfg.MaxSources {
			return true, 0
		}
		e = l.overflow
	}
	tokens := e.bucket.TokensAt(now)
	if tokens >= 1 {
		e.refusing = false
		return true, 0
	}
	retry = time.Duration((1 - tokens) * float64(l.cfg.Every))
	return false, max(retry, time.Second)
}

// Attempt is one try of a source that is counted against it while it is
// under way, so concurrent attempts cannot overrun the limit: a source with
// n attempts in flight needs n+1 failures' worth in its bucket to begin
// another (unless Config.MaxInflight is set).
type Attempt struct {
	l *Limiter
	e *entry
}

// Begin starts an attempt by src, or refuses it (nil) and says how long
// until src may try again. Every Attempt must end with Done.
func (l *Limiter) Begin(src string) (*Attempt, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Now()
	e := l.get(src, true, now)
	tokens := e.bucket.TokensAt(now)
	if l.cfg.MaxInflight > 0 && tokens >= float64(l.cfg.Burst) {
		// A source with no failure to its name (full bucket) may have up
		// to MaxInflight attempts under way; its first failure ends that.
		if e.inflight >= l.cfg.MaxInflight {
			return nil, time.Second
		}
	} else {
		tokens -= float64(e.inflight)
	}
	if tokens < 1 {
		return nil, max(time.Duration((1-tokens)*float64(l.cfg.Every)), time.Second)
	}
	e.inflight++
	e.refusing = false
	return &Attempt{l: l, e: e}, 0
}

// Done ends the attempt; a failed one takes a failure's worth from its
// source's bucket.
func (a *Attempt) Done(failed bool) {
	a.l.mu.Lock()
	defer a.l.mu.Unlock()
	a.e.inflight--
	if failed {
		// ReserveN, not AllowN: a failure that began while tokens were
		// left still costs one when the bucket is empty by now (debt),
		// so concurrent attempts cannot beat the rate.
		a.e.bucket.ReserveN(a.l.cfg.Now(), 1)
	}
}

// Fail records a failed attempt by src.
func (l *Limiter) Fail(src string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Now()
	l.get(src, true, now).bucket.AllowN(now, 1)
}

// Refusal says what to do about one refused attempt.
type Refusal struct {
	// Report is true for the first refusal of a source that was not being
	// refused, and then once per ReportEvery: an audit event is written
	// only then, so a flood cannot flood the audit log.
	Report bool
	// Suppressed counts the refusals of this source not reported since the
	// last report (this one excluded).
	Suppressed int
	// Explain is true at most once per ExplainEvery per source: the caller
	// may spend effort on a clear message (an SSH banner), and otherwise
	// refuses as cheaply as it can.
	Explain bool
}

// Refused records that an attempt of src was refused by Allow.
func (l *Limiter) Refused(src string) Refusal {
	l.mu.Lock()
	defer l.mu.Unlock()
	now := l.cfg.Now()
	e := l.get(src, true, now)
	var r Refusal
	if !e.refusing || now.Sub(e.lastReport) >= l.cfg.ReportEvery {
		r.Report, r.Suppressed = true, e.suppressed
		e.refusing, e.lastReport, e.suppressed = true, now, 0
	} else {
		e.suppressed++
	}
	if now.Sub(e.lastExplain) >= l.cfg.ExplainEvery {
		r.Explain = true
		e.lastExplain = now
	}
	return r
}

// Tracked is the number of sources tracked (for tests and metrics).
func (l *Limiter) Tracked() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.sources)
}
