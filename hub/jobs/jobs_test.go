package jobs

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/tether-dev/tether/hub/blobs"
	"github.com/tether-dev/tether/hub/store"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// fakeConn stands in for the SSH runner: these tests are about fan-out,
// limits, persistence and streaming. Real SSH through real tunnels to the
// embedded server and to OpenSSH is exercised by e2e/jobs_test.go and
// provisioners/runner.
type fakeConn struct {
	run    func(ctx context.Context, cmd Command, stdout, stderr io.Writer) (int, error)
	files  map[string][]byte
	mu     sync.Mutex
	closed atomic.Bool
}

func (f *fakeConn) Run(ctx context.Context, cmd Command, stdout, stderr io.Writer) (int, error) {
	return f.run(ctx, cmd, stdout, stderr)
}

func (f *fakeConn) Upload(
	_ context.Context, src io.Reader, size int64, dst string, _ os.FileMode, _ bool,
) (string, error) {
	b, err := io.ReadAll(src)
	if err != nil {
		return "", err
	}
	f.mu.Lock()
	f.files[dst] = b
	f.mu.Unlock()
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:]), nil
}

func (f *fakeConn) Exists(_ context.Context, p string) (bool, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	_, ok := f.files[p]
	return ok, nil
}

func (f *fakeConn) Close() error { f.closed.Store(true); return nil }

type env struct {
	st     *store.DB
	eng    *Engine
	blobs  *blobs.Store
	online sync.Map // node ID -> reason ("" online)
	ran    sync.Map // node ID -> true once a run connected to it
}

