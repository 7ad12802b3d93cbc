package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

type jobNodeJSON struct {
	Node     string `json:"node"`
	State    string `json:"state"`
	ExitCode *int   `json:"exit_code"`
	Error    string `json:"error"`
	LogBytes int64  `json:"log_bytes"`
}

type jobJSON struct {
	ID     string         `json:"id"`
	Kind   string         `json:"kind"`
	State  string         `json:"state"`
	Error  string         `json:"error"`
	Counts map[string]int `json:"counts"`
	Total  int            `json:"total"`
	Nodes  []jobNodeJSON  `json:"nodes"`
}

func (j jobJSON) node(name string) jobNodeJSON {
	for _, n := range j.Nodes {
		if n.Node == name {
			return n
		}
	}
	return jobNodeJSON{}
}

func (h *hub) job(id string) jobJSON {
	h.t.Helper()
	var j jobJSON
	if err := json.Unmarshal([]byte(h.cli("jobs", "show", id, "-o", "json")), &j); err != nil {
		h.t.Fatal(err)
	}
	return j
}

// run runs `tether run` and returns stdout, stderr and the exit code.
func (h *hub) run(timeout time.Duration, args ...string) (string, string, int) {
	h.t.Helper()
	return runCmd(h.t, timeout, filepath.Join(binDir, "tether"),
		append([]string{"run", "--data-dir", h.dataDir, "--progress", "never"}, args...)...)
}

// runJSON runs `tether run -o json` and decodes the final job record.
func (h *hub) runJSON(timeout time.Duration, args ...string) (jobJSON, int) {
	h.t.Helper()
	out, errOut, code := h.run(timeout, append([]string{"-o", "json"}, args...)...)
	var j jobJSON
	if err := json.Unmarshal([]byte(out), &j); err != nil {
		h.t.Fatalf("tether run %v: exit %d, stdout %q, stderr %s", args, code, out, errOut)
	}
	return j, code
}

// sleepMarker is a `sleep` duration that names this test's remote sleeps
// for pgrep: distinct per test (base) and per test process (the pid), so
// that the same test running elsewhere on the machine is not counted.
func sleepMarker(base int) string {
	return fmt.Sprintf("%d.%07d", base+int(time.Now().UnixNano()%1000), os.Getpid())
}

