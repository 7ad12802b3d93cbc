package store

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// The replica tests take a ReplicaStore and run on every backend.
func TestReplicaStore(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		for name, f := range replicaStoreTests {
			t.Run(name, func(t *testing.T) { f(t, openTest(t)) })
		}
	})
}

var replicaStoreTests = map[string]func(*testing.T, ReplicaStore){
	"PresenceEpochs":       testPresenceEpochs,
	"PresenceLeases":       testPresenceLeases,
	"PresenceHeldBy":       testPresenceHeldBy,
	"SecretFirstWriteWins": testSecretFirstWriteWins,
	"Replicas":             testReplicas,
}

// A late disconnect from an earlier connection never erases the node's
// newer claim, on the same replica or another one.
func testPresenceEpochs(t *testing.T, s ReplicaStore) {
	ctx := context.Background()
	lease := time.Now().Add(time.Minute)
	a1, err := s.ClaimPresence(ctx, Presence{NodeID: "n1", ReplicaID: "a", LeaseUntil: lease})
	if err != nil {
		t.Fatal(err)
	}
	b2, err := s.ClaimPresence(ctx, Presence{
		NodeID:     "n1",
		ReplicaID:  "b",
		LeaseUntil: lease,
		Session:    []byte(`{"state_dir":"/b"}`),
	})
	if err != nil {
		t.Fatal(err)
	}
	if b2.Epoch <= a1.Epoch {
		t.Fatalf("epochs %d then %d: want growing", a1.Epoch, b2.Epoch)
	}
	if err := s.ReleasePresence(ctx, a1); !errors.Is(err, ErrStale) {
		t.Fatalf("late release of replica a's claim: %v, want ErrStale", err)
	}
	p, err := s.GetPresence(ctx, "n1")
	if err != nil || p.ReplicaID != "b" || p.Epoch != b2.Epoch || !p.Live(time.Now()) ||
		string(p.Session) != `{"state_dir":"/b"}` {
		t.Fatalf("after the stale release: %+v, %v; want replica b's claim", p, err)
	}
	// The same replica reconnecting: the earlier session's end is stale too.
	b3, err := s.ClaimPresence(ctx, Presence{NodeID: "n1", ReplicaID: "b", LeaseUntil: lease})
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ReleasePresence(ctx, b2); !errors.Is(err, ErrStale) {
		t.Fatalf("release of an earlier epoch on the same replica: %v, want ErrStale", err)
	}
	if err := s.ReleasePresence(ctx, b3); err != nil {
		t.Fatalf("release of the current claim: %v", err)
	}
	if p, err := s.GetPresence(ctx, "n1"); err != nil || p.Live(time.Now()) || p.Epoch != b3.Epoch || p.Session != nil {
		t.Fatalf("after release: %+v, %v; want a released claim keeping epoch %d", p, err, b3.Epoch)
	}
	// Epochs keep growing after a release, so an old release stays stale.
	a4, err := s.ClaimPresence(ctx, Presence{NodeID: "n1", ReplicaID: "a", LeaseUntil: lease})
	if err != nil || a4.Epoch <= b3.Epoch {
		t.Fatalf("claim after release: %+v, %v; want epoch above %d", a4, err, b3.Epoch)
	}
	if err := s.ReleasePresence(ctx, a1); !errors.Is(err, ErrStale) {
		t.Fatalf("first claim released again: %v, want ErrStale", err)
	}
	if _, err := s.GetPresence(ctx, "never"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("presence of an unknown node: %v, want ErrNotFound", err)
	}
}

// A replica's claims are listed with their sessions, expired or not, and
// without the claims it released or another replica took over.
func testPresenceHeldBy(t *testing.T, s ReplicaStore) {
	ctx := context.Background()
	past, future := time.Now().Add(-time.Minute), time.Now().Add(time.Minute)
	claims := []Presence{
		{NodeID: "n1", ReplicaID: "a", LeaseUntil: future, Session: []byte(`{"poke":"1"}`)},
		{NodeID: "n2", ReplicaID: "a", LeaseUntil: past, Session: []byte(`{"poke":"2"}`)},
		{NodeID: "n3", ReplicaID: "a", LeaseUntil: future},
		{NodeID: "n3", ReplicaID: "b", LeaseUntil: future}, // taken over
		{NodeID: "n4", ReplicaID: "a", LeaseUntil: future},
	}
	var n4 Presence
	for _, c := range claims {
		got, err := s.ClaimPresence(ctx, c)
		if err != nil {
			t.Fatal(err)
		}
		n4 = got
	}
	if err := s.ReleasePresence(ctx, n4); err != nil {
		t.Fatal(err)
	}
	got, err := s.PresenceHeldBy(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].NodeID != "n1" || string(got[0].Session) != `{"poke":"1"}` ||
		got[1].NodeID != "n2" || string(got[1].Session) != `{"poke":"2"}` || got[1].Live(time.Now()) {
		t.Fatalf("PresenceHeldBy(a) = %+v; want n1 and n2 (expired) with their sessions", got)
	}
	if got, err := s.PresenceHeldBy(ctx, "nobody"); err != nil || len(got) != 0 {
		t.Fatalf("PresenceHeldBy(nobody) = %+v, %v", got, err)
	}
}

