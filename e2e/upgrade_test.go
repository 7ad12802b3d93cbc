package e2e

// Over-the-air rollouts end to end: a real OCI registry (testenv), a real
// hub pinning and fetching through it, real supervised agents of two
// versions built from this checkout, and `tether upgrade` driving it all
// through the tunnels over SSH.

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// otaHub is a hub that trusts the test registry.
func otaHub(t *testing.T, reg *testenv.Registry) *hub {
	t.Helper()
	return startHubIn(t, "", 0, "--registry-ca", reg.CAFile, "--registry-auth", reg.AuthFile)
}

// startUpFleet starts n supervised agents of oldVersion (one launcher copy
// for all), each named prefix-NN, and waits until the hub shows them all.
func startUpFleet(t *testing.T, h *hub, prefix string, n int) []*upNode {
	t.Helper()
	launcher := launcherCopy(t, oldVersion)
	join := h.token("--uses", "1000")
	var nodes []*upNode
	for i := range n {
		name := prefix + "-" + twoDigits(i)
		un := &upNode{t: t, h: h, name: name, dir: filepath.Join(t.TempDir(), name), launcher: launcher}
		un.start(join)
		nodes = append(nodes, un)
	}
	waitFor(t, "the fleet online", 90*time.Second, func() bool {
		all := h.nodes()
		for _, un := range nodes {
			if nd, ok := all[un.name]; !ok || !nd.Online || nd.AgentVersion != oldVersion {
				return false
			}
		}
		return true
	})
	return nodes
}

func twoDigits(i int) string { return string([]byte{'0' + byte(i/10), '0' + byte(i%10)}) }

func writeScript(t *testing.T, dir, name, body string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	testenv.WriteFile(t, p, []byte("#!/bin/sh\n"+body), 0o755)
	return p
}

func upgradeShow(h *hub, name string) apitype.UpgradeDetail {
	h.t.Helper()
	var d apitype.UpgradeDetail
	if err := json.Unmarshal([]byte(h.cli("upgrade", "show", name, "-o", "json")), &d); err != nil {
		h.t.Fatal(err)
	}
	return d
}

func waitUpgrade(h *hub, name string, within time.Duration, states ...string) apitype.UpgradeDetail {
	h.t.Helper()
	return waitForState(h.t, "upgrade "+name+" to be "+strings.Join(states, "|"), within,
		func() apitype.UpgradeDetail { return upgradeShow(h, name) },
		func(d apitype.UpgradeDetail) bool {
			for _, s := range states {
				if d.State == s {
					return true
				}
			}
			return false
		})
}

func nodeSteps(d apitype.UpgradeDetail) map[string]apitype.UpgradeNode {
	m := map[string]apitype.UpgradeNode{}
	for _, n := range d.Nodes {
		m[n.Node] = n
	}
	return m
}

func markerLines(t *testing.T, p string) []string {
	t.Helper()
	b, err := os.ReadFile(p)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		t.Fatal(err)
	}
	return strings.Fields(string(b))
}

