package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
)

// TestMissions drives missions through a tree of real hubs: a root and two
// site hubs (berlin, munich) with agents. A mission placed by --sites and
// --match-labels runs on exactly the matching nodes, once, its per-node
// state and state check aggregate at the root; a site hub killed -9 while
// a node's run is live comes back, never runs that node again, and runs
// the node that joined meanwhile; a site whose uplink is cut runs the
// mission on a node that joins it meanwhile, and the root catches up. The scripts append a line per run to a
// marks file: a node listed twice ran twice.
func TestMissions(t *testing.T) {
	interval := []string{"--site-status-interval", "1s"}
	root := startHubIn(t, "", 0, interval...)
	siteJoin := func() string {
		return strings.TrimSpace(root.cli("site", "token", "create", "--ttl", "1h"))
	}
	berlin := startHubIn(t, "", 0, append([]string{"--parent", siteJoin(), "--site", "berlin"}, interval...)...)
	munich := startHubIn(t, "", 0, append([]string{"--parent", siteJoin(), "--site", "munich"}, interval...)...)
	waitFor(t, "both sites connected at the root", 60*time.Second, func() bool {
		out := root.cli("sites", "-o", "json")
		return strings.Count(out, `"connected": true`) >= 2
	})

	startAgent(t, berlin.token("--label", "role=pos"), "b1", "--ssh", "embedded")
	startAgent(t, berlin.token("--label", "role=db"), "b2", "--ssh", "embedded")
	startAgent(t, munich.token("--label", "role=pos"), "m1", "--ssh", "embedded")
	m2Join := munich.token("--label", "role=pos") // m2 joins while munich is down
	berlin.waitOnline("b1", "")
	berlin.waitOnline("b2", "")
	munich.waitOnline("m1", "")

	dir := t.TempDir()
	marks := filepath.Join(dir, "marks")
	script := func(name, body string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body), 0o755); err != nil {
			t.Fatal(err)
		}
		return p
	}
	deploy := script("deploy.sh",
		fmt.Sprintf("echo \"$TETHER_NODE $TETHER_MISSION g$TETHER_MISSION_GENERATION\" >> %s\n", marks))
	check := script("check.sh", fmt.Sprintf("grep -q \"^$TETHER_NODE $TETHER_MISSION \" %s\n", marks))

	t.Run("placed by sites and labels", func(t *testing.T) {
		root.cli("mission", "create", "pos", "--script", deploy, "--state-check", check, "--interval", "5s",
			"--sites", "berlin", "--match-labels", "role=pos")
		d := waitMission(t, root, "pos", func(d apitype.MissionDetail) bool {
			n := nodeRows(d)
			return n["b1.berlin"] == "applied/ok" && siteRow(d, "munich").Reported
		})
		if got := nodeRows(d); len(got) != 1 {
			t.Errorf("mission pos at the root: nodes %v, want only b1.berlin", got)
		}
		if d.Total.Nodes != 1 || d.Total.Applied != 1 || d.Total.CheckOK != 1 {
			t.Errorf("aggregate at the root = %+v, want 1 node applied and checked ok", d.Total)
		}
		if b := siteRow(d, "berlin"); !b.Placed || b.ObservedGeneration != 1 || b.Own.Applied != 1 {
			t.Errorf("berlin's row = %+v", b)
		}
		if m := siteRow(d, "munich"); m.Placed || m.Own.Nodes != 0 {
			t.Errorf("munich's row = %+v: the placement does not take munich", m)
		}
		if d.State.Placed || d.State.Own.Nodes != 0 {
			t.Errorf("the root's own part = %+v: --sites leaves the root's own nodes out", d.State.Own)
		}
		// The same spec again is no new generation: nothing runs again.
		root.cli("mission", "create", "pos", "--script", deploy, "--state-check", check, "--interval", "5s",
			"--sites", "berlin", "--match-labels", "role=pos")
		// The site holds it, and its own show names its node without a suffix.
		waitMission(t, berlin, "pos", func(d apitype.MissionDetail) bool { return nodeRows(d)["b1"] == "applied/ok" })
		checkMarks(t, marks, "pos", map[string]int{"b1 pos g1": 1})
	})

	t.Run("site offline keeps running", func(t *testing.T) {
		// With the root down, berlin's uplink is cut: a matching node that
		// joins berlin meanwhile runs the mission and its state check all
		// the same, and the root catches up when it is back.
		root.p.Stop(syscall.SIGTERM, stopWait)
		startAgent(t, berlin.token("--label", "role=pos"), "b3", "--ssh", "embedded")
		waitMission(t, berlin, "pos", func(d apitype.MissionDetail) bool { return nodeRows(d)["b3"] == "applied/ok" })
		root.start()
		waitMission(t, root, "pos", func(d apitype.MissionDetail) bool {
			n := nodeRows(d)
			return n["b1.berlin"] == "applied/ok" && n["b3.berlin"] == "applied/ok" && !siteRow(d, "berlin").Stale
		})
		checkMarks(t, marks, "pos", map[string]int{"b1 pos g1": 1, "b3 pos g1": 1})
	})

	t.Run("site killed mid-mission", func(t *testing.T) {
		slow := script("slow.sh",
			fmt.Sprintf("echo \"$TETHER_NODE $TETHER_MISSION g$TETHER_MISSION_GENERATION\" >> %s\nsleep 30\n", marks))
		root.cli("mission", "create", "slow", "--script", slow, "--sites", "munich", "--match-labels", "role=pos")
		waitFor(t, "m1 to start the slow mission", 60*time.Second, func() bool {
			return readMarks(t, marks)["m1 slow g1"] == 1
		})
		munich.p.Kill()
		munich.start()
		startAgent(t, m2Join, "m2", "--ssh", "embedded")
		d := waitMission(t, root, "slow", func(d apitype.MissionDetail) bool {
			n := nodeRows(d)
			return n["m1.munich"] == "failed/" && (n["m2.munich"] == "running/" || n["m2.munich"] == "applied/")
		})
		for _, n := range d.Nodes {
			if n.Node == "m1.munich" && !strings.Contains(n.Error, "interrupted") {
				t.Errorf("m1's error = %q, want it marked interrupted", n.Error)
			}
		}
		// m2 is recorded running before its script starts: its line comes
		// a moment later.
		waitFor(t, "m2's run of the slow mission", 30*time.Second,
			func() bool { return readMarks(t, marks)["m2 slow g1"] > 0 })
		checkMarks(t, marks, "slow", map[string]int{"m1 slow g1": 1, "m2 slow g1": 1})
		// Nothing else ran anywhere: the pos mission was not repeated by
		// munich's restart (munich never ran it) nor by berlin's reconnects.
		checkMarks(t, marks, "pos", map[string]int{"b1 pos g1": 1, "b3 pos g1": 1})
	})

	t.Run("delete", func(t *testing.T) {
		root.cli("mission", "delete", "pos")
		waitFor(t, "berlin to drop the deleted mission", 30*time.Second, func() bool {
			var list []apitype.Mission
			if err := json.Unmarshal([]byte(berlin.cli("mission", "list", "-o", "json")), &list); err != nil {
				t.Fatal(err)
			}
			return !slices.ContainsFunc(list, func(m apitype.Mission) bool { return m.Name == "pos" })
		})
	})
}

