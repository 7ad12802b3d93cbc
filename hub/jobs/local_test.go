package jobs

import (
	"context"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/store"
)

// fakeLocal is a job kind the hub runs itself.
type fakeLocal struct {
	mu     sync.Mutex
	reason string // Ready's answer
	run    func(ctx context.Context, target string, stdout io.Writer) (int, error)
	ran    []string
}

func (f *fakeLocal) Ready(_ store.Job, target string) string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reason
}

func (f *fakeLocal) setReason(r string) {
	f.mu.Lock()
	f.reason = r
	f.mu.Unlock()
}

func (f *fakeLocal) Run(ctx context.Context, _ store.Job, target string, stdout, _ io.Writer) (int, error) {
	f.mu.Lock()
	f.ran = append(f.ran, target)
	f.mu.Unlock()
	return f.run(ctx, target, stdout)
}

// TestLocalKind runs a kind the hub does itself: its runs never connect to
// a node, wait for Ready like runs wait for their node, and are persisted,
// failed and cancelled like any run.
func TestLocalKind(t *testing.T) {
	cases := []struct {
		name      string
		reason    string // Ready before the start
		waitSecs  int
		readyLate bool // Ready turns "" after the start
		run       func(ctx context.Context, target string, stdout io.Writer) (int, error)
		cancel    bool
		wantJob   string
		wantRun   string
		wantError string
		wantLog   string
	}{
		{name: "ok", run: func(_ context.Context, target string, stdout io.Writer) (int, error) {
			fmt.Fprintf(stdout, "applied %s\n", target)
			return 0, nil
		}, wantJob: store.JobSucceeded, wantRun: store.RunOK, wantLog: "applied cluster-1\n"},
		{name: "exit code", run: func(context.Context, string, io.Writer) (int, error) { return 3, nil },
			wantJob: store.JobFailed, wantRun: store.RunFailed, wantError: "exit status 3"},
		{name: "not ready", reason: "member n2 is offline", run: nil,
			wantJob: store.JobPartial, wantRun: store.RunSkipped, wantError: "member n2 is offline"},
		{name: "ready later", reason: "member n2 is offline", waitSecs: 60, readyLate: true,
			run:     func(context.Context, string, io.Writer) (int, error) { return 0, nil },
			wantJob: store.JobSucceeded, wantRun: store.RunOK},
		{name: "cancelled", cancel: true, run: func(ctx context.Context, _ string, stdout io.Writer) (int, error) {
			fmt.Fprintln(stdout, "started")
			<-ctx.Done()
			return -1, ctx.Err()
		}, wantJob: store.JobCancelled, wantRun: store.RunCancelled, wantError: "cancelled by tester"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			st, err := store.OpenSQLite(context.Background(), filepath.Join(t.TempDir(), "tether.db"))
			if err != nil {
				t.Fatal(err)
			}
			local := &fakeLocal{reason: tc.reason, run: tc.run}
			eng := New(context.Background(), Config{
				Store: st, FlushInterval: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond,
				Connect: func(context.Context, string) (Conn, error) {
					t.Error("a local run connected to a node")
					return nil, fmt.Errorf("no")
				},
				Local: map[string]Local{"kubeone_apply": local},
			})
			t.Cleanup(func() { eng.Close(); st.Close() })
			spec := store.JobSpec{Command: "kubeone apply", WaitOnlineSecs: tc.waitSecs}
			if err := Validate(&spec, nil); err != nil {
				t.Fatal(err)
			}
			j, err := eng.Start(context.Background(), store.Job{Kind: "kubeone_apply", Spec: spec, CreatedBy: "tester"},
				[]store.NodeRef{{ID: "cluster-1", Name: "edge1"}})
			if err != nil {
				t.Fatal(err)
			}
			if tc.readyLate {
				waitState(t, st, j.ID, store.RunWaiting)
				local.setReason("")
			}
			if tc.cancel {
				waitState(t, st, j.ID, store.RunRunning)
				if err := eng.Cancel(j.ID, "tester"); err != nil {
					t.Fatal(err)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			got, err := eng.Wait(ctx, j.ID)
			if err != nil {
				t.Fatal(err)
			}
			run, err := st.GetJobNode(ctx, j.ID, "edge1")
			if err != nil {
				t.Fatal(err)
			}
			if got.State != tc.wantJob || run.State != tc.wantRun || !strings.Contains(run.Error, tc.wantError) ||
				!strings.HasPrefix(string(run.LogHead), tc.wantLog) {
				t.Fatalf("job %s, run %+v (log %q); want job %s, run %s, error %q, log %q", got.State, run, run.LogHead,
					tc.wantJob, tc.wantRun, tc.wantError, tc.wantLog)
			}
			if tc.reason != "" && !tc.readyLate && strings.Contains(run.Error, "--wait-online") {
				t.Errorf("a local kind's skip names --wait-online, a flag of tether run: %q", run.Error)
			}
		})
	}
}

func waitState(t *testing.T, st *store.DB, id, state string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ns, err := st.ListJobNodes(context.Background(), id)
		if err == nil && len(ns) == 1 && ns[0].State == state {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("run never reached %s: %+v", state, ns)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A hub that dies during a run (a KubeOne apply here) and starts again an
// hour later: the run is interrupted at the engine's last mark of life,
// so its duration is the time it ran, not that plus the hour the hub was
// down.
func TestInterruptedRunLeavesTheDowntimeOut(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tether.db")
	st, err := store.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	local := &fakeLocal{run: func(ctx context.Context, _ string, _ io.Writer) (int, error) {
		<-ctx.Done()
		return -1, ctx.Err()
	}}
	eng := New(context.Background(), Config{Store: st, FlushInterval: 10 * time.Millisecond,
		AliveInterval: 20 * time.Millisecond, Local: map[string]Local{"kubeone_apply": local}})
	t.Cleanup(func() { eng.Close(); st.Close() })
	spec := store.JobSpec{Command: "kubeone apply"}
	if err := Validate(&spec, nil); err != nil {
		t.Fatal(err)
	}
	j, err := eng.Start(context.Background(), store.Job{Kind: "kubeone_apply", Spec: spec, CreatedBy: "tester"},
		[]store.NodeRef{{ID: "cluster-1", Name: "edge1"}})
	if err != nil {
		t.Fatal(err)
	}
	waitState(t, st, j.ID, store.RunRunning)
	time.Sleep(300 * time.Millisecond) // marks of life while it runs
	died := time.Now()

	// The next hub process, an hour later, finds it running. (This engine
	// stands for the dead hub: it is not stopped first, which would record
	// the run's true end.)
	next, err := store.OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	defer next.Close()
	if n, err := next.InterruptJobs(context.Background(), died.Add(time.Hour)); err != nil || n != 1 {
		t.Fatalf("InterruptJobs = %d, %v", n, err)
	}
	run, err := next.GetJobNode(context.Background(), j.ID, "edge1")
	if err != nil {
		t.Fatal(err)
	}
	// (The stand-in for the dead hub may mark once more meanwhile.)
	ran := run.Duration(died.Add(2 * time.Hour))
	if run.State != store.RunInterrupted || ran < 200*time.Millisecond || ran > time.Since(run.StartedAt) {
		t.Fatalf("interrupted run %s after %s; want the ~300 ms it ran, not the hour the hub was down", run.State, ran)
	}
	got, err := next.GetJob(context.Background(), j.ID)
	if err != nil || got.FinishedAt.After(time.Now()) {
		t.Fatalf("job %+v, %v: finished after the hub died", got, err)
	}
}
