package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/jobs"
	"github.com/tether-dev/tether/hub/store"
)

// fakeConn accepts uploads and runs every script with exit status 0.
type fakeConn struct{}

func (fakeConn) Run(context.Context, jobs.Command, io.Writer, io.Writer) (int, error) { return 0, nil }
func (fakeConn) Upload(_ context.Context, src io.Reader, _ int64, _ string, _ os.FileMode, _ bool) (string, error) {
	h := sha256.New()
	if _, err := io.Copy(h, src); err != nil {
		return "", err
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
func (fakeConn) Exists(context.Context, string) (bool, error) { return false, nil }
func (fakeConn) Close() error                                 { return nil }

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A node registered for an engine but offline is removed, and a new machine
// joins under its name and connects: the newcomer is not a member, nothing
// is installed on it, and the removed node's worker ends.
func TestRecycledNameInheritsNoMembership(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	blobs, err := jobs.NewBlobs(filepath.Join(dir, "blobs"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	// resolve finds a node the way the hub's presence check does, whatever
	// the controller hands over (an ID; a name on code that keyed members by
	// name).
	resolve := func(ref string) (store.Node, error) {
		if n, err := st.GetNode(ctx, ref); err == nil {
			return n, nil
		}
		return st.GetNodeByName(ctx, ref)
	}
	var mu sync.Mutex
	online := map[string]bool{} // node ID
	installed := map[string]int{}
	presence := func(ref string) string {
		n, err := resolve(ref)
		mu.Lock()
		defer mu.Unlock()
		if err != nil || !online[n.ID] {
			return "offline"
		}
		return ""
	}
	eng := jobs.New(ctx, jobs.Config{Store: st, Blobs: blobs, FlushInterval: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond,
		Online: presence,
		Connect: func(_ context.Context, ref string) (jobs.Conn, error) {
			n, err := resolve(ref)
			if err != nil {
				return nil, err
			}
			mu.Lock()
			installed[n.ID]++
			mu.Unlock()
			return fakeConn{}, nil
		},
	})
	defer eng.Close()
	c := New(Config{Store: st, Jobs: eng, Blobs: blobs, Online: presence, Recheck: 20 * time.Millisecond})
	done := make(chan error, 1)
	go func() { done <- c.Run(ctx) }()
	defer func() { cancel(); <-done }()
	<-c.started

	join := func(id, name string) {
		t.Helper()
		if err := st.CreateToken(ctx, store.Token{ID: "t-" + id, SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Join(ctx, "t-"+id, func(store.Token) error { return nil }, store.Node{ID: id, Name: name}); err != nil {
			t.Fatal(err)
		}
	}
	join("id-old", "edge")
	if _, err := c.Register(ctx, "edge", "k3s", "test"); err != nil {
		t.Fatal(err)
	}
	// Offline, the member waits in install_in_progress for its node.
	waitFor(t, "the member to wait for its node", func() bool {
		all, err := st.ListClusterMembers(ctx)
		return err == nil && len(all) == 1 && all[0].State == "install_in_progress"
	})

	if err := st.DeleteNode(ctx, "id-old"); err != nil {
		t.Fatal(err)
	}
	join("id-new", "edge")
	mu.Lock()
	online["id-new"] = true
	mu.Unlock()
	c.Wake("id-new")
	c.Wake("id-old")
	c.Wake("edge")

	newcomerRuns := func() int {
		mu.Lock()
		defer mu.Unlock()
		return installed["id-new"]
	}
	waitFor(t, "the removed node's worker to end", func() bool {
		c.mu.Lock()
		defer c.mu.Unlock()
		return len(c.workers) == 0 || newcomerRuns() > 0
	})
	if n := newcomerRuns(); n > 0 {
		t.Fatalf("the engine was installed on the new machine that took the removed node's name (%d runs)", n)
	}
	if m, err := st.GetClusterMember(ctx, "id-new"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the newcomer is a member: %+v, %v", m, err)
	}
	if all, err := st.ListClusterMembers(ctx); err != nil || len(all) != 0 {
		t.Fatalf("members = %+v, %v", all, err)
	}
}

// On hub replicas only the leader runs the controller, once per term: a
// member registered on another replica (whose controller never runs) is
// driven by the leader's, also after the leader's term ended and a new
// one began in the same process.
func TestMembersRegisteredElsewhereAreDrivenByTheLeader(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	blobs, err := jobs.NewBlobs(filepath.Join(dir, "blobs"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	installs := map[string]int{} // node ID
	eng := jobs.New(ctx, jobs.Config{Store: st, Blobs: blobs, FlushInterval: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond,
		Connect: func(_ context.Context, id string) (jobs.Conn, error) {
			mu.Lock()
			installs[id]++
			mu.Unlock()
			return fakeConn{}, nil
		},
	})
	defer eng.Close()
	installed := func(id string) func() bool {
		return func() bool {
			mu.Lock()
			defer mu.Unlock()
			return installs[id] > 0
		}
	}
	for _, id := range []string{"n1", "n2"} {
		if err := st.CreateToken(ctx, store.Token{ID: "t-" + id, SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour)}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Join(ctx, "t-"+id, func(store.Token) error { return nil }, store.Node{ID: id, Name: "edge-" + id}); err != nil {
			t.Fatal(err)
		}
	}
	follower := New(Config{Store: st, Jobs: eng, Blobs: blobs, Recheck: time.Hour})
	leader := New(Config{Store: st, Jobs: eng, Blobs: blobs, Recheck: time.Hour})
	term := func() (stop func()) {
		tctx, tcancel := context.WithCancel(ctx)
		done := make(chan error, 1)
		go func() { done <- leader.Run(tctx) }()
		return func() {
			tcancel()
			if err := <-done; err != nil {
				t.Errorf("term ended with %v", err)
			}
		}
	}

	stop := term()
	if _, err := follower.Register(ctx, "edge-n1", "k3s", "test"); err != nil {
		t.Fatal(err)
	}
	leader.Rescan() // the change feed's nudge
	waitFor(t, "the leader to install n1, registered on another replica", installed("n1"))
	stop()

	// A new term in the same process: nothing left from the last one
	// keeps it from driving a member registered meanwhile.
	if _, err := follower.Register(ctx, "edge-n2", "k3s", "test"); err != nil {
		t.Fatal(err)
	}
	stop = term()
	defer stop()
	waitFor(t, "the leader's next term to install n2", installed("n2"))
}