// TestJobs fans out to 22 agents (21 with the embedded SSH server, one in
// front of a real OpenSSH sshd it manages) and checks what a user of
// `tether run`, `tether jobs` and the HTTP API relies on.
func TestJobs(t *testing.T) {
	h := startHub(t)
	const embedded = 21
	join := h.token("--uses", "30", "--label", "site=lab")
	joinEdge := h.token("--uses", "2", "--label", "site=edge")
	for i := range embedded {
		j := join
		if i == 0 {
			j = joinEdge
		}
		startAgent(t, j, fmt.Sprintf("n%02d", i), "--ssh", "embedded")
	}
	sd := startSSHD(t)
	startAgent(t, join, "real", sd.managedArgs()...)
	// A node that joined and is now offline.
	off, _ := startAgent(t, joinEdge, "off", "--ssh", "embedded")
	h.waitOnline("off", "")
	off.Stop(syscall.SIGTERM, stopWait)
	waitFor(t, "all nodes online, off offline", 60*time.Second, func() bool {
		nodes := h.nodes()
		online := 0
		for _, n := range nodes {
			if n.Online {
				online++
			}
		}
		return online == embedded+1 && !nodes["off"].Online
	})
	// The managed sshd needs its host certificate and principals in place.
	waitFor(t, "managed sshd configured", 30*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(sd.dir, "tether", "principals", loginUser))
		return err == nil
	})

	t.Run("fan_out_true", func(t *testing.T) {
		start := time.Now()
		out, errOut, code := h.run(2*time.Minute, "-l", "*", "--", "true")
		took := time.Since(start)
		if code != 3 { // every online node ok, the offline one skipped
			t.Fatalf("exit %d, want 3 (skipped only)\n%s\n%s", code, out, errOut)
		}
		if !strings.Contains(out, "22 ok, 0 failed, 1 skipped") || !strings.Contains(out, "off ") {
			t.Fatalf("summary:\n%s", out)
		}
		t.Logf("tether run -- true on %d nodes (plus 1 offline): %s wall time", embedded+1, took.Round(time.Millisecond))
	})

	t.Run("output_prefixed_and_exit_codes", func(t *testing.T) {
		out, errOut, code := h.run(time.Minute, "--nodes", "n01,n02,real",
			"--", `echo "out $TETHER_NODE"; echo "err $TETHER_NODE" >&2; [ "$TETHER_NODE" != n02 ] || exit 4`)
		if code != 1 {
			t.Fatalf("exit %d, want 1", code)
		}
		for _, want := range []string{"n01  | out n01", "real | out real"} {
			if !strings.Contains(out, want) {
				t.Errorf("stdout lacks %q:\n%s", want, out)
			}
		}
		if !strings.Contains(errOut, "n02  | err n02") {
			t.Errorf("stderr lacks the node's stderr line:\n%s", errOut)
		}
		if !strings.Contains(out, "n02   failed  4") {
			t.Errorf("summary lacks n02's failure:\n%s", out)
		}
	})

	t.Run("script_and_upload_checksum", func(t *testing.T) {
		dir := t.TempDir()
		payload := make([]byte, 3<<20)
		rand.Read(payload)
		sum := sha256.Sum256(payload)
		local := filepath.Join(dir, "app.tar")
		os.WriteFile(local, payload, 0o640)
		script := filepath.Join(dir, "setup.sh")
		os.WriteFile(script, []byte(`#!/bin/sh
set -eu
sha256sum "$DEST" | cut -d' ' -f1 > "$OUT/$TETHER_NODE.sum"
stat -c %a "$DEST" > "$OUT/$TETHER_NODE.mode"
`), 0o755)
		for _, node := range []string{"n03", "real"} {
			dest := filepath.Join(dir, "dest-"+node, "app.tar")
			os.MkdirAll(filepath.Dir(dest), 0o755)
			j, code := h.runJSON(time.Minute, "--nodes", node, "--script", script, "--upload", local+":"+dest,
				"--env", "DEST="+dest, "--env", "OUT="+dir)
			if code != 0 || j.State != "succeeded" {
				t.Fatalf("%s: exit %d, job %+v", node, code, j)
			}
			got, _ := os.ReadFile(dest)
			if !bytes.Equal(got, payload) {
				t.Fatalf("%s: uploaded file differs (%d bytes)", node, len(got))
			}
			remoteSum, _ := os.ReadFile(filepath.Join(dir, node+".sum"))
			mode, _ := os.ReadFile(filepath.Join(dir, node+".mode"))
			if strings.TrimSpace(string(remoteSum)) != hex.EncodeToString(sum[:]) || strings.TrimSpace(string(mode)) != "640" {
				t.Fatalf("%s: script saw sha256 %q mode %q", node, remoteSum, mode)
			}
			log := h.cli("jobs", "logs", j.ID, "--node", node)
			if !strings.Contains(log, "sha256:"+hex.EncodeToString(sum[:])+" verified on the node") {
				t.Fatalf("%s: log lacks the verified upload:\n%s", node, log)
			}
		}
		// A destination whose directory is missing fails clearly.
		j, code := h.runJSON(time.Minute, "--nodes", "n03", "--upload", local+":"+filepath.Join(dir, "missing", "x"),
			"--", "true")
		if code != 1 || j.node("n03").State != "failed" || !strings.Contains(j.node("n03").Error, "missing") {
			t.Fatalf("missing dir: exit %d, %+v", code, j.node("n03"))
		}
	})

	t.Run("max_failures_stops", func(t *testing.T) {
		j, code := h.runJSON(time.Minute, "-l", "site=lab", "--parallel", "1", "--max-failures", "2", "--", "exit 1")
		if code != 1 || j.State != "failed" || j.Counts["failed"] != 3 || j.Counts["skipped"] != j.Total-3 ||
			!strings.Contains(j.Error, "max-failures") {
			t.Fatalf("exit %d, job %+v", code, j)
		}
		// Rerun of the failed nodes (now succeeding is up to the command:
		// the same spec fails again, on the failed and skipped nodes only).
		out := h.cli("jobs", "rerun", j.ID, "--failed", "--detach")
		re := h.job(strings.TrimSpace(out))
		if re.Total != j.Total {
			t.Fatalf("rerun targets %d nodes, want %d", re.Total, j.Total)
		}
	})

	t.Run("timeout_kills_remote_process", func(t *testing.T) {
		for _, node := range []string{"n04", "real"} {
			pidFile := filepath.Join(t.TempDir(), "pid")
			start := time.Now()
			j, code := h.runJSON(time.Minute, "--nodes", node, "--timeout", "2s",
				"--", fmt.Sprintf("sleep 300 & echo $! > %s; wait", pidFile))
			if code != 1 || !strings.Contains(j.node(node).Error, "timed out after 2s") {
				t.Fatalf("%s: exit %d, %+v", node, code, j.node(node))
			}
			b, _ := os.ReadFile(pidFile)
			pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
			if err != nil {
				t.Fatalf("%s: pid file %q", node, b)
			}
			waitFor(t, node+": remote sleep killed", 10*time.Second, func() bool { return !testenv.ProcessAlive(pid) })
			t.Logf("%s: timed out and killed in %s", node, time.Since(start).Round(time.Millisecond))
		}
	})

	t.Run("ctrl_c_cancels_everywhere", func(t *testing.T) {
		marker := sleepMarker(4000)
		cmd := exec.Command(filepath.Join(binDir, "tether"), "run", "--data-dir", h.dataDir, "--progress", "never",
			"--nodes", "n05,n06,real", "--", "sleep "+marker)
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "remote sleeps running", 30*time.Second, func() bool {
			o, _ := exec.Command("pgrep", "-xf", "sleep "+marker).Output()
			return len(strings.Fields(string(o))) == 3
		})
		cmd.Process.Signal(syscall.SIGINT)
		err := cmd.Wait()
		if ee, ok := err.(*exec.ExitError); !ok || ee.ExitCode() != 130 {
			t.Fatalf("tether run after Ctrl-C: %v, want exit 130\n%s", err, out.String())
		}
		waitFor(t, "remote sleeps killed", 10*time.Second, func() bool {
			return exec.Command("pgrep", "-xf", "sleep "+marker).Run() != nil
		})
		if !strings.Contains(out.String(), "cancelled") {
			t.Fatalf("output:\n%s", out.String())
		}
	})

	t.Run("http_api_with_api_token", func(t *testing.T) {
		h.cli("role", "create", "automation", "--nodes", "site=lab", "--logins", "root,"+loginUser)
		token := strings.TrimSpace(h.cli("apitoken", "create", "--role", "automation"))
		if !strings.HasPrefix(token, "tapi_") {
			t.Fatalf("token %q", token)
		}
		curl := func(method, path, body, tok string) (int, string) {
			args := []string{"-sS", "-o", "-", "-w", "\n%{http_code}", "-X", method,
				"--cacert", filepath.Join(h.dataDir, "admin", "ca.crt"),
				"--resolve", fmt.Sprintf("hub.tether.internal:%d:127.0.0.1", h.apiPort), "-H", "Authorization: Bearer " + tok}
			if body != "" {
				args = append(args, "-H", "Content-Type: application/json", "--data", body)
			}
			out, errOut, code := runCmd(t, time.Minute, "curl",
				append(args, fmt.Sprintf("https://hub.tether.internal:%d%s", h.apiPort, path))...)
			if code != 0 {
				t.Fatalf("curl: %d %s", code, errOut)
			}
			i := strings.LastIndex(out, "\n")
			status, _ := strconv.Atoi(out[i+1:])
			return status, out[:i]
		}
		status, body := curl("POST", "/v1/jobs", `{"command":"echo api","nodes":["n07","n08"]}`, token)
		if status != 201 {
			t.Fatalf("create job: %d %s", status, body)
		}
		var j jobJSON
		json.Unmarshal([]byte(body), &j)
		status, body = curl("GET", "/v1/jobs/"+j.ID+"/events", "", token)
		if status != 200 || !strings.Contains(body, `"type":"job"`) || !strings.Contains(body, `"state":"succeeded"`) {
			t.Fatalf("events: %d %s", status, body)
		}
		// n00 is site=edge: outside the role.
		status, body = curl("POST", "/v1/jobs", `{"command":"id","nodes":["n00"]}`, token)
		if status != 403 || !strings.Contains(body, `may not run jobs on n00`) {
			t.Fatalf("outside the role: %d %s", status, body)
		}
		status, body = curl("GET", "/v1/jobs", "", token)
		var list []jobJSON
		if status != 200 || json.Unmarshal([]byte(body), &list) != nil || len(list) != 1 || list[0].ID != j.ID {
			t.Fatalf("a token sees only its role's jobs: %d %s", status, body)
		}
		if status, body = curl("GET", "/v1/tokens", "", token); status != 403 ||
			!strings.Contains(body, "needs the admin identity") {
			t.Fatalf("admin endpoint with a valid API token: %d %s; want 403 (authenticated, not allowed)", status, body)
		}
		status, body = curl("GET", "/v1/jobs", "", "tapi_aaaaaaaa.bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb")
		if status != 401 || !strings.Contains(body, "API token refused") {
			t.Fatalf("bad token: %d %s", status, body)
		}
		status, body = curl("POST", "/v1/jobs", `{"command":"x","nodes":["n07"],"bogus":1}`, token)
		if status != 400 || !strings.Contains(body, "unknown field") {
			t.Fatalf("bad body: %d %s", status, body)
		}
		if !strings.Contains(h.cli("audit"), "api_auth") {
			t.Fatal("refused API token not audited")
		}
	})
}