// A bundle rolled out to 20 agents in batches of 25% (at most 5 at once):
// each installs it once; the registry serves the artifact once, not 20
// times. Then a bad bundle with --failure-tolerance 2 halts after its
// first batch, each failure's reason shown, the rest never reached.
func TestUpgradeRollout(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	h := otaHub(t, reg)
	fleet := startUpFleet(t, h, "ota", 20)
	ctx := context.Background()
	dir := t.TempDir()
	marker := filepath.Join(dir, "installed")
	install := writeScript(t, dir, "install.sh",
		"echo \"installing on $(hostname)\" >&2\necho \"$TETHER_UPGRADE_DIR\" >> "+marker+"\n")
	pushed, err := reg.PushBundle(ctx, reg.Ref("patches/motd:1"), "1", map[string]string{"install.sh": install})
	if err != nil {
		t.Fatal(err)
	}
	served := reg.BlobBytesServed()
	began := time.Now()
	h.cli("upgrade", "create", "motd-1", "--artifact", reg.Ref("patches/motd:1"), "-l", "*", "--batch", "25%",
		"--max-unavailable", "5")
	d := waitUpgrade(h, "motd-1", 90*time.Second, apitype.UpgradeDone, apitype.UpgradeHalted)
	t.Logf("20 nodes upgraded in %s", time.Since(began).Round(100*time.Millisecond))
	if d.State != apitype.UpgradeDone || d.Digest != pushed.Digest || d.Counts[apitype.StepSucceeded] != 20 {
		t.Fatalf("upgrade %s %q, digest %s (pushed %s), counts %v", d.State, d.Reason, d.Digest, pushed.Digest, d.Counts)
	}
	batches := map[int]int{}
	for _, n := range d.Nodes {
		batches[n.Batch]++
		if len(n.History) < 3 || n.History[0].Step != apitype.StepPending || n.JobID == "" {
			t.Errorf("%s: history %+v job %q", n.Node, n.History, n.JobID)
		}
	}
	if len(batches) != 4 || batches[0] != 5 {
		t.Errorf("batches %v, want 4 of 5", batches)
	}
	lines := markerLines(t, marker)
	sort.Strings(lines)
	if len(lines) != 20 || len(slicesCompact(lines)) != 20 {
		t.Errorf("installed %d times on %d nodes, want once on each of 20: %v", len(lines), len(slicesCompact(lines)), lines)
	}
	st, err := os.Stat(install)
	if err != nil {
		t.Fatal(err)
	}
	if got := reg.BlobBytesServed() - served; got > 2*st.Size()+64 {
		t.Errorf("the registry served %d blob bytes for a %d-byte artifact to 20 nodes", got, st.Size())
	}
	// The install's output is the job log of the node's drive.
	logs := h.cli("jobs", "logs", nodeSteps(d)["ota-03"].JobID, "--node", "ota-03")
	if !strings.Contains(logs, "installing on") {
		t.Errorf("job log: %q", logs)
	}
	if out := h.cli("upgrade", "list"); !strings.Contains(out, "motd-1") || !strings.Contains(out, "done") {
		t.Errorf("list:\n%s", out)
	}

	// A bad release stops itself.
	bad := writeScript(t, dir, "bad.sh", "echo \"broken on purpose\" >&2\nexit 3\n")
	if _, err := reg.PushBundle(ctx, reg.Ref("patches/motd:2"), "2", map[string]string{"install.sh": bad}); err != nil {
		t.Fatal(err)
	}
	h.cli("upgrade", "create", "motd-2", "--artifact", reg.Ref("patches/motd:2"), "-l", "*", "--batch", "5",
		"--failure-tolerance", "2")
	d = waitUpgrade(h, "motd-2", 60*time.Second, apitype.UpgradeHalted, apitype.UpgradeDone)
	if d.State != apitype.UpgradeHalted || !strings.Contains(d.Reason, "more than the failure tolerance") {
		t.Fatalf("bad bundle: %s %q", d.State, d.Reason)
	}
	// Drives under way when it halted finish.
	d = waitForState(t, "every node of motd-2 to end", 60*time.Second,
		func() apitype.UpgradeDetail { return upgradeShow(h, "motd-2") },
		func(d apitype.UpgradeDetail) bool {
			for _, n := range d.Nodes {
				if !n.Step.Terminal() {
					return false
				}
			}
			return true
		})
	failed := 0
	for _, n := range d.Nodes {
		switch n.Step {
		case apitype.StepFailed:
			failed++
			if !strings.Contains(n.Reason, "install.sh exited with status 3") {
				t.Errorf("%s: reason %q", n.Node, n.Reason)
			}
		case apitype.StepCancelled:
		default:
			t.Errorf("%s: %s %q", n.Node, n.Step, n.Reason)
		}
	}
	if failed < 3 || failed > 5 {
		t.Errorf("%d failed, want 3 (the tolerance exceeded) to 5 (the first batch)", failed)
	}
	if out := h.cli("upgrade", "show", "motd-2"); !strings.Contains(out, "install.sh exited with status 3") {
		t.Errorf("show does not give the reasons:\n%s", out)
	}
	// The controller's rows carry their time: --since finds them.
	audit := h.cli("audit", "-o", "json", "--since", "1h")
	for _, k := range []string{"upgrade_create", "upgrade_halt", "upgrade_done", "upgrade_node"} {
		if !strings.Contains(audit, k) {
			t.Errorf("no %s in the audit log of the last hour", k)
		}
	}
	_ = fleet
}

func slicesCompact(s []string) []string {
	out := []string{}
	for i, v := range s {
		if i == 0 || v != s[i-1] {
			out = append(out, v)
		}
	}
	return out
}