func newEnv(
	t *testing.T, run func(ctx context.Context, node string, cmd Command, stdout, stderr io.Writer) (int, error),
) *env {
	t.Helper()
	dir := t.TempDir()
	st, err := store.OpenSQLite(context.Background(), filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	blobs, err := blobs.New(filepath.Join(dir, "blobs"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	e := &env{st: st, blobs: blobs}
	e.eng = New(context.Background(), Config{
		Store: st, Blobs: blobs, FlushInterval: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond,
		Online: func(id string) string {
			if v, ok := e.online.Load(id); ok {
				return v.(string)
			}
			return ""
		},
		Connect: func(ctx context.Context, id string) (Conn, error) {
			e.ran.Store(id, true)
			node := strings.TrimPrefix(id, "id-") // the test's nodes are named after their IDs
			if strings.HasPrefix(node, "unreachable") {
				return nil, errors.New("handshake failed")
			}
			return &fakeConn{
				files: map[string][]byte{},
				run: func(ctx context.Context, cmd Command, o, eo io.Writer) (int, error) {
					return run(ctx, node, cmd, o, eo)
				},
			}, nil
		},
	})
	t.Cleanup(func() { e.eng.Close(); st.Close() })
	return e
}

func nodes(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("n%03d", i)
	}
	return out
}

// start runs a job on the named nodes, whose IDs are "id-" + name.
func (e *env) start(t *testing.T, spec store.JobSpec, names []string) store.Job {
	t.Helper()
	targets := make([]store.NodeRef, len(names))
	for i, n := range names {
		targets[i] = store.NodeRef{ID: "id-" + n, Name: n}
	}
	return e.startOn(t, spec, targets)
}

func (e *env) startOn(t *testing.T, spec store.JobSpec, targets []store.NodeRef) store.Job {
	t.Helper()
	if err := Validate(&spec, e.blobs); err != nil {
		t.Fatal(err)
	}
	j, err := e.eng.Start(context.Background(), store.Job{Kind: "run", Spec: spec, CreatedBy: "test"}, targets)
	if err != nil {
		t.Fatal(err)
	}
	return j
}

func (e *env) wait(t *testing.T, id string) (store.Job, map[string]store.JobNode) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	j, err := e.eng.Wait(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	ns, err := e.st.ListJobNodes(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]store.JobNode{}
	for _, n := range ns {
		m[n.Node] = n
	}
	return j, m
}

func TestFanOutRespectsParallelAndRecordsResults(t *testing.T) {
	var active, peak atomic.Int32
	e := newEnv(t, func(ctx context.Context, node string, cmd Command, stdout, _ io.Writer) (int, error) {
		n := active.Add(1)
		for {
			p := peak.Load()
			if n <= p || peak.CompareAndSwap(p, n) {
				break
			}
		}
		time.Sleep(5 * time.Millisecond)
		active.Add(-1)
		fmt.Fprintf(stdout, "hello from %s\n", node)
		return 0, nil
	})
	j := e.start(t, store.JobSpec{Command: "echo hi", Parallel: 7}, nodes(60))
	got, runs := e.wait(t, j.ID)
	if got.State != store.JobSucceeded || got.Counts[store.RunOK] != 60 {
		t.Fatalf("job = %+v", got)
	}
	if p := peak.Load(); p > 7 || p < 2 {
		t.Errorf("peak concurrency %d, want 2..7", p)
	}
	n, err := e.st.GetJobNode(context.Background(), j.ID, "n042")
	if err != nil || string(n.LogHead) != "hello from n042\n" || n.ExitCode == nil || *n.ExitCode != 0 ||
		n.StartedAt.IsZero() || n.FinishedAt.IsZero() {
		t.Fatalf("n042 = %+v (log %q), %v", n, n.LogHead, err)
	}
	if len(runs) != 60 {
		t.Fatalf("%d runs", len(runs))
	}
}

func TestMaxFailuresStopsNewRuns(t *testing.T) {
	cases := []struct {
		max          string
		parallel     int
		wantFailedLE int
		wantSkipped  bool
	}{
		{max: "0", parallel: 1, wantFailedLE: 1, wantSkipped: true},
		{max: "3", parallel: 1, wantFailedLE: 4, wantSkipped: true},
		{max: "10%", parallel: 1, wantFailedLE: 3, wantSkipped: true}, // 20 nodes: 2 tolerated
		{max: "", parallel: 4, wantFailedLE: 20, wantSkipped: false},
		{max: "100%", parallel: 4, wantFailedLE: 20, wantSkipped: false},
	}
	for _, tc := range cases {
		t.Run(tc.max, func(t *testing.T) {
			e := newEnv(t, func(context.Context, string, Command, io.Writer, io.Writer) (int, error) { return 2, nil })
			j := e.start(t, store.JobSpec{Command: "false", Parallel: tc.parallel, MaxFailures: tc.max}, nodes(20))
			got, runs := e.wait(t, j.ID)
			if got.State != store.JobFailed {
				t.Fatalf("state %s", got.State)
			}
			failed, skipped := got.Counts[store.RunFailed], got.Counts[store.RunSkipped]
			if failed > tc.wantFailedLE || (skipped > 0) != tc.wantSkipped || failed+skipped != 20 {
				t.Fatalf("failed %d skipped %d, want failed <= %d, skipped %v", failed, skipped, tc.wantFailedLE, tc.wantSkipped)
			}
			for _, r := range runs {
				if r.State == store.RunFailed && (r.ExitCode == nil || *r.ExitCode != 2 || r.Error != "exit status 2") {
					t.Fatalf("failed run %+v", r)
				}
				if r.State == store.RunSkipped && !strings.Contains(r.Error, "--max-failures") {
					t.Fatalf("skipped run says %q", r.Error)
				}
			}
		})
	}
}

func TestTimeoutCancelOfflineAndConnectErrors(t *testing.T) {
	e := newEnv(t, func(ctx context.Context, node string, _ Command, _, _ io.Writer) (int, error) {
		if node == "fast" {
			return 0, nil
		}
		<-ctx.Done() // the runner kills the remote process and reports the context's end
		return -1, ctx.Err()
	})
	e.online.Store("id-gone", "offline (last seen 1h ago)")
	j := e.start(t, store.JobSpec{Command: "sleep 100", TimeoutSeconds: 1},
		[]string{"slow", "fast", "gone", "unreachable-1"})
	got, runs := e.wait(t, j.ID)
	if got.State != store.JobFailed {
		t.Fatalf("job %+v", got)
	}
	want := map[string][2]string{
		"slow":          {store.RunFailed, "timed out after 1s"},
		"fast":          {store.RunOK, ""},
		"gone":          {store.RunSkipped, "offline (last seen 1h ago); pass --wait-online"},
		"unreachable-1": {store.RunFailed, "connect: handshake failed"},
	}
	for n, w := range want {
		if runs[n].State != w[0] || !strings.Contains(runs[n].Error, w[1]) {
			t.Errorf("%s = %s %q, want %s containing %q", n, runs[n].State, runs[n].Error, w[0], w[1])
		}
	}

	// Cancel: the running node is cancelled, and so is one not yet started.
	j = e.start(t, store.JobSpec{Command: "sleep 100", Parallel: 1}, []string{"a", "b"})
	waitFor(t, func() bool {
		n, _ := e.st.GetJobNode(context.Background(), j.ID, "a")
		return n.State == store.RunRunning
	})
	if err := e.eng.Cancel(j.ID, "alice"); err != nil {
		t.Fatal(err)
	}
	got, runs = e.wait(t, j.ID)
	if got.State != store.JobCancelled || runs["a"].State != store.RunCancelled ||
		runs["b"].State != store.RunCancelled || !strings.Contains(runs["a"].Error, "alice") {
		t.Fatalf("after cancel: %+v %+v", got, runs)
	}
	if err := e.eng.Cancel(j.ID, "alice"); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("second cancel: %v", err)
	}
}

func TestWaitOnline(t *testing.T) {
	e := newEnv(t, func(context.Context, string, Command, io.Writer, io.Writer) (int, error) { return 0, nil })
	e.online.Store("id-late", "offline")
	e.online.Store("id-never", "offline")
	j := e.start(t, store.JobSpec{Command: "true", WaitOnlineSecs: 2}, []string{"late", "never"})
	waitFor(t, func() bool {
		n, _ := e.st.GetJobNode(context.Background(), j.ID, "late")
		return n.State == store.RunWaiting
	})
	e.online.Store("id-late", "")
	_, runs := e.wait(t, j.ID)
	if runs["late"].State != store.RunOK || runs["never"].State != store.RunSkipped ||
		!strings.Contains(runs["never"].Error, "after waiting 2s") {
		t.Fatalf("runs %+v", runs)
	}
}

// A --wait-online run waits for the node it was started for, by ID: when
// that node is removed and a new machine joins under its name, the run ends
// as "node removed" and never runs on the newcomer.
func TestRemovedNodeRunsNothingOnANewcomer(t *testing.T) {
	e := newEnv(t, func(context.Context, string, Command, io.Writer, io.Writer) (int, error) { return 0, nil })
	ctx := context.Background()
	join := func(id, name string) {
		t.Helper()
		if err := e.st.CreateToken(ctx, store.Token{
			ID: "t-" + id, SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour),
		}); err != nil {
			t.Fatal(err)
		}
		if _, err := e.st.Join(
			ctx, "t-"+id, func(store.Token) error { return nil }, store.Node{ID: id, Name: name},
		); err != nil {
			t.Fatal(err)
		}
	}
	join("id-old", "edge")
	e.online.Store("id-old", "offline (last seen 1h ago)")
	j := e.startOn(t, store.JobSpec{Command: "true", WaitOnlineSecs: 3600}, []store.NodeRef{{ID: "id-old", Name: "edge"}})
	waitFor(t, func() bool {
		n, _ := e.st.GetJobNode(ctx, j.ID, "edge")
		return n.State == store.RunWaiting
	})

	// What the hub does when an operator removes the node.
	if err := e.st.DeleteNode(ctx, "id-old"); err != nil {
		t.Fatal(err)
	}
	e.eng.NodeRemoved("id-old")
	join("id-new", "edge")
	e.online.Store("id-new", "")

	got, runs := e.wait(t, j.ID)
	if _, ran := e.ran.Load("id-new"); ran {
		t.Fatal("the run of the removed node ran on the new machine that took its name")
	}
	if r := runs["edge"]; r.State != store.RunSkipped || r.Error != store.NodeRemovedReason || r.NodeID != "id-old" {
		t.Fatalf("run = %+v, want skipped (%q) for id-old", r, store.NodeRemovedReason)
	}
	if got.State != store.JobPartial { // skipped, nothing failed
		t.Fatalf("job = %+v", got)
	}
	if n := e.eng.NodeRemoved("id-old"); n != 0 {
		t.Fatalf("NodeRemoved after the job ended touched %d runs", n)
	}
}

