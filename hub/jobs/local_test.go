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
			eng := New(context.Background(), Config{Store: st, FlushInterval: 10 * time.Millisecond, PollInterval: 10 * time.Millisecond,
				Connect: func(context.Context, string) (Conn, error) {
					t.Error("a local run connected to a node")
					return nil, fmt.Errorf("no")
				},
				Local: map[string]Local{"kubeone_apply": local}})
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
			if got.State != tc.wantJob || run.State != tc.wantRun || !strings.Contains(run.Error, tc.wantError) || !strings.HasPrefix(string(run.LogHead), tc.wantLog) {
				t.Fatalf("job %s, run %+v (log %q); want job %s, run %s, error %q, log %q", got.State, run, run.LogHead, tc.wantJob, tc.wantRun, tc.wantError, tc.wantLog)
			}
			if tc.reason != "" && !tc.readyLate && strings.Contains(run.Error, "--wait-online") {
				t.Errorf("a local kind's skip names --wait-online, a flag of tether run: %q", run.Error)
			}
		})
	}
}

func waitState(t *testing.T, st *store.SQLite, id, state string) {
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