// TestJobsSurviveHubCrash kills the hub with SIGKILL in the middle of a job:
// the remote processes run on while the hub is away (their node holds the
// job's connection for the resume window, as for a link that comes back),
// and end once the restarted hub, which cannot resume them, refuses their
// streams; the job and its live runs read interrupted (no silent gap), and
// a rerun of the interrupted nodes completes.
func TestJobsSurviveHubCrash(t *testing.T) {
	// The agents must notice the killed hub (QUIC hears nothing from a
	// SIGKILL) within the wait for their remote processes below: it is
	// their own dead-peer timeout that counts, so they run with the
	// shorter one too.
	h := startHubIn(t, "", 0, quickDeadPeer...)
	join := h.token("--uses", "4")
	for i := range 4 {
		startAgent(t, join, fmt.Sprintf("c%d", i), append([]string{"--ssh", "embedded"}, quickDeadPeer...)...)
	}
	for i := range 4 {
		h.waitOnline(fmt.Sprintf("c%d", i), "")
	}
	marker := sleepMarker(5000)
	gate := filepath.Join(t.TempDir(), "gate")
	// c0 finishes at once; the others are still running when the hub dies.
	// Once the gate exists the same command finishes at once everywhere.
	out, errOut, code := h.run(time.Minute, "--detach", "-l", "*",
		"--", fmt.Sprintf(`[ "$TETHER_NODE" = c0 ] || [ -f %s ] || sleep %s`, gate, marker))
	if code != 0 {
		t.Fatalf("tether run --detach: exit %d: %s", code, errOut)
	}
	id := strings.TrimSpace(out)
	waitFor(t, "c0 done, three running", 30*time.Second, func() bool {
		j := h.job(id)
		return j.Counts["ok"] == 1 && j.Counts["running"] == 3
	})
	h.p.Stop(syscall.SIGKILL, stopWait)
	// Past the agents' dead-peer timeout (quickDeadPeer: 15 s), well within
	// the resume window (60 s): their sessions are gone, the commands not.
	time.Sleep(17 * time.Second)
	if exec.Command("pgrep", "-xf", "sleep "+marker).Run() != nil {
		t.Fatal("the remote sleeps ended with the hub; they should run on for the resume window")
	}
	h.start()
	waitFor(t, "remote sleeps killed once the restarted hub refused their streams", 30*time.Second, func() bool {
		return exec.Command("pgrep", "-xf", "sleep "+marker).Run() != nil
	})
	j := h.job(id)
	if j.State != "interrupted" || j.Counts["ok"] != 1 || j.Counts["interrupted"] != 3 {
		t.Fatalf("after the crash: %+v", j)
	}
	for _, n := range j.Nodes {
		if n.State == "interrupted" && !strings.Contains(n.Error, "hub stopped") {
			t.Fatalf("interrupted run without a reason: %+v", n)
		}
	}
	for i := range 4 {
		h.waitOnline(fmt.Sprintf("c%d", i), "")
	}
	os.WriteFile(gate, nil, 0o644)
	out = strings.TrimSpace(h.cli("jobs", "rerun", id, "--failed", "--detach"))
	waitFor(t, "rerun done", 30*time.Second, func() bool { return h.job(out).State != "running" })
	if re := h.job(out); re.Total != 3 || re.State != "succeeded" {
		t.Fatalf("rerun of the interrupted nodes: %+v", re)
	}
}