func TestSubscribeReplaysThenStreams(t *testing.T) {
	release := make(chan struct{})
	e := newEnv(t, func(ctx context.Context, node string, _ Command, stdout, stderr io.Writer) (int, error) {
		fmt.Fprint(stdout, "before\n")
		select {
		case <-release:
		case <-ctx.Done():
			return -1, ctx.Err()
		}
		fmt.Fprint(stderr, "after\n")
		return 0, nil
	})
	j := e.start(t, store.JobSpec{Command: "x"}, []string{"a"})
	waitFor(t, func() bool { n, _ := e.st.GetJobNode(context.Background(), j.ID, "a"); return n.LogBytes > 0 })
	sub, err := e.eng.Subscribe(j.ID, "")
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Close()
	close(release)
	var out bytes.Buffer
	var final *store.Job
	for ev := range sub.C {
		switch ev.Type {
		case "output":
			out.Write(ev.Data)
		case "job":
			final = ev.Job
		}
	}
	if out.String() != "before\nafter\n" || final == nil || final.State != store.JobSucceeded {
		t.Fatalf("output %q, final %+v", out.String(), final)
	}
	if _, err := e.eng.Subscribe(j.ID, ""); !errors.Is(err, ErrNotRunning) {
		t.Fatalf("subscribe to finished job: %v", err)
	}
}

