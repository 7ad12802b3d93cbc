package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestHubKilledDuringFanOut runs a job on 100 agents (real tether-edge
// processes) and kills the hub with SIGKILL while runs are live. After a
// restart the store opens cleanly, no record is torn (every node of the job
// has exactly one final state; ok runs keep their exit code, live ones read
// interrupted), and a rerun of the interrupted nodes completes.
func TestHubKilledDuringFanOut(t *testing.T) {
	const n = 100
	h := startHub(t)
	join := h.token("--uses", fmt.Sprint(n))
	for i := range n {
		startAgent(t, join, fmt.Sprintf("f%03d", i), "--ssh", "embedded")
	}
	start := time.Now()
	waitFor(t, "100 agents online", 3*time.Minute, func() bool {
		online := 0
		for _, node := range h.nodes() {
			if node.Online {
				online++
			}
		}
		return online == n
	})
	t.Logf("%d agents online %s after start", n, time.Since(start).Round(time.Millisecond))

	start = time.Now()
	j, code := h.runJSON(2*time.Minute, "-l", "*", "--", "true")
	if code != 0 || j.Counts["ok"] != n {
		t.Fatalf("fan-out true: exit %d, %+v; not ok: %+v", code, j.Counts, notOK(j))
	}
	t.Logf("tether run -- true on %d agents: %s wall time", n, time.Since(start).Round(time.Millisecond))

	// Half the nodes finish at once, the other half wait for the gate.
	gate := filepath.Join(t.TempDir(), "gate")
	out, errOut, code := h.run(time.Minute, "--detach", "-l", "*", "--parallel", "100", "--",
		fmt.Sprintf(`case "$TETHER_NODE" in *[02468]) exit 0;; esac; i=0; while [ ! -f %s ] && [ $i -lt 120 ]; `+
			`do sleep 0.5; i=$((i+1)); done`, gate))
	if code != 0 {
		t.Fatalf("run: %d %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	waitForState(t, "half done, half running", time.Minute, func() map[string]int {
		j := h.job(id)
		for _, r := range j.Nodes {
			if r.State == "failed" {
				t.Fatalf("node %s failed before the crash (so the job can never be half done): %+v", r.Node, r)
			}
		}
		return j.Counts
	}, func(c map[string]int) bool { return c["ok"] == n/2 && c["running"] == n/2 })
	time.Sleep(300 * time.Millisecond) // let a flush of the store happen mid-job
	h.p.Stop(syscall.SIGKILL, stopWait)
	os.WriteFile(gate, nil, 0o644)
	h.start()

	j = h.job(id)
	if j.State != "interrupted" || j.Total != n || j.Counts["ok"] != n/2 || j.Counts["interrupted"] != n/2 {
		t.Fatalf("after the crash: state %s, counts %+v", j.State, j.Counts)
	}
	for _, r := range j.Nodes {
		switch r.State {
		case "ok":
			if r.ExitCode == nil || *r.ExitCode != 0 {
				t.Fatalf("ok run without exit code 0: %+v", r)
			}
		case "interrupted":
			if r.Error == "" {
				t.Fatalf("interrupted run without a reason: %+v", r)
			}
		default:
			t.Fatalf("torn record: %+v", r)
		}
	}
	waitFor(t, "agents back", 2*time.Minute, func() bool {
		online := 0
		for _, node := range h.nodes() {
			if node.Online {
				online++
			}
		}
		return online == n
	})
	re := strings.TrimSpace(h.cli("jobs", "rerun", id, "--failed", "--detach"))
	waitFor(t, "rerun over", 2*time.Minute, func() bool { return h.job(re).State != "running" })
	if r := h.job(re); r.State != "succeeded" || r.Total != n/2 {
		t.Fatalf("rerun: %s %+v", r.State, r.Counts)
	}
}

// notOK lists a job's runs that did not end ok, for failure messages.
func notOK(j jobJSON) []jobNodeJSON {
	var bad []jobNodeJSON
	for _, r := range j.Nodes {
		if r.State != "ok" {
			bad = append(bad, r)
		}
	}
	return bad
}