// What the hub pins at creation is what the nodes get: a tag moved
// afterwards changes nothing, and a blob tampered with in the registry
// afterwards is caught at the hub's one fetch: every node fails with the
// digest mismatch and nothing runs anywhere.
func TestUpgradePinnedDigest(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	h := otaHub(t, reg)
	fleet := startUpFleet(t, h, "pin", 3)
	ctx := context.Background()
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	push := func(tag, word string) string {
		p := writeScript(t, dir, word+".sh", "echo "+word+" >> "+marker+"\n")
		r, err := reg.PushBundle(ctx, reg.Ref("patches/pin:"+tag), tag, map[string]string{"install.sh": p})
		if err != nil {
			t.Fatal(err)
		}
		return r.Digest
	}
	one := push("1", "one")
	// Offline targets: nothing is fetched or pushed until they are back.
	for _, n := range fleet {
		n.sup.Stop(syscall.SIGTERM, stopWait)
	}
	waitFor(t, "the fleet offline", 30*time.Second, func() bool {
		for _, nd := range h.nodes() {
			if nd.Online {
				return false
			}
		}
		return true
	})
	h.cli("upgrade", "create", "pinned", "--artifact", reg.Ref("patches/pin:1"), "-l", "*")
	two := push("2", "two")
	if err := reg.MoveTag(ctx, reg.Ref("patches/pin:1"), two); err != nil {
		t.Fatal(err)
	}
	push("3", "three")
	h.cli("upgrade", "create", "tampered", "--artifact", reg.Ref("patches/pin:3"), "-l", "*",
		"--failure-tolerance", "100%")
	// The blob of three.sh, as the registry stores it.
	threeSum := upgradeproto.DigestOf(readFile(t, filepath.Join(dir, "three.sh")))
	if err := reg.TamperBlob(threeSum); err != nil {
		t.Fatal(err)
	}
	join := h.token()
	for _, n := range fleet {
		n.start(join)
	}
	d := waitUpgrade(h, "pinned", 60*time.Second, apitype.UpgradeDone, apitype.UpgradeHalted)
	if d.State != apitype.UpgradeDone || d.Digest != one || d.Counts[apitype.StepSucceeded] != 3 {
		t.Fatalf("pinned: %s %q %s counts %v", d.State, d.Reason, d.Digest, d.Counts)
	}
	d = waitUpgrade(h, "tampered", 60*time.Second, apitype.UpgradeHalted, apitype.UpgradeDone)
	if d.State != apitype.UpgradeHalted || !strings.Contains(d.Reason, "digest mismatch") {
		t.Fatalf("tampered: %s %q", d.State, d.Reason)
	}
	for _, n := range d.Nodes {
		if n.Step != apitype.StepFailed || !strings.HasPrefix(n.Reason, "digest mismatch (want "+threeSum) {
			t.Errorf("%s: %s %q", n.Node, n.Step, n.Reason)
		}
	}
	got := markerLines(t, marker)
	if len(got) != 3 || strings.Join(slicesCompact(got), ",") != "one" {
		t.Errorf("ran %v: want the pinned bundle once on each node and nothing else", got)
	}
	if audit := h.cli("audit", "-o", "json"); !strings.Contains(audit, "upgrade_artifact") {
		t.Error("the refused artifact is not in the audit log")
	}
}

