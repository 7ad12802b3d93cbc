package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

type memberJSON struct {
	Node      string `json:"node"`
	Engine    string `json:"engine"`
	Desired   string `json:"desired"`
	State     string `json:"state"`
	LastError string `json:"last_error"`
	LastJob   string `json:"last_job"`
}

func (h *hub) members() map[string]memberJSON {
	h.t.Helper()
	var list []memberJSON
	if err := json.Unmarshal([]byte(h.cli("cluster", "status", "-o", "json")), &list); err != nil {
		h.t.Fatal(err)
	}
	m := map[string]memberJSON{}
	for _, x := range list {
		m[x.Node] = x
	}
	return m
}

func (h *hub) waitMember(node, state string, cond func(memberJSON) bool) memberJSON {
	h.t.Helper()
	var last memberJSON
	waitFor(h.t, node+" "+state, 90*time.Second, func() bool {
		last = h.members()[node]
		return last.State == state && (cond == nil || cond(last))
	})
	return last
}

// testEngine writes an engine whose install leaves files in dir/NODE and
// whose uninstall removes them; marker files steer it: fail-NODE makes the
// install fail, hold-NODE makes it wait.
func testEngine(t *testing.T, enginesDir, markers string) {
	t.Helper()
	d := filepath.Join(enginesDir, "testeng")
	os.MkdirAll(d, 0o755)
	os.WriteFile(filepath.Join(d, "install.sh"), []byte(`#!/bin/sh
set -eu
d="$MARKER_DIR/$TETHER_NODE"
[ ! -f "$MARKER_DIR/fail-$TETHER_NODE" ] || { echo "install refused by a test marker" >&2; exit 1; }
mkdir -p "$d"
echo "$TETHER_JOB" >> "$d/install-runs"
i=0
while [ -f "$MARKER_DIR/hold-$TETHER_NODE" ] && [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done
echo installed > "$d/installed"
`), 0o755)
	os.WriteFile(filepath.Join(d, "uninstall.sh"), []byte(`#!/bin/sh
set -eu
rm -rf "$MARKER_DIR/$TETHER_NODE"
echo "$TETHER_NODE" >> "$MARKER_DIR/uninstalled-by-original"
`), 0o755)
	os.WriteFile(filepath.Join(d, "engine.yaml"),
		[]byte(fmt.Sprintf("description: test engine\ntimeout: 2m\nenv:\n  MARKER_DIR: %q\n", markers)), 0o644)
}

