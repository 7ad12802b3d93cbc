package e2e

import (
	"bufio"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"
)

// unitDir holds the systemd units the project ships.
const unitDir = "../packaging/systemd"

// unitValues returns the values of key in a unit file, in order.
func unitValues(t *testing.T, unit, key string) []string {
	t.Helper()
	f, err := os.Open(filepath.Join(unitDir, unit))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var vals []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+"="); ok {
			vals = append(vals, v)
		}
	}
	return vals
}

// restartPrevented returns the exit statuses tether-edge.service names in
// RestartPreventExitStatus=: systemd does not restart the agent after them.
func restartPrevented(t *testing.T) []string {
	t.Helper()
	lines := unitValues(t, "tether-edge.service", "RestartPreventExitStatus")
	if len(lines) != 1 {
		t.Fatalf("tether-edge.service: want one RestartPreventExitStatus=, have %q", lines)
	}
	return strings.Fields(lines[0])
}

// exitCode is how a stopped process exited (-1 if by a signal).
func exitCode(t *testing.T, p *proc) int {
	t.Helper()
	var ee *exec.ExitError
	if err := p.Err(); err == nil {
		return 0
	} else if !errors.As(err, &ee) {
		t.Fatalf("%s: %v", p.Name, err)
	}
	return ee.ExitCode()
}

// TestRefusedNodeExitsForGood: an agent whose node is revoked (or removed)
// on the hub exits within seconds with the status the shipped systemd
// unit names in RestartPreventExitStatus=, and says how to bring the node
// back; started again, as a supervisor would, it exits the same way
// instead of retrying.
func TestRefusedNodeExitsForGood(t *testing.T) {
	const refused = "77"
	if prevent := restartPrevented(t); !slices.Contains(prevent, refused) {
		t.Fatalf("tether-edge.service: RestartPreventExitStatus=%s lacks %s", strings.Join(prevent, " "), refused)
	}
	h := startHub(t)
	join := h.token("--uses", "2")
	rev, revDir := startAgent(t, join, "rev", "--ssh", "embedded")
	gone, _ := startAgent(t, join, "gone", "--ssh", "embedded")
	h.waitOnline("rev", "")
	h.waitOnline("gone", "")

	h.cli("nodes", "revoke", "rev")
	h.cli("nodes", "rm", "gone")
	for _, a := range []struct {
		p    *proc
		name string
	}{{rev, "rev"}, {gone, "gone"}} {
		select {
		case <-a.p.Done():
		case <-time.After(20 * time.Second):
			t.Fatalf("agent %s still running 20s after the hub refused it", a.name)
		}
		if code := exitCode(t, a.p); strconv.Itoa(code) != refused {
			t.Fatalf("agent %s exited %d, want %s (RestartPreventExitStatus= of tether-edge.service)",
				a.name, code, refused)
		}
		for _, want := range []string{
			"tether-edge: hub refused this node", "`tether nodes rm " + a.name + "`", "`tether token create`",
			"--join JOIN_STRING",
		} {
			if !strings.Contains(a.p.Log(), want) {
				t.Fatalf("agent %s's last words lack %q:\n%s", a.name, want, a.p.Tail(2000))
			}
		}
	}
	if st := readStatus(t, revDir); st.State != "refused" || !strings.Contains(st.LastError, "tether nodes rm rev") {
		t.Fatalf("status of the revoked node: %+v", st)
	}

	// Restarted, the revoked agent is refused at its handshake and exits
	// the same way.
	again := start(t, "agent-rev-again", filepath.Join(binDir, "tether-edge"), "run", "--state-dir", revDir,
		"--ssh", "embedded", "--shell", "/bin/sh", "--backoff-max", "2s")
	select {
	case <-again.Done():
	case <-time.After(30 * time.Second):
		t.Fatal("restarted revoked agent still running after 30s")
	}
	if code := exitCode(t, again); strconv.Itoa(code) != refused || !strings.Contains(again.Log(), "revoked") {
		t.Fatalf("restarted revoked agent: exit %d:\n%s", code, again.Tail(2000))
	}
}