// --require-confirmation: nodes wait, across an agent restart, until a
// person says yes: on the hub (`tether upgrade confirm`) for one, on the
// node (`tether-edge confirm`, as root) for the other. Both are recorded.
func TestUpgradeConfirm(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	h := otaHub(t, reg)
	fleet := startUpFleet(t, h, "cf", 2)
	dir := t.TempDir()
	marker := filepath.Join(dir, "ran")
	p := writeScript(t, dir, "install.sh", "echo ok >> "+marker+"\n")
	if _, err := reg.PushBundle(
		context.Background(), reg.Ref("patches/cf:1"), "1", map[string]string{"install.sh": p},
	); err != nil {
		t.Fatal(err)
	}
	h.cli("upgrade", "create", "cf-1", "--artifact", reg.Ref("patches/cf:1"), "--nodes", "cf-00,cf-01",
		"--require-confirmation")
	waitForState(t, "both nodes awaiting confirmation", 60*time.Second,
		func() apitype.UpgradeDetail { return upgradeShow(h, "cf-1") },
		func(d apitype.UpgradeDetail) bool { return d.Counts[apitype.StepAwaitingConfirmation] == 2 })
	// The agent of cf-01 restarts while it waits.
	pid := fleet[1].agentPID(0)
	_ = syscall.Kill(pid, syscall.SIGKILL)
	fleet[1].agentPID(pid)
	if d := upgradeShow(h, "cf-1"); d.Counts[apitype.StepAwaitingConfirmation] != 2 || len(markerLines(t, marker)) != 0 {
		t.Fatalf("after the agent restart: %v, ran %v", d.Counts, markerLines(t, marker))
	}
	h.cli("upgrade", "confirm", "cf-1", "--node", "cf-00")
	// On the node, through the agent's socket (which may still be coming up).
	out := waitForState(t, "tether-edge confirm on cf-01", 30*time.Second, func() string {
		o, _, _ := runCmd(t, 30*time.Second, fleet[1].launcher, "confirm", "--state-dir", fleet[1].dir, "cf-1")
		return o
	}, func(s string) bool { return strings.Contains(s, "confirmed cf-1") })
	t.Logf("%s", strings.TrimSpace(out))
	d := waitUpgrade(h, "cf-1", 60*time.Second, apitype.UpgradeDone, apitype.UpgradeHalted)
	steps := nodeSteps(d)
	host, _ := os.Hostname()
	if d.State != apitype.UpgradeDone || steps["cf-00"].Step != apitype.StepSucceeded ||
		steps["cf-01"].Step != apitype.StepSucceeded {
		t.Fatalf("%s %q: %+v", d.State, d.Reason, steps)
	}
	if by := steps["cf-00"].ConfirmedBy; !strings.HasPrefix(by, "admin:") {
		t.Errorf("cf-00 confirmed by %q", by)
	}
	if by := steps["cf-01"].ConfirmedBy; by != "root@"+host+" (on the node)" {
		t.Errorf("cf-01 confirmed by %q", by)
	}
	if n := len(markerLines(t, marker)); n != 2 {
		t.Errorf("installed %d times", n)
	}
	audit := h.cli("audit", "-o", "json")
	if strings.Count(audit, "upgrade_confirm") < 2 || !strings.Contains(audit, "confirmed on the node") {
		t.Errorf("confirmations not audited:\n%s", audit)
	}
}

// The agent itself: a release that works is switched in on a node and
// the hub sees the node on it; going back is refused without
// --allow-downgrade; a release that cannot reach the hub puts each node
// back on the old version within the health timeout, the reason recorded
// on the hub.
func TestUpgradeAgent(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	h := otaHub(t, reg)
	fleet := startUpFleet(t, h, "ag", 3)
	ctx := context.Background()
	if _, err := reg.PushAgent(ctx, reg.Ref("tether/edge:"+newVersion), newVersion, map[string]string{
		"linux/amd64": testenv.EdgeVersion(t, newVersion),
	}); err != nil {
		t.Fatal(err)
	}
	before := h.connects("ag-00")
	h.cli("upgrade", "create", "edge-good", "--artifact", reg.Ref("tether/edge:"+newVersion), "--nodes", "ag-00",
		"--health-timeout", "30s")
	d := waitUpgrade(h, "edge-good", 90*time.Second, apitype.UpgradeDone, apitype.UpgradeHalted)
	if n := nodeSteps(d)["ag-00"]; d.State != apitype.UpgradeDone || n.Step != apitype.StepSucceeded ||
		n.FromVersion != oldVersion {
		t.Fatalf("good release: %s %q: %+v", d.State, d.Reason, n)
	}
	fleet[0].waitVersion(newVersion, before)

	if _, err := reg.PushAgent(ctx, reg.Ref("tether/edge:"+oldVersion), oldVersion, map[string]string{
		"linux/amd64": testenv.EdgeVersion(t, oldVersion),
	}); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "upgrade", "create", "edge-back",
		"--artifact", reg.Ref("tether/edge:"+oldVersion), "--nodes", "ag-00", "--data-dir", h.dataDir)
	if code == 0 || !strings.Contains(errOut, "--allow-downgrade") {
		t.Fatalf("downgrade without the flag: exit %d %s", code, errOut)
	}

	broken := writeScript(t, t.TempDir(), "tether-edge", "exec sleep 600\n")
	if _, err := reg.PushAgent(
		ctx, reg.Ref("tether/edge:v1.2.0"), "v1.2.0", map[string]string{"linux/amd64": broken},
	); err != nil {
		t.Fatal(err)
	}
	began := time.Now()
	h.cli("upgrade", "create", "edge-bad", "--artifact", reg.Ref("tether/edge:v1.2.0"), "--nodes", "ag-01,ag-02",
		"--health-timeout", "5s", "--failure-tolerance", "100%")
	d = waitUpgrade(h, "edge-bad", 90*time.Second, apitype.UpgradeDone, apitype.UpgradeHalted)
	for _, name := range []string{"ag-01", "ag-02"} {
		n := nodeSteps(d)[name]
		if n.Step != apitype.StepRolledBack ||
			n.Reason != "new version v1.2.0 did not reconnect within 5s; back on "+oldVersion {
			t.Errorf("%s: %s %q", name, n.Step, n.Reason)
		}
	}
	t.Logf("both nodes back on %s %s after the create (health timeout 5s)", oldVersion,
		time.Since(began).Round(100*time.Millisecond))
	for _, n := range fleet[1:] {
		waitFor(t, n.name+" online on "+oldVersion, 30*time.Second, func() bool {
			nd := h.nodes()[n.name]
			return nd.Online && nd.AgentVersion == oldVersion
		})
	}
	if audit := h.cli("audit", "-o", "json"); !strings.Contains(audit, "upgrade_rollback") {
		t.Error("the rollbacks are not in the audit log")
	}
}

