package replica

import (
	"context"
	"errors"
	"net"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/tunnel"
)

// crash stops replica r as a kill -9 does: its links and listener go, its
// rows stay in the store with their leases running.
func crash(r testReplica) {
	r.p.cancel()
	r.p.ln.Close()
}

// A stream entering replica a for a node held by replica b, after b died
// with its lease still running, fails at once with the reason (b stopped
// answering, the node has not reconnected here) whether a had a link to b
// or not, and matches access.ErrOffline. Later streams fail at once too.
func TestPeerRouteHolderGone(t *testing.T) {
	for _, linked := range []bool{true, false} {
		name := map[bool]string{true: "with a link to the holder", false: "without a link"}[linked]
		t.Run(name, func(t *testing.T) {
			st := openStore(t)
			c := testCA(t)
			a := startReplica(t, st, c, "a", echoHold(t))
			b := startReplica(t, st, c, "b", echoHold(t))
			ctx := context.Background()
			b.p.Connected(ctx, "n1", nil)
			if linked {
				r, _, _ := a.p.Route(ctx, node("n1"))
				s, err := r.Dial(ctx, tunnel.Header{Service: tunnel.ServiceSSH})
				if err != nil {
					t.Fatal(err)
				}
				s.Close()
			}
			crash(b)
			killed := time.Now()
			for i := range 3 {
				r, ok, err := a.p.Route(ctx, node("n1"))
				if !ok || err != nil {
					t.Fatalf("route while b's lease runs: %v %v", ok, err)
				}
				began := time.Now()
				_, err = r.Dial(ctx, tunnel.Header{Service: tunnel.ServiceSSH})
				took := time.Since(began)
				var gone *access.ReplicaGoneError
				if !errors.As(err, &gone) || !errors.Is(err, access.ErrOffline) {
					t.Fatalf("stream %d to n1 after its replica died: %v, want a ReplicaGoneError", i, err)
				}
				want := "node n1 was connected to replica b, which stopped answering at "
				if !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "not reconnected here yet") {
					t.Fatalf("stream %d: error %q, want one saying %q", i, err, want)
				}
				if gone.Since.Before(killed.Add(-time.Second)) || gone.Since.After(time.Now()) {
					t.Errorf("stream %d: gone since %s, want about the kill at %s", i, gone.Since, killed)
				}
				if took > time.Second {
					t.Errorf("stream %d failed after %s, want at once", i, took)
				}
			}
			if got := testutil.ToFloat64(a.p.m.streams.WithLabelValues("out", "gone")); got != 3 {
				t.Errorf("a's streams counted gone: %v, want 3", got)
			}
		})
	}
}

// A holder whose machine fell silent (it takes the connection, answers
// nothing): a stream fails within the peer handshake time, with the
// reason, and the streams right after it at once, without dialing again.
func TestPeerRouteHolderSilent(t *testing.T) {
	st := openStore(t)
	c := testCA(t)
	a := startReplica(t, st, c, "a", echoHold(t))
	ctx := context.Background()
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			conn, err := silent.Accept()
			if err != nil {
				return
			}
			defer conn.Close()
		}
	}()
	if err := st.HeartbeatReplica(ctx, store.Replica{ID: "b", PeerAddr: silent.Addr().String(),
		LeaseUntil: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	if _, err := st.ClaimPresence(ctx, store.Presence{NodeID: "n1", ReplicaID: "b",
		LeaseUntil: time.Now().Add(time.Minute)}); err != nil {
		t.Fatal(err)
	}
	for i, bound := range []time.Duration{peerHandshake + time.Second, 200 * time.Millisecond} {
		r, ok, _ := a.p.Route(ctx, node("n1"))
		if !ok {
			t.Fatal("no route to n1")
		}
		began := time.Now()
		_, err := r.Dial(ctx, tunnel.Header{Service: tunnel.ServiceSSH})
		var gone *access.ReplicaGoneError
		if !errors.As(err, &gone) {
			t.Fatalf("stream %d to a node of a silent replica: %v, want a ReplicaGoneError", i, err)
		}
		if took := time.Since(began); took > bound {
			t.Errorf("stream %d failed after %s, want within %s", i, took, bound)
		}
	}
}

// The agent addresses of the live replicas, this one's first: what join
// strings and welcomes name.
func TestLiveHubs(t *testing.T) {
	now := time.Now()
	live, dead := now.Add(time.Minute), now.Add(-time.Second)
	self := store.Replica{ID: "b", Hubs: []string{"b:7443"}}
	for _, tc := range []struct {
		name string
		reps []store.Replica
		want []string
	}{
		{"alone", []store.Replica{{ID: "b", Hubs: []string{"b:7443"}, LeaseUntil: live}}, []string{"b:7443"}},
		{"others in ID order, the dead left out", []store.Replica{
			{ID: "a", Hubs: []string{"a:7443", "a6:7443"}, LeaseUntil: live},
			{ID: "b", Hubs: []string{"stale:1"}, LeaseUntil: live},
			{ID: "c", Hubs: []string{"c:7443"}, LeaseUntil: dead},
			{ID: "d", Hubs: []string{"d:7443"}, LeaseUntil: live},
		}, []string{"b:7443", "a:7443", "a6:7443", "d:7443"}},
		{"behind one load balancer", []store.Replica{
			{ID: "a", Hubs: []string{"b:7443"}, LeaseUntil: live},
			{ID: "c", Hubs: []string{"b:7443"}, LeaseUntil: live},
		}, []string{"b:7443"}},
		{"an earlier version records none", []store.Replica{{ID: "a", LeaseUntil: live}}, []string{"b:7443"}},
	} {
		if got := liveHubs(self, tc.reps, now); !slices.Equal(got, tc.want) {
			t.Errorf("%s: %v, want %v", tc.name, got, tc.want)
		}
	}
}

// Each replica publishes its agent addresses; every replica's Hubs names
// all live ones after a heartbeat, its own first.
func TestHubsPublished(t *testing.T) {
	st := openStore(t)
	c := testCA(t)
	a := startReplica(t, st, c, "a", echoHold(t))
	b := startReplica(t, st, c, "b", echoHold(t))
	if err := a.p.heartbeat(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		r    testReplica
		want []string
	}{
		{a, []string{"a.example:7443", "b.example:7443"}},
		{b, []string{"b.example:7443", "a.example:7443"}},
	} {
		if got := tc.r.p.Hubs(); !slices.Equal(got, tc.want) {
			t.Errorf("replica %s: Hubs %v, want %v", tc.r.p.ID(), got, tc.want)
		}
	}
}