// TestClusterLifecycle drives the cluster-agent state machine end to end:
// register/install, deregister/uninstall from the script cached at install
// (after the engine definition changed), a failed install, and a hub
// killed during an install that resumes and finishes after restart.
func TestClusterLifecycle(t *testing.T) {
	markers, engines := t.TempDir(), t.TempDir()
	os.Chmod(markers, 0o777)
	testEngine(t, engines, markers)
	h := startHubIn(t, "", 0, "--engines-dir", engines)
	join := h.token("--uses", "3")
	sd := startSSHD(t)
	_, k1State := startAgent(t, join, "k1", sd.managedArgs()...) // a real sshd
	startAgent(t, join, "k2", "--ssh", "embedded")
	startAgent(t, join, "k3", "--ssh", "embedded")
	for _, n := range []string{"k1", "k2", "k3"} {
		h.waitOnline(n, "")
	}
	waitFor(t, "managed sshd configured", 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(sd.dir, "tether", "principals", loginUser))
		return err == nil
	})

	t.Run("unknown_engine", func(t *testing.T) {
		_, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "cluster", "register", "k1",
			"--engine", "nope", "--data-dir", h.dataDir)
		if code == 0 || !strings.Contains(errOut, "nope") || !strings.Contains(errOut, "k3s") ||
			!strings.Contains(errOut, "testeng") {
			t.Fatalf("exit %d: %s", code, errOut)
		}
	})

	t.Run("register_install_deregister_from_cache", func(t *testing.T) {
		h.cli("cluster", "register", "k1", "--engine", "testeng")
		m := h.waitMember("k1", "active", nil)
		if m.Desired != "active" || m.LastError != "" || m.LastJob == "" {
			t.Fatalf("member %+v", m)
		}
		if b, err := os.ReadFile(filepath.Join(markers, "k1", "installed")); err != nil || string(b) != "installed\n" {
			t.Fatalf("install left no marker: %v", err)
		}
		cache := filepath.Join(k1State, "cluster", "testeng", "uninstall.sh")
		if _, err := os.Stat(cache); err != nil {
			t.Fatalf("uninstall script not cached in the agent's state dir: %v", err)
		}
		if n := h.nodes()["k1"]; true {
			var list []map[string]any
			json.Unmarshal([]byte(h.cli("nodes", "-o", "json")), &list)
			found := false
			for _, x := range list {
				found = found || (x["name"] == "k1" && x["cluster_state"] == "active")
			}
			if !found {
				t.Fatalf("tether nodes does not show k1 active (%+v)", n)
			}
		}
		// The engine definition changes; deregistration must still run the
		// script cached at install.
		os.WriteFile(filepath.Join(engines, "testeng", "uninstall.sh"),
			[]byte("#!/bin/sh\necho new >> \"$MARKER_DIR/uninstalled-by-new\"\nexit 1\n"), 0o755)
		h.cli("cluster", "deregister", "k1")
		m = h.waitMember("k1", "inactive", nil)
		if m.Desired != "inactive" || m.LastError != "" {
			t.Fatalf("member after deregister %+v", m)
		}
		if _, err := os.Stat(filepath.Join(markers, "k1")); !os.IsNotExist(err) {
			t.Fatalf("uninstall left the install's files: %v", err)
		}
		if b, _ := os.ReadFile(filepath.Join(markers, "uninstalled-by-original")); !strings.Contains(string(b), "k1") {
			t.Fatal("the cached (original) uninstall script did not run")
		}
		if _, err := os.Stat(filepath.Join(markers, "uninstalled-by-new")); err == nil {
			t.Fatal("the changed engine's uninstall ran instead of the cached one")
		}
		if _, err := os.Stat(cache); !os.IsNotExist(err) {
			t.Fatalf("cache not removed after a successful uninstall: %v", err)
		}
		audit := h.cli("audit", "--node", "k1")
		for _, want := range []string{"inactive -> registering", "registering -> install_in_progress",
			"install_in_progress -> active",
			"active -> deregistering", "deregistering -> uninstall_in_progress", "uninstall_in_progress -> inactive"} {
			if !strings.Contains(audit, want) {
				t.Errorf("audit lacks %q:\n%s", want, audit)
			}
		}
	})

	t.Run("failed_install", func(t *testing.T) {
		os.WriteFile(filepath.Join(markers, "fail-k2"), nil, 0o644)
		h.cli("cluster", "register", "k2", "--engine", "testeng")
		m := h.waitMember("k2", "inactive", func(m memberJSON) bool { return m.LastError != "" })
		if !strings.Contains(m.LastError, "exit status 1") || m.Desired != "active" {
			t.Fatalf("member %+v", m)
		}
		log := h.cli("jobs", "logs", m.LastJob, "--node", "k2")
		if !strings.Contains(log, "install refused by a test marker") {
			t.Fatalf("install log:\n%s", log)
		}
	})

	// `tether cluster register; tether cluster deregister` while the install
	// runs: the deregister is kept, not overwritten when the install ends,
	// and honoured then with the uninstall cached at the install's start.
	t.Run("deregister_during_install", func(t *testing.T) {
		testEngine(t, engines, markers) // the uninstall.sh an earlier subtest broke
		os.Remove(filepath.Join(markers, "fail-k2"))
		hold := filepath.Join(markers, "hold-k2")
		os.WriteFile(hold, nil, 0o644)
		defer os.Remove(hold)
		h.cli("cluster", "register", "k2", "--engine", "testeng")
		waitFor(t, "k2's install to run", 90*time.Second, func() bool {
			_, err := os.Stat(filepath.Join(markers, "k2", "install-runs"))
			return err == nil
		})
		h.cli("cluster", "deregister", "k2")
		if m := h.members()["k2"]; m.Desired != "inactive" || m.State != "install_in_progress" {
			t.Fatalf("right after the deregister: %+v", m)
		}
		os.Remove(hold)
		m := h.waitMember("k2", "inactive", func(m memberJSON) bool {
			_, err := os.Stat(filepath.Join(markers, "k2"))
			return os.IsNotExist(err)
		})
		if m.Desired != "inactive" {
			t.Fatalf("the deregister was lost when the install ended: %+v", m)
		}
		time.Sleep(2 * time.Second) // the controller's next looks change nothing
		if m := h.members()["k2"]; m.Desired != "inactive" || m.State != "inactive" {
			t.Fatalf("after the install and the uninstall: %+v", m)
		}
		audit := h.cli("audit", "--node", "k2")
		for _, want := range []string{"the install under way ends first",
			"install_in_progress -> active: installation command successful; the deregister requested during the install",
			"active -> deregistering: deregister requested",
			"deregistering -> uninstall_in_progress: uninstall command cached at install",
			"uninstall_in_progress -> inactive: uninstallation command successful"} {
			if !strings.Contains(audit, want) {
				t.Errorf("audit lacks %q:\n%s", want, audit)
			}
		}
		if strings.Contains(audit, "||") {
			t.Errorf("the audit gives the diagram's labels, not what happened:\n%s", audit)
		}
	})

	t.Run("hub_killed_during_install_resumes", func(t *testing.T) {
		hold := filepath.Join(markers, "hold-k3")
		os.WriteFile(hold, nil, 0o644)
		h.cli("cluster", "register", "k3", "--engine", "testeng")
		first := h.waitMember("k3", "install_in_progress", func(memberJSON) bool {
			_, err := os.Stat(filepath.Join(markers, "k3", "install-runs"))
			return err == nil
		})
		h.p.Stop(syscall.SIGKILL, stopWait)
		os.Remove(hold)
		h.start()
		m := h.waitMember("k3", "active", nil)
		runs, _ := os.ReadFile(filepath.Join(markers, "k3", "install-runs"))
		if strings.Count(string(runs), "\n") != 2 || m.LastJob == first.LastJob {
			t.Fatalf("install runs %q, jobs %s then %s: want the install re-run once after the restart",
				runs, first.LastJob, m.LastJob)
		}
		if j := h.job(first.LastJob); j.State != "interrupted" || j.Kind != "cluster_install" {
			t.Fatalf("the install job the crash cut short reads %+v", j)
		}
	})

	// One node, one Kubernetes: a node with an engine cannot join a KubeOne
	// cluster, and a KubeOne member cannot be registered for an engine.
	t.Run("one_kubernetes_per_node", func(t *testing.T) {
		tether := filepath.Join(binDir, "tether")
		_, errOut, code := runCmd(t, 30*time.Second, tether, "kubeone", "create", "edge3",
			"--control-plane", "k3", "--kubernetes", "1.30.5", "--data-dir", h.dataDir)
		if code == 0 || !strings.Contains(errOut, `node "k3" has the testeng engine`) ||
			!strings.Contains(errOut, "tether cluster deregister k3") {
			t.Fatalf("kubeone create on a node with an engine: exit %d: %s", code, errOut)
		}
		// This hub has no kubeone (unless one is on this machine's PATH): the
		// version is checked against the releases it knows, and the warning
		// says whose PATH was searched.
		_, hasKubeOne := exec.LookPath("kubeone")
		noKubeOne := hasKubeOne != nil
		_, errOut, code = runCmd(t, 30*time.Second, tether, "kubeone", "create", "edge2",
			"--control-plane", "k2", "--kubernetes", "1.30.5", "--data-dir", h.dataDir)
		if code != 0 || noKubeOne && !strings.Contains(errOut, `no "kubeone" on the hub's PATH`) {
			t.Fatalf("kubeone create on a node without an engine: exit %d: %s", code, errOut)
		}
		_, errOut, code = runCmd(t, 30*time.Second, tether, "cluster", "register", "k2", "--engine", "testeng",
			"--data-dir", h.dataDir)
		if code == 0 || !strings.Contains(errOut, `node "k2" is a member of KubeOne cluster "edge2"`) {
			t.Fatalf("register of a KubeOne member: exit %d: %s", code, errOut)
		}
		if m := h.members()["k2"]; m.Desired != "inactive" {
			t.Fatalf("the refused register changed k2: %+v", m)
		}
		if noKubeOne {
			_, errOut, code = runCmd(t, 30*time.Second, tether, "kubeone", "apply", "edge2", "--data-dir", h.dataDir)
			want := `no "kubeone" on the hub's PATH (the hub process's, on the hub's machine; not this CLI's)`
			if code == 0 || !strings.Contains(errOut, want) {
				t.Fatalf("apply on a hub without kubeone: exit %d: %s", code, errOut)
			}
		}
	})
}