func TestUploadsAreVerified(t *testing.T) {
	var conn *fakeConn
	e := newEnv(t, nil)
	e.eng.cfg.Connect = func(context.Context, string) (Conn, error) {
		conn = &fakeConn{files: map[string][]byte{"/keep": []byte("old")},
			run: func(context.Context, Command, io.Writer, io.Writer) (int, error) { return 0, nil }}
		return conn, nil
	}
	d, err := e.blobs.PutBytes([]byte("payload"))
	if err != nil {
		t.Fatal(err)
	}
	j := e.start(t, store.JobSpec{Command: "true", Uploads: []store.Upload{
		{Name: "p", SHA256: d, Dest: "/opt/p", Mode: 0o600},
		{Name: "k", SHA256: d, Dest: "/keep", IfMissing: true},
	}}, []string{"a"})
	got, _ := e.wait(t, j.ID)
	if got.State != store.JobSucceeded || string(conn.files["/opt/p"]) != "payload" ||
		string(conn.files["/keep"]) != "old" || !conn.closed.Load() {
		t.Fatalf("job %s, files %q, closed %v", got.State, conn.files, conn.closed.Load())
	}
	n, _ := e.st.GetJobNode(context.Background(), j.ID, "a")
	if !strings.Contains(string(n.LogHead), "uploaded p to /opt/p") || !strings.Contains(string(n.LogHead), "kept /keep") {
		t.Fatalf("log %q", n.LogHead)
	}
}