// A replica's heartbeat extends its own claims only; a replica that stops
// heartbeating loses its claims when the lease runs out.
func testPresenceLeases(t *testing.T, s ReplicaStore) {
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond)
	if _, err := s.ClaimPresence(ctx, Presence{
		NodeID: "n1", ReplicaID: "a", LeaseUntil: now.Add(time.Second),
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.ClaimPresence(ctx, Presence{
		NodeID: "n2", ReplicaID: "b", LeaseUntil: now.Add(time.Second),
	}); err != nil {
		t.Fatal(err)
	}
	later := now.Add(time.Hour)
	if err := s.HeartbeatReplica(ctx, Replica{ID: "a", PeerAddr: "a:1", LeaseUntil: later}); err != nil {
		t.Fatal(err)
	}
	p1, _ := s.GetPresence(ctx, "n1")
	p2, _ := s.GetPresence(ctx, "n2")
	if !p1.LeaseUntil.Equal(later) {
		t.Fatalf("n1 lease %v after a's heartbeat, want %v", p1.LeaseUntil, later)
	}
	if !p2.LeaseUntil.Equal(now.Add(time.Second)) {
		t.Fatalf("n2 (held by b) lease %v changed by a's heartbeat", p2.LeaseUntil)
	}
	if p2.Live(now.Add(2 * time.Second)) {
		t.Fatal("b's claim still live after its lease ran out")
	}
	live, err := s.ListPresence(ctx)
	if err != nil || len(live) != 2 {
		t.Fatalf("ListPresence: %+v, %v", live, err)
	}
	if err := s.DeleteReplica(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if p, _ := s.GetPresence(ctx, "n1"); p.ReplicaID != "" {
		t.Fatalf("n1 still held by %q after its replica was deleted", p.ReplicaID)
	}
}

// Replicas starting together each offer an identity; exactly one is kept
// and every replica reads that one.
func testSecretFirstWriteWins(t *testing.T, s ReplicaStore) {
	ctx := context.Background()
	if _, err := s.GetSecret(ctx, "id"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("unset secret: %v, want ErrNotFound", err)
	}
	const n = 8
	got := make([][]byte, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			v, err := s.PutSecretIfAbsent(ctx, "id", []byte(fmt.Sprintf("replica-%d", i)))
			if err != nil {
				t.Error(err)
			}
			got[i] = v
		}()
	}
	wg.Wait()
	for i := range n {
		if !bytes.Equal(got[i], got[0]) {
			t.Fatalf("replica %d got %q, replica 0 got %q: want one identity", i, got[i], got[0])
		}
	}
	if v, err := s.GetSecret(ctx, "id"); err != nil || !bytes.Equal(v, got[0]) {
		t.Fatalf("GetSecret: %q, %v; want %q", v, err, got[0])
	}
}

func testReplicas(t *testing.T, s ReplicaStore) {
	ctx := context.Background()
	now := time.Now().Truncate(time.Millisecond)
	r := Replica{
		ID:         "b",
		PeerAddr:   "h:7444",
		APIAddr:    "h:7443",
		SSHAddr:    "h:2222",
		Version:    "v1",
		Started:    now,
		LeaseUntil: now.Add(time.Minute),
		Links:      []string{"a"},
		Hubs:       []string{"hub.example:7443"},
	}
	if err := s.HeartbeatReplica(ctx, Replica{ID: "a", LeaseUntil: now}); err != nil {
		t.Fatal(err)
	}
	if err := s.HeartbeatReplica(ctx, r); err != nil {
		t.Fatal(err)
	}
	r.PeerAddr = "h2:7444"
	if err := s.HeartbeatReplica(ctx, r); err != nil {
		t.Fatal(err)
	}
	all, err := s.ListReplicas(ctx)
	if err != nil || len(all) != 2 {
		t.Fatalf("ListReplicas: %+v, %v", all, err)
	}
	got := all[1]
	if got.ID != "b" || got.PeerAddr != "h2:7444" || got.APIAddr != r.APIAddr || !got.Started.Equal(now) ||
		len(got.Links) != 1 || got.Links[0] != "a" || len(got.Hubs) != 1 || got.Hubs[0] != r.Hubs[0] {
		t.Fatalf("replica b: %+v, want %+v", got, r)
	}
	if a := all[0]; a.ID != "a" || a.Hubs == nil || len(a.Hubs) != 0 {
		t.Fatalf("replica a, recorded without hub addresses: %+v, want an empty list", a)
	}
}
