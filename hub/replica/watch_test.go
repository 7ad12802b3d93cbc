package replica

import (
	"context"
	"encoding/json"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tether-dev/tether/tunnel"
)

// pokeRecorder stands in for the hub's tunnel listener: it records the
// targets a replica pokes.
type pokeRecorder struct {
	mu      sync.Mutex
	targets []tunnel.PokeTarget
	calls   chan struct{}
}

func newPokeRecorder() *pokeRecorder { return &pokeRecorder{calls: make(chan struct{}, 16)} }

func (r *pokeRecorder) poke(ts []tunnel.PokeTarget) int {
	r.mu.Lock()
	r.targets = append(r.targets, ts...)
	r.mu.Unlock()
	r.calls <- struct{}{}
	return len(ts)
}

func (r *pokeRecorder) got() []tunnel.PokeTarget {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]tunnel.PokeTarget(nil), r.targets...)
}

func sessionWithPoke(t *testing.T, target tunnel.PokeTarget) []byte {
	t.Helper()
	b, err := json.Marshal(SessionInfo{StateDir: "/var/lib/tether-edge", Poke: target.String()})
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// A replica links to every live replica without being asked to forward
// anything, and when one dies outright (its links reset, it answers no
// dial) pokes the QUIC agents recorded with that replica's presence, once,
// within a few seconds; nodes without a poke target are skipped.
func TestDeadReplicaAgentsPoked(t *testing.T) {
	st := openStore(t)
	c := testCA(t)
	rec := newPokeRecorder()
	a := startReplica(t, st, c, "a", echoHold(t), quickLeases, func(cfg *Config) { cfg.Poke = rec.poke })
	b := startReplica(t, st, c, "b", echoHold(t), quickLeases)
	ctx := context.Background()
	target := tunnel.PokeTarget{Key: [16]byte{7}, Token: [16]byte{9}, Addr: netip.MustParseAddrPort("127.0.0.1:40001")}
	b.p.Connected(ctx, "n1", sessionWithPoke(t, target))
	b.p.Connected(ctx, "n2", []byte(`{"state_dir":"/x"}`)) // a TCP agent's: nothing to poke
	waitUntil(t, "a's link to b", 10*time.Second, func() bool { return a.p.linked("b") })

	crash(b)
	killed := time.Now()
	select {
	case <-rec.calls:
	case <-time.After(peerConfirmTimeout + 3*time.Second):
		t.Fatal("a poked nobody after b died")
	}
	t.Logf("b's agents poked %v after the crash", time.Since(killed).Round(time.Millisecond))
	if got := rec.got(); len(got) != 1 || got[0] != target {
		t.Fatalf("a poked %+v, want b's QUIC agent %+v", got, target)
	}
	if n := testutil.ToFloat64(a.p.m.poked); n != 1 {
		t.Errorf("tether_peer_agents_poked_total = %v, want 1", n)
	}
	// Once per loss: the redials at later heartbeats poke no more.
	a.p.linkLost("b")
	time.Sleep(peerConfirmTimeout + 500*time.Millisecond)
	if got := rec.got(); len(got) != 1 {
		t.Errorf("a poked %d targets after a second look at the same loss, want still 1", len(got))
	}
}

// A link that ends while its peer still answers (a blip between the
// replicas) is dialed again and pokes nobody.
func TestLiveReplicaNotPoked(t *testing.T) {
	st := openStore(t)
	c := testCA(t)
	rec := newPokeRecorder()
	a := startReplica(t, st, c, "a", echoHold(t), quickLeases, func(cfg *Config) { cfg.Poke = rec.poke })
	b := startReplica(t, st, c, "b", echoHold(t), quickLeases)
	target := tunnel.PokeTarget{Key: [16]byte{7}, Token: [16]byte{9}, Addr: netip.MustParseAddrPort("127.0.0.1:40001")}
	b.p.Connected(context.Background(), "n1", sessionWithPoke(t, target))
	waitUntil(t, "a's link to b", 10*time.Second, func() bool { return a.p.linked("b") })
	a.p.mu.Lock()
	a.p.links["b"].sess.Close()
	a.p.mu.Unlock()
	waitUntil(t, "a's link to b again", 10*time.Second, func() bool { return a.p.linked("b") })
	time.Sleep(500 * time.Millisecond)
	if got := rec.got(); len(got) != 0 {
		t.Fatalf("a poked %+v though b answers", got)
	}
}

// quickLeases heartbeat (and link up) every half second.
func quickLeases(cfg *Config) { cfg.LeaseTTL = 1500 * time.Millisecond }

func waitUntil(t *testing.T, what string, d time.Duration, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("no %s after %s", what, d)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