// TestUnjoinedAgentExitsForGood: `tether-edge run` on a machine that has
// not joined and has no join string (the packaged unit at every boot until
// someone gives one) exits with a status the unit names in
// RestartPreventExitStatus=, instead of being restarted every few seconds,
// and says the commands that give it one, with the paths it really uses.
// Under --supervise (machines without systemd) the supervisor stops too.
func TestUnjoinedAgentExitsForGood(t *testing.T) {
	const notJoined = "78"
	if prevent := restartPrevented(t); !slices.Contains(prevent, notJoined) {
		t.Fatalf("tether-edge.service: RestartPreventExitStatus=%s lacks %s", strings.Join(prevent, " "), notJoined)
	}
	dir := t.TempDir()
	stateDir, joinFile := filepath.Join(dir, "state"), filepath.Join(dir, "etc", "join")
	env := slices.DeleteFunc(os.Environ(), func(kv string) bool { return strings.HasPrefix(kv, "TETHER_JOIN=") })
	for _, tc := range []struct {
		name string
		args []string
	}{
		{"run", nil},
		{"supervised", []string{"--supervise"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cmd := exec.Command(filepath.Join(binDir, "tether-edge"), append([]string{"run", "--state-dir", stateDir,
				"--join-file", joinFile, "--ssh", "embedded"}, tc.args...)...)
			cmd.Env = env
			var stderr strings.Builder
			cmd.Stderr = &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			select {
			case <-done:
			case <-time.After(30 * time.Second):
				cmd.Process.Kill()
				<-done
				t.Fatalf("still running after 30s:\n%s", stderr.String())
			}
			if code := cmd.ProcessState.ExitCode(); strconv.Itoa(code) != notJoined {
				t.Fatalf("exit %d, want %s (RestartPreventExitStatus= of tether-edge.service):\n%s",
					code, notJoined, stderr.String())
			}
			for _, want := range []string{
				"this node has not joined a hub yet (no node.json in " + stateDir + ")",
				"or a line in " + joinFile,
				"`tether token create`",
				"install -D -m 0600 /dev/null " + joinFile + "\n",
				"echo 'JOIN_STRING' > " + joinFile + "\n",
			} {
				if !strings.Contains(stderr.String(), want) {
					t.Errorf("message lacks %q:\n%s", want, stderr.String())
				}
			}
			if n := strings.Count(stderr.String(), "has not joined"); n != 1 {
				t.Errorf("the agent ran %d times, want once:\n%s", n, stderr.String())
			}
		})
	}
}

// TestWrongPinNamesTheJoinString: a join string or --ca-pin whose pin is
// not the hub's CA fails saying where a right pin comes from, and a join
// does not call a hub that answered "unreachable".
func TestWrongPinNamesTheJoinString(t *testing.T) {
	h := startHub(t)
	join := h.token()
	wrong := regexp.MustCompile(`ca=sha256:[0-9a-f]{64}`).ReplaceAllString(join, "ca=sha256:"+strings.Repeat("ab", 32))
	if wrong == join {
		t.Fatalf("no pin in join string %q", join)
	}
	_, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether-edge"), "join", wrong,
		"--state-dir", filepath.Join(t.TempDir(), "n"), "--name", "n")
	if code != 1 || !strings.Contains(errOut, "join string") || !strings.Contains(errOut, "tether token create") ||
		strings.Contains(errOut, "no hub reachable") {
		t.Fatalf("join with a wrong pin: exit %d: %s", code, errOut)
	}
	_, errOut, code = runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "login", "--hub", h.apiAddr(),
		"--ca-pin", "sha256:"+strings.Repeat("ab", 32), "--user", "alice", "--key", opKey, "--out-dir", t.TempDir())
	if code == 0 || !strings.Contains(errOut, "join string") || !strings.Contains(errOut, "--ca-pin") {
		t.Fatalf("login with a wrong pin: exit %d: %s", code, errOut)
	}
}

// TestEdgeStatusWording: `tether-edge status` never shows the zero time:
// before any run it says no agent has run; while connected it says since
// when (and `tether nodes` shows the node seen "now"); after the agent is
// killed it says the agent is gone.
func TestEdgeStatusWording(t *testing.T) {
	h := startHub(t)
	dir := filepath.Join(t.TempDir(), "st")
	edgeBin := filepath.Join(binDir, "tether-edge")
	if _, errOut, code := runCmd(
		t, 30*time.Second, edgeBin, "join", h.token(), "--state-dir", dir, "--name", "st",
	); code != 0 {
		t.Fatalf("join: %s", errOut)
	}
	status := func() string {
		out, errOut, code := runCmd(t, 10*time.Second, edgeBin, "status", "--state-dir", dir)
		if code != 0 || strings.Contains(out, "0001-01-01") {
			t.Fatalf("status: exit %d: %s%s", code, out, errOut)
		}
		return out
	}
	if out := status(); !strings.Contains(out, "state:        not running (no agent has run with this state dir yet") {
		t.Fatalf("status before the first run:\n%s", out)
	}
	a := start(t, "agent-st", edgeBin, "run", "--state-dir", dir, "--ssh", "embedded", "--shell", "/bin/sh")
	h.waitOnline("st", "")
	waitForState(t, "status to say connected", 10*time.Second, status, func(out string) bool {
		return strings.Contains(out, "state:        connected since ") && strings.Contains(out, " ago)")
	})
	// The hub's listing shows the connected node as seen now.
	listing := h.cli("nodes")
	if !slices.ContainsFunc(strings.Split(listing, "\n"), func(line string) bool {
		f := strings.Fields(line)
		return len(f) > 0 && f[0] == "st" && slices.Contains(f, "now")
	}) {
		t.Fatalf("tether nodes: no row for st with LAST SEEN \"now\":\n%s", listing)
	}
	a.Kill()
	if out := status(); !strings.Contains(out,
		"not running (agent pid "+strconv.Itoa(a.PID())+" exited; it was connected since") {
		t.Fatalf("status after the agent was killed:\n%s", out)
	}
}