// waitMission polls `tether mission show NAME -o json` at h until cond.
func waitMission(t *testing.T, h *hub, name string, cond func(apitype.MissionDetail) bool) apitype.MissionDetail {
	t.Helper()
	return waitForState(t, "mission "+name+" at "+filepath.Base(h.dataDir), 90*time.Second, func() apitype.MissionDetail {
		out, _, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "mission", "show", name,
			"-o", "json", "--data-dir", h.dataDir)
		var d apitype.MissionDetail
		if code == 0 {
			_ = json.Unmarshal([]byte(out), &d)
		}
		return d
	}, cond)
}

// nodeRows is node → "phase/check" of a mission's node lines.
func nodeRows(d apitype.MissionDetail) map[string]string {
	m := map[string]string{}
	for _, n := range d.Nodes {
		m[n.Node] = n.Phase + "/" + n.Check
	}
	return m
}

func siteRow(d apitype.MissionDetail, path string) (row struct {
	Reported, Placed   bool
	Stale              bool
	ObservedGeneration int64
	Own                struct{ Nodes, Applied int }
}) {
	for _, s := range d.Sites {
		if s.Path == path {
			row.Reported, row.Placed, row.Stale, row.ObservedGeneration = s.Reported, s.Placed, s.Stale, s.ObservedGeneration
			row.Own.Nodes, row.Own.Applied = s.Own.Nodes, s.Own.Applied
		}
	}
	return row
}

// readMarks counts the lines of the marks file ("NODE MISSION gGEN").
func readMarks(t *testing.T, path string) map[string]int {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil && !os.IsNotExist(err) {
		t.Fatal(err)
	}
	m := map[string]int{}
	for _, l := range strings.Split(strings.TrimSpace(string(b)), "\n") {
		if l != "" {
			m[l]++
		}
	}
	return m
}

// checkMarks fails unless the lines of mission are exactly want.
func checkMarks(t *testing.T, path, mission string, want map[string]int) {
	t.Helper()
	got := map[string]int{}
	for l, n := range readMarks(t, path) {
		if f := strings.Fields(l); len(f) == 3 && f[1] == mission {
			got[l] = n
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		keys := slices.Sorted(func(yield func(string) bool) {
			for k := range got {
				if !yield(k) {
					return
				}
			}
		})
		t.Errorf("runs of mission %s: %v (%v), want each once: %v", mission, got, keys, want)
	}
}