// A hub killed -9 while a batch installs starts again and finishes the
// rollout: the nodes done stay done, none installs twice, and a node
// whose install the kill cut short (its SSH session ended with the hub's
// tunnel) says so instead of running it again; one whose install
// finished before its session ended is done.
func TestUpgradeHubKilled(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{})
	h := otaHub(t, reg)
	startUpFleet(t, h, "hk", 6)
	dir := t.TempDir()
	marker, started := filepath.Join(dir, "ran"), filepath.Join(dir, "started")
	p := writeScript(t, dir, "install.sh",
		"echo \"$TETHER_UPGRADE_DIR\" >> "+started+"\nsleep 2\necho \"$TETHER_UPGRADE_DIR\" >> "+marker+"\n")
	if _, err := reg.PushBundle(
		context.Background(), reg.Ref("patches/hk:1"), "1", map[string]string{"install.sh": p},
	); err != nil {
		t.Fatal(err)
	}
	h.cli("upgrade", "create", "hk-1", "--artifact", reg.Ref("patches/hk:1"), "-l", "*", "--batch", "2",
		"--failure-tolerance", "100%")
	// Killed while the second batch installs: the first is done.
	waitFor(t, "the second batch installing", 60*time.Second, func() bool {
		return len(markerLines(t, marker)) >= 2 && len(markerLines(t, started)) > len(markerLines(t, marker))
	})
	h.p.Kill()
	h.start()
	d := waitUpgrade(h, "hk-1", 90*time.Second, apitype.UpgradeDone, apitype.UpgradeHalted)
	if d.State != apitype.UpgradeDone {
		t.Fatalf("%s %q", d.State, d.Reason)
	}
	ok, interrupted := 0, 0
	for _, n := range d.Nodes {
		switch {
		case n.Step == apitype.StepSucceeded:
			ok++
		case n.Step == apitype.StepFailed && strings.Contains(n.Reason, "interrupted in installing"):
			interrupted++
		default:
			t.Errorf("%s: %s %q", n.Node, n.Step, n.Reason)
		}
	}
	lines, starts := markerLines(t, marker), markerLines(t, started)
	sort.Strings(lines)
	sort.Strings(starts)
	// An interrupted install's script may have finished after the apply
	// running it was killed: its outcome is unknown, not absent.
	if len(slicesCompact(starts)) != len(starts) || len(starts) != 6 || len(lines) < ok || len(lines) > ok+interrupted {
		t.Errorf("%d succeeded, %d interrupted; installs started %v, finished %v", ok, interrupted, starts, lines)
	}
	t.Logf("after the kill: %d succeeded, %d interrupted", ok, interrupted)
}