// TestSystemdUnits: the shipped units pass `systemd-analyze verify` (with
// ExecStart= pointed at the built binaries; the agent's names a bare
// tether-edge, which systemd finds in /usr/local/bin or /usr/bin), carry no inline comments
// (systemd would read them as part of the value), and the hub's unit is
// confined (`systemd-analyze security` exposure at most 2.0).
func TestSystemdUnits(t *testing.T) {
	analyze, err := exec.LookPath("systemd-analyze")
	if err != nil {
		t.Skip("systemd-analyze not installed (Debian package systemd): the unit files are not checked")
	}
	units, _ := filepath.Glob(filepath.Join(unitDir, "*.service"))
	slices.Sort(units)
	if want := []string{"tether-edge.service", "tether.service"}; !slices.Equal(baseNames(units), want) {
		t.Fatalf("units in %s: %v, want %v", unitDir, baseNames(units), want)
	}
	dir := t.TempDir()
	inline := regexp.MustCompile(`^[A-Za-z]+=.*\s[#;]`)
	for _, u := range units {
		b, err := os.ReadFile(u)
		if err != nil {
			t.Fatal(err)
		}
		for i, line := range strings.Split(string(b), "\n") {
			if inline.MatchString(line) {
				t.Errorf("%s:%d: inline comment (systemd takes it as part of the value): %s", u, i+1, line)
			}
		}
		local := filepath.Join(dir, filepath.Base(u))
		if err := os.WriteFile(local, []byte(strings.NewReplacer(
			"/usr/local/bin/", binDir+"/", "ExecStart=tether-edge ", "ExecStart="+binDir+"/tether-edge ",
		).Replace(string(b))), 0o644); err != nil {
			t.Fatal(err)
		}
		out, err := exec.Command(analyze, "verify", local).CombinedOutput()
		if err != nil || len(strings.TrimSpace(string(out))) > 0 {
			t.Errorf("systemd-analyze verify %s: %v\n%s", filepath.Base(u), err, out)
		}
	}
	out, err := exec.Command(analyze, "security", "--offline=true", "--threshold=20",
		filepath.Join(dir, "tether.service")).CombinedOutput()
	if err != nil {
		t.Fatalf("systemd-analyze security tether.service: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`Overall exposure level for tether.service: ([0-9.]+)`).FindSubmatch(out)
	if m == nil {
		t.Fatalf("no exposure level in:\n%s", out)
	}
	if level, _ := strconv.ParseFloat(string(m[1]), 64); level > 2.0 {
		t.Errorf("tether.service exposure %.1f, want at most 2.0 (systemd-analyze security):\n%s", level, out)
	}
}

func baseNames(paths []string) []string {
	var names []string
	for _, p := range paths {
		names = append(names, filepath.Base(p))
	}
	return names
}

// TestShellCompletion: both binaries print completion scripts for bash, zsh
// and fish (docs/install.md, "Shell completion"), the bash one parses, and the
// completion requests the scripts make are answered.
func TestShellCompletion(t *testing.T) {
	for _, tc := range []struct {
		bin      string
		words    []string
		complete []string // subcommands completed for `BIN WORDS ""`
	}{
		{"tether", nil, []string{"nodes", "token", "operator", "login", "run"}},
		{"tether", []string{"nodes"}, []string{"rm", "revoke"}},
		{"tether-edge", nil, []string{"join", "run", "status"}},
	} {
		bin := filepath.Join(binDir, tc.bin)
		out, errOut, code := runCmd(t, 10*time.Second, bin, append(append([]string{"__complete"}, tc.words...), "")...)
		if code != 0 {
			t.Fatalf("%s __complete %v: exit %d: %s", tc.bin, tc.words, code, errOut)
		}
		var got []string
		for _, line := range strings.Split(out, "\n") {
			got = append(got, strings.SplitN(line, "\t", 2)[0])
		}
		for _, want := range tc.complete {
			if !slices.Contains(got, want) {
				t.Errorf("%s %v <TAB>: %q missing from %q", tc.bin, tc.words, want, got)
			}
		}
	}
	for _, bin := range []string{"tether", "tether-edge"} {
		for _, shell := range []string{"bash", "zsh", "fish"} {
			script, errOut, code := runCmd(t, 10*time.Second, filepath.Join(binDir, bin), "completion", shell)
			if code != 0 || !strings.Contains(script, "__complete") {
				t.Fatalf("%s completion %s: exit %d: %s", bin, shell, code, errOut)
			}
			if shell != "bash" {
				continue
			}
			f := filepath.Join(t.TempDir(), bin+".bash")
			if err := os.WriteFile(f, []byte(script), 0o644); err != nil {
				t.Fatal(err)
			}
			if out, err := exec.Command("bash", "-n", f).CombinedOutput(); err != nil {
				t.Errorf("%s completion bash does not parse: %v\n%s", bin, err, out)
			}
		}
	}
}
