package sim

import (
	"crypto/sha256"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/tether-dev/tether/tunnel/control"
)

// pushWatch observes the access pushes (authorized keys, SSH trust) the
// hub sends to every agent of a Sim, so that a scenario can time an access
// change to the last agent and count the pushes an agent did not need.
type pushWatch struct {
	mu     sync.RWMutex // guards want
	want   func(keys []string) bool
	agents []agentPushes
	last   atomic.Int64 // unix nanoseconds of the last push to any agent
}

type agentPushes struct {
	mu       sync.Mutex
	gotKeys  bool
	keys     []string // the last authorized keys pushed
	gotTrust bool
	trust    [sha256.Size]byte // digest of the last SSH trust, host certificate left out
	wantAt   time.Time         // when keys first satisfied the watch
	// Pushes since Watch, and of those the ones that changed nothing here.
	keysN, keysSame, trustN, trustSame int
}

// PushStats describes the access pushes agents received since Watch.
type PushStats struct {
	Keys, Trust int // authorized-keys and SSH-trust pushes received
	// KeysUnchanged and TrustUnchanged are the pushes that left the agent
	// where it was: the same key list, or the same trust apart from a
	// re-signed host certificate (which an access change does not need).
	KeysUnchanged, TrustUnchanged int
	AgentsPushed                  int       // agents that got any push
	AgentsNeedless                int       // agents whose every push changed nothing
	Have                          int       // agents whose authorized keys satisfy the watch
	Last                          time.Time // when the last of those got there
	LastPush                      time.Time // the last push to any agent (zero: none)
}

func (w *pushWatch) onControl(i int) func(*control.Message) {
	return func(m *control.Message) {
		var digest [sha256.Size]byte
		switch m.Type {
		case control.TypeAuthorizedKeys:
		case control.TypeSSHTrust:
			if m.SSHTrust == nil {
				return
			}
			digest = trustDigest(m.SSHTrust)
		default:
			return
		}
		now := time.Now()
		w.last.Store(now.UnixNano())
		w.mu.RLock()
		want := w.want
		w.mu.RUnlock()
		a := &w.agents[i]
		a.mu.Lock()
		defer a.mu.Unlock()
		if m.Type == control.TypeSSHTrust {
			a.trustN++
			if a.gotTrust && a.trust == digest {
				a.trustSame++
			}
			a.trust, a.gotTrust = digest, true
			return
		}
		a.keysN++
		if a.gotKeys && slices.Equal(a.keys, m.AuthorizedKeys) {
			a.keysSame++
		}
		a.keys, a.gotKeys = m.AuthorizedKeys, true
		if want != nil && a.wantAt.IsZero() && want(a.keys) {
			a.wantAt = now
		}
	}
}

// trustDigest covers everything in t but the host certificate.
func trustDigest(t *control.SSHTrust) [sha256.Size]byte {
	h := sha256.New()
	put := func(ss ...string) {
		for _, s := range ss {
			h.Write([]byte(s))
			h.Write([]byte{0})
		}
		h.Write([]byte{1})
	}
	put(t.UserCAs...)
	put(t.RevokedKeys...)
	logins := make([]string, 0, len(t.Principals))
	for l := range t.Principals {
		logins = append(logins, l)
	}
	slices.Sort(logins)
	for _, l := range logins {
		put(l)
		put(t.Principals[l]...)
	}
	put(t.AnyLogin...)
	var d [sha256.Size]byte
	h.Sum(d[:0])
	return d
}

// Watch starts a new observation of access pushes: counts restart from zero,
// and every agent is timed until the authorized keys it holds satisfy want
// (an agent whose keys already do counts as there at once).
func (s *Sim) Watch(want func(keys []string) bool) {
	w := &s.pushes
	w.mu.Lock()
	w.want = want
	w.mu.Unlock()
	now := time.Now()
	w.last.Store(0)
	for i := range w.agents {
		a := &w.agents[i]
		a.mu.Lock()
		a.keysN, a.keysSame, a.trustN, a.trustSame = 0, 0, 0, 0
		a.wantAt = time.Time{}
		if want != nil && a.gotKeys && want(a.keys) {
			a.wantAt = now
		}
		a.mu.Unlock()
	}
}

// Pushes reports the access pushes since Watch.
func (s *Sim) Pushes() PushStats {
	w := &s.pushes
	var ps PushStats
	if ns := w.last.Load(); ns != 0 {
		ps.LastPush = time.Unix(0, ns)
	}
	for i := range w.agents {
		a := &w.agents[i]
		a.mu.Lock()
		ps.Keys += a.keysN
		ps.KeysUnchanged += a.keysSame
		ps.Trust += a.trustN
		ps.TrustUnchanged += a.trustSame
		if n := a.keysN + a.trustN; n > 0 {
			ps.AgentsPushed++
			if a.keysSame+a.trustSame == n {
				ps.AgentsNeedless++
			}
		}
		if !a.wantAt.IsZero() {
			ps.Have++
			if a.wantAt.After(ps.Last) {
				ps.Last = a.wantAt
			}
		}
		a.mu.Unlock()
	}
	return ps
}

// MergePushes adds up the push stats of several Sims watched together.
func MergePushes(all ...PushStats) PushStats {
	var ps PushStats
	for _, p := range all {
		ps.Keys += p.Keys
		ps.Trust += p.Trust
		ps.KeysUnchanged += p.KeysUnchanged
		ps.TrustUnchanged += p.TrustUnchanged
		ps.AgentsPushed += p.AgentsPushed
		ps.AgentsNeedless += p.AgentsNeedless
		ps.Have += p.Have
		if p.Last.After(ps.Last) {
			ps.Last = p.Last
		}
		if p.LastPush.After(ps.LastPush) {
			ps.LastPush = p.LastPush
		}
	}
	return ps
}