func TestValidate(t *testing.T) {
	cases := []struct {
		name string
		spec store.JobSpec
		want string
	}{
		{"nothing", store.JobSpec{}, "exactly one"},
		{"both", store.JobSpec{Command: "a", Script: "b"}, "exactly one"},
		{"parallel", store.JobSpec{Command: "a", Parallel: 5000}, "parallel"},
		{"timeout", store.JobSpec{Command: "a", TimeoutSeconds: -1}, "timeout"},
		{"maxfail", store.JobSpec{Command: "a", MaxFailures: "ten"}, "max failures"},
		{"maxfail pct", store.JobSpec{Command: "a", MaxFailures: "120%"}, "max failures"},
		{"env", store.JobSpec{Command: "a", Env: map[string]string{"1X": "v"}}, "environment"},
		{"nul", store.JobSpec{Command: "a\x00b"}, "NUL"},
		{"relative", store.JobSpec{Command: "a", Uploads: []store.Upload{
			{Name: "x", SHA256: strings.Repeat("a", 64), Dest: "opt/x"},
		}}, "absolute"},
		{"traversal", store.JobSpec{Command: "a", Uploads: []store.Upload{
			{Name: "x", SHA256: strings.Repeat("a", 64), Dest: "/opt/../etc/x"},
		}}, "clean"},
		{"dir", store.JobSpec{Command: "a", Uploads: []store.Upload{
			{Name: "x", SHA256: strings.Repeat("a", 64), Dest: "/opt/"},
		}}, "directory"},
		{"unknown blob", store.JobSpec{Command: "a", Uploads: []store.Upload{
			{Name: "x", SHA256: strings.Repeat("a", 64), Dest: "/opt/x"},
		}}, "not on the hub"},
		{"ok", store.JobSpec{Command: "a"}, ""},
	}
	blobs, err := blobs.New(t.TempDir(), 10)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			err := Validate(&tc.spec, blobs)
			if tc.want == "" {
				if err != nil || tc.spec.Parallel != DefaultParallel || tc.spec.TimeoutSeconds != int(DefaultTimeout/time.Second) {
					t.Fatalf("err %v spec %+v", err, tc.spec)
				}
				return
			}
			if err == nil || !errors.Is(err, ErrBadSpec) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("err = %v, want ErrBadSpec containing %q", err, tc.want)
			}
		})
	}
}

func TestMaxFailuresTolerated(t *testing.T) {
	for _, tc := range []struct {
		in   string
		n    int
		want int
	}{{"", 10, -1}, {"0", 10, 0}, {"3", 10, 3}, {"10%", 20, 2}, {"10%", 5, 0}, {"50%", 3, 1}, {"100%", 7, 7}} {
		m, err := ParseMaxFailures(tc.in)
		if err != nil || m.Tolerated(tc.n) != tc.want {
			t.Errorf("%q of %d: %d, %v; want %d", tc.in, tc.n, m.Tolerated(tc.n), err, tc.want)
		}
	}
}

func TestLogBufKeepsHeadAndTail(t *testing.T) {
	for _, size := range []int{
		0, 10, headCap, headCap + 10, headCap + tailCap, headCap + tailCap + 1, 5 * (headCap + tailCap),
	} {
		var l logBuf
		all := make([]byte, size)
		for i := range all {
			all[i] = byte('a' + i%26)
		}
		// Odd write sizes exercise the ring's wrap-around.
		for rest := all; len(rest) > 0; {
			n := min(len(rest), 1+len(rest)%7919)
			l.write(rest[:n])
			rest = rest[n:]
		}
		head, tail, dropped := l.snapshot()
		if !bytes.Equal(head, all[:min(size, headCap)]) {
			t.Fatalf("size %d: head differs", size)
		}
		wantTail := all[min(size, headCap):]
		if len(wantTail) > tailCap {
			wantTail = wantTail[len(wantTail)-tailCap:]
		}
		if !bytes.Equal(tail, wantTail) || dropped != int64(size-len(head)-len(tail)) {
			t.Fatalf("size %d: tail %d bytes (want %d), dropped %d", size, len(tail), len(wantTail), dropped)
		}
	}
}

