package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/blobs"
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
	blobs, err := blobs.New(filepath.Join(dir, "blobs"), 1<<20)
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
	eng := jobs.New(ctx, jobs.Config{Store: st, Blobs: blobs,
		FlushInterval: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond,
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
		if err := st.CreateToken(ctx, store.Token{
			ID: "t-" + id, SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour),
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Join(
			ctx, "t-"+id, func(store.Token) error { return nil }, store.Node{ID: id, Name: name},
		); err != nil {
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
	blobs, err := blobs.New(filepath.Join(dir, "blobs"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	installs := map[string]int{} // node ID
	eng := jobs.New(ctx, jobs.Config{Store: st, Blobs: blobs,
		FlushInterval: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond,
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
		if err := st.CreateToken(ctx, store.Token{
			ID: "t-" + id, SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour),
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := st.Join(
			ctx, "t-"+id, func(store.Token) error { return nil }, store.Node{ID: id, Name: "edge-" + id},
		); err != nil {
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

// gatedConn holds every install until release is closed and ends it with
// installExit; uninstalls end at once with 0 and are counted.
type gatedConn struct {
	fakeConn
	installing  chan<- struct{}
	release     <-chan struct{}
	installExit int
	uninstalls  *atomic.Int32
}

func (g gatedConn) Run(ctx context.Context, cmd jobs.Command, _, _ io.Writer) (int, error) {
	if len(cmd.Script) > 0 { // install.sh
		select {
		case g.installing <- struct{}{}:
		default:
		}
		select {
		case <-g.release:
		case <-ctx.Done():
			return -1, ctx.Err()
		}
		return g.installExit, nil
	}
	if strings.Contains(cmd.Line, "uninstall.sh") {
		g.uninstalls.Add(1)
	}
	return 0, nil
}

// clusterFixture is a store with node "edge" (id-edge) joined, a job
// engine whose connections are made by conn, and a running controller
// whose audit events are collected.
type clusterFixture struct {
	st     *store.DB
	c      *Controller
	mu     sync.Mutex
	events []store.AuditEvent
}

func newClusterFixture(t *testing.T, conn func() jobs.Conn) *clusterFixture {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := blobs.New(filepath.Join(dir, "blobs"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	eng := jobs.New(ctx, jobs.Config{Store: st, Blobs: blobs, FlushInterval: 10 * time.Millisecond,
		PollInterval: 10 * time.Millisecond,
		Connect:      func(context.Context, string) (jobs.Conn, error) { return conn(), nil }})
	f := &clusterFixture{st: st}
	f.c = New(Config{Store: st, Jobs: eng, Blobs: blobs, Recheck: 20 * time.Millisecond, RetryAfter: time.Hour,
		Audit: func(e store.AuditEvent) {
			f.mu.Lock()
			f.events = append(f.events, e)
			f.mu.Unlock()
		}})
	done := make(chan error, 1)
	go func() { done <- f.c.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		<-done
		eng.Close()
		st.Close()
	})
	<-f.c.started
	tok := store.Token{ID: "t-edge", SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour)}
	if err := st.CreateToken(ctx, tok); err != nil {
		t.Fatal(err)
	}
	node := store.Node{ID: "id-edge", Name: "edge"}
	if _, err := st.Join(ctx, tok.ID, func(store.Token) error { return nil }, node); err != nil {
		t.Fatal(err)
	}
	return f
}

func (f *clusterFixture) transitions() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []string
	for _, e := range f.events {
		if e.Kind == "cluster_transition" {
			out = append(out, e.Detail)
		}
	}
	return out
}

// `tether cluster register n2; tether cluster deregister n2` while the
// install runs: the deregister is kept (the install's end does not write
// desired back to active) and honoured when the install ends, whether it
// succeeded or failed, with the cached uninstall; the reasons say so, in
// words of what happened rather than the diagram's labels.
func TestDeregisterDuringInstall(t *testing.T) {
	for _, tc := range []struct {
		name        string
		installExit int
		installed   string // the install's reason
	}{
		{"install succeeds", 0,
			"install_in_progress -> active: installation command successful; the deregister requested during the install"},
		{"install fails", 1,
			"install_in_progress -> inactive: installation command failed; the deregister requested during the install"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			installing, release := make(chan struct{}, 1), make(chan struct{})
			var uninstalls atomic.Int32
			f := newClusterFixture(t, func() jobs.Conn {
				return gatedConn{installing: installing, release: release, installExit: tc.installExit, uninstalls: &uninstalls}
			})
			ctx := context.Background()
			if _, err := f.c.Register(ctx, "edge", "k3s", "test"); err != nil {
				t.Fatal(err)
			}
			select {
			case <-installing:
			case <-time.After(20 * time.Second):
				t.Fatal("the install never started")
			}
			m, err := f.c.Deregister(ctx, "edge", "test")
			if err != nil || m.Desired != "inactive" || m.State != "install_in_progress" {
				t.Fatalf("deregister during the install: %+v, %v", m, err)
			}
			close(release)
			waitFor(t, "the cached uninstall after the install", func() bool {
				m, err := f.st.GetClusterMember(ctx, "id-edge")
				return err == nil && m.State == "inactive" && uninstalls.Load() == 1
			})
			m, err = f.st.GetClusterMember(ctx, "id-edge")
			if err != nil || m.Desired != "inactive" {
				t.Fatalf("after the install ended: %+v, %v; the deregister was lost", m, err)
			}
			got := strings.Join(f.transitions(), "\n")
			for _, want := range []string{tc.installed, "-> deregistering: deregister requested",
				"uninstall_in_progress -> inactive: uninstallation command successful"} {
				if !strings.Contains(got, want) {
					t.Errorf("transitions lack %q:\n%s", want, got)
				}
			}
			if strings.Contains(got, "||") {
				t.Errorf("a reason is the diagram's label, not what happened:\n%s", got)
			}
			time.Sleep(100 * time.Millisecond) // a few rechecks: nothing more runs
			if n := uninstalls.Load(); n != 1 {
				t.Fatalf("%d uninstalls, want 1", n)
			}
		})
	}
}

// One node, one Kubernetes: registering a member of a KubeOne cluster is a
// conflict that names the cluster, and stores nothing.
func TestRegisterRefusesKubeOneMember(t *testing.T) {
	f := newClusterFixture(t, func() jobs.Conn { return fakeConn{} })
	ctx := context.Background()
	if err := f.st.CreateKubeOneCluster(ctx, store.KubeOneCluster{Name: "edge2", ID: "cid", Kubernetes: "1.30.5",
		Login: "root", CNI: "canal", PublicKey: "ssh-ed25519 AAAA", Status: "created", CreatedAt: time.Now(),
		Members: []store.KubeOneMember{{NodeID: "id-edge", Role: store.KubeOneControlPlane}}}); err != nil {
		t.Fatal(err)
	}
	_, err := f.c.Register(ctx, "edge", "rke2", "test")
	if !errors.Is(err, ErrConflict) || !errors.Is(err, store.ErrKubernetesOwned) ||
		!strings.Contains(err.Error(), `KubeOne cluster "edge2"`) {
		t.Fatalf("register of a KubeOne member: %v; want a conflict naming KubeOne cluster edge2", err)
	}
	if _, err := f.st.GetClusterMember(ctx, "id-edge"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("the refused register stored a member: %v", err)
	}
}