func TestBlobsRejectBadDigestsAndSizes(t *testing.T) {
	b, err := blobs.New(t.TempDir(), 8)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, err := b.Put(strings.NewReader("123456789"), ""); !errors.Is(err, blobs.ErrTooLarge) {
		t.Fatalf("oversized: %v", err)
	}
	if _, _, err := b.Put(strings.NewReader("1234"), strings.Repeat("0", 64)); err == nil ||
		!strings.Contains(err.Error(), "not the announced") {
		t.Fatalf("wrong digest: %v", err)
	}
	for _, d := range []string{"../../etc/passwd", strings.Repeat("A", 64), ""} {
		if _, _, err := b.Open(d); err == nil {
			t.Fatalf("Open(%q) accepted", d)
		}
	}
	d, n, err := b.Put(strings.NewReader("1234"), "")
	if err != nil || n != 4 || !b.Has(d) {
		t.Fatalf("put: %s %d %v", d, n, err)
	}
}

func waitFor(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("condition not reached in 10s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// With a Resolver, a run that need not wait looks its node up once: that
// look-up decides whether it starts and is what it connects by; Online and
// Connect are not asked. A run whose node was offline at that look-up and
// waits for it (--wait-online) polls Online and connects with Connect.
func TestResolveDecidesStartAndConnect(t *testing.T) {
	e := newEnv(t, func(context.Context, string, Command, io.Writer, io.Writer) (int, error) { return 0, nil })
	var resolved, dialled, online, connected sync.Map // node ID -> count
	inc := func(m *sync.Map, id string) {
		v, _ := m.LoadOrStore(id, new(atomic.Int32))
		v.(*atomic.Int32).Add(1)
	}
	count := func(m *sync.Map, id string) int32 {
		if v, ok := m.Load(id); ok {
			return v.(*atomic.Int32).Load()
		}
		return 0
	}
	connect, isOnline := e.eng.cfg.Connect, e.eng.cfg.Online
	e.eng.cfg.Online = func(id string) string { inc(&online, id); return isOnline(id) }
	e.eng.cfg.Connect = func(ctx context.Context, id string) (Conn, error) { inc(&connected, id); return connect(ctx, id) }
	e.eng.cfg.Resolve = func(ctx context.Context, id string) (func(context.Context) (Conn, error), string) {
		inc(&resolved, id)
		if id == "id-off" {
			return nil, "offline (last seen 1h ago)"
		}
		if reason := isOnline(id); reason != "" {
			return nil, reason
		}
		return func(ctx context.Context) (Conn, error) { inc(&dialled, id); return connect(ctx, id) }, ""
	}

	j := e.start(t, store.JobSpec{Command: "true"}, []string{"a", "b", "off"})
	got, runs := e.wait(t, j.ID)
	if got.State != store.JobPartial || runs["a"].State != store.RunOK || runs["b"].State != store.RunOK {
		t.Fatalf("job %+v runs %+v", got, runs)
	}
	if r := runs["off"]; r.State != store.RunSkipped ||
		r.Error != "offline (last seen 1h ago); pass --wait-online to wait for it" || !r.StartedAt.IsZero() {
		t.Fatalf("offline run = %+v", r)
	}
	for _, id := range []string{"id-a", "id-b", "id-off"} {
		want := int32(1)
		if id == "id-off" {
			want = 0
		}
		if r, d, o, c := count(&resolved, id), count(&dialled, id), count(&online, id),
			count(&connected, id); r != 1 || d != want || o != 0 || c != 0 {
			t.Errorf("%s: resolved %d, dialled %d, online %d, connect %d; want 1, %d, 0, 0", id, r, d, want, o, c)
		}
	}

	// A waiting run: Online decides when it starts, Connect reaches it.
	e.online.Store("id-late", "offline")
	j = e.start(t, store.JobSpec{Command: "true", WaitOnlineSecs: 30}, []string{"late"})
	waitFor(t, func() bool {
		n, _ := e.st.GetJobNode(context.Background(), j.ID, "late")
		return n.State == store.RunWaiting
	})
	e.online.Store("id-late", "")
	if _, runs = e.wait(t, j.ID); runs["late"].State != store.RunOK || count(&resolved, "id-late") != 1 ||
		count(&online, "id-late") == 0 || count(&connected, "id-late") != 1 {
		t.Fatalf("waiting run %+v: online %d, connect %d", runs["late"], count(&online, "id-late"),
			count(&connected, "id-late"))
	}
}
