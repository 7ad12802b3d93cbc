package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"

	"github.com/tether-dev/tether/edge/onboard"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// onboardHub is a hub with an OS profile for the fake machines' Debian 12.
type onboardHub struct {
	*hub
}

func startOnboardHub(t *testing.T) onboardHub {
	t.Helper()
	h := onboardHub{startHub(t)}
	h.cli("osprofile", "add", "debian-12", "--distro", "debian", "--version", "12")
	return h
}

// credential creates an onboarding credential and returns it with the CA pin.
func (h onboardHub) credential(args ...string) (cred, pin string) {
	h.t.Helper()
	c := h.credentialJSON(args...)
	return c.Credential, c.CAPin
}

type credentialJSON struct {
	Credential string    `json:"credential"`
	CAPin      string    `json:"ca_pin"`
	ExpiresAt  time.Time `json:"expires_at"`
}

func (h onboardHub) credentialJSON(args ...string) credentialJSON {
	h.t.Helper()
	var out credentialJSON
	name := fmt.Sprintf("site-%d", time.Now().UnixNano())
	if err := json.Unmarshal(
		[]byte(h.cli(append([]string{"onboarding", "create", name, "-o", "json"}, args...)...)), &out,
	); err != nil {
		h.t.Fatal(err)
	}
	if out.Credential == "" || out.CAPin == "" {
		h.t.Fatalf("onboarding create: %+v", out)
	}
	return out
}

// machine is a fake machine: a root tree with a DMI UUID and Debian 12's
// os-release, and no systemd (so --apply supervises the agent itself).
type machine struct {
	root, state, seed, credFile string
	name                        string // the hostname here is the same for all
}

func newMachine(t *testing.T, uuid, cred string) machine {
	t.Helper()
	d := t.TempDir()
	m := machine{root: filepath.Join(d, "root"), state: filepath.Join(d, "state"), seed: filepath.Join(d, "seed"),
		credFile: filepath.Join(d, "cred"), name: "m-" + uuid[:8]}
	for p, c := range map[string]string{
		"sys/class/dmi/id/product_uuid":   uuid + "\n",
		"sys/class/dmi/id/product_serial": "SN-" + uuid[:8] + "\n",
		"etc/os-release":                  "PRETTY_NAME=\"Debian GNU/Linux 12 (bookworm)\"\nID=debian\nVERSION_ID=\"12\"\n",
	} {
		if err := os.MkdirAll(filepath.Dir(filepath.Join(m.root, p)), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(m.root, p), []byte(c), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(m.credFile, []byte(cred+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	// The supervised agent outlives the CLI (its own session): stop it.
	t.Cleanup(func() { m.stopAgent() })
	return m
}

// agentsOn counts the running `tether-edge run --state-dir dir` processes.
func agentsOn(dir string) int {
	n := 0
	entries, _ := os.ReadDir("/proc")
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue
		}
		st, _ := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if _, rest, _ := strings.Cut(string(st), ") "); strings.HasPrefix(rest, "Z") {
			continue
		}
		if argv := strings.Split(string(b), "\x00"); len(argv) > 3 && strings.HasSuffix(argv[0], "tether-edge") &&
			argv[1] == "run" && argv[2] == "--state-dir" && argv[3] == dir {
			n++
		}
	}
	return n
}

// stopAgent kills the agent onboarding started for this machine: the one
// its pid file names, and any other `tether-edge run` on its state dir.
func (m machine) stopAgent() {
	if b, err := os.ReadFile(filepath.Join(m.state, "agent.pid")); err == nil {
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	// Bounded: a killed agent is gone (or a zombie, which AgentFor skips)
	// at once.
	_ = testenv.Poll(context.Background(), 10*time.Second, "the agent to exit", func() bool {
		pid := onboard.AgentFor(m.state)
		if pid != 0 {
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		return pid == 0
	})
}

func (m machine) args(h onboardHub, pin string, extra ...string) []string {
	return append([]string{"onboard", "--hub", h.apiAddr(), "--ca-pin", "sha256:" + pin, "--credential", "@" + m.credFile,
		"--non-interactive", "--name", m.name, "--root", m.root, "--state-dir", m.state, "--cloud-init-dir", m.seed,
		"--attempts", "3", "-o", "json"}, extra...)
}

type onboardResult struct {
	NodeID     string `json:"node_id"`
	Name       string `json:"name"`
	Existing   bool   `json:"existing"`
	KeyReused  bool   `json:"key_reused"`
	Profile    string `json:"profile"`
	MatchedBy  string `json:"matched_by"`
	Supervised bool   `json:"supervised"`
	AgentPID   int    `json:"agent_pid"`
	AgentState string `json:"agent_state"`
	UserData   string `json:"user_data_path"`
	Error      string `json:"error"`
	Checks     []struct {
		Name, Status string
	} `json:"checks"`
	Facts []struct {
		Name, Value, Source string
	} `json:"facts"`
}

func onboardCmd(t *testing.T, args ...string) (onboardResult, string, int) {
	t.Helper()
	out, errOut, code := runCmd(t, 2*time.Minute, filepath.Join(binDir, "tether-edge"), args...)
	var r onboardResult
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("tether-edge onboard -o json: %v\nstdout: %s\nstderr: %s", err, out, errOut)
	}
	return r, errOut, code
}

func (h onboardHub) online(name string) bool {
	n, ok := h.nodes()[name]
	return ok && n.Online
}

// A non-interactive --apply without systemd: the CLI starts the agent,
// waits until it is connected, and the hub shows the node online with the
// facts and profile.
func TestOnboardNonInteractiveApply(t *testing.T) {
	h := startOnboardHub(t)
	cred, pin := h.credential("--uses", "5", "--label", "site=berlin")
	m := newMachine(t, "4c4c4544-0042-3510-8052-b4c04f333231", cred)
	r, errOut, code := onboardCmd(t,
		m.args(h, pin, "--apply", "--timeout", "60s", "--site", "shop-7", "--labels", "rack=r1")...)
	if code != 0 {
		t.Fatalf("onboard: exit %d: %s\n%s", code, r.Error, errOut)
	}
	if r.Existing || r.Profile != "debian-12" || r.MatchedBy != "version" || !r.Supervised ||
		r.AgentState != "connected" || r.AgentPID == 0 {
		t.Fatalf("result %+v", r)
	}
	for _, want := range []string{"CHECK", "machine uuid", "clock skew", "matches --ca-pin"} {
		if !strings.Contains(errOut, want) {
			t.Errorf("stderr lacks %q:\n%s", want, errOut)
		}
	}
	if !h.online(r.Name) {
		t.Fatalf("node %s not online: %v", r.Name, h.nodes())
	}
	// The credential's labels are the hub's; those asked for on site are
	// the machine's word, reported by its agent from its labels file.
	if l := h.nodes()[r.Name].Labels; l["site"] != "berlin" || l["rack"] != "" {
		t.Fatalf("labels %v", l)
	}
	var listed []struct {
		Name     string            `json:"name"`
		Reported map[string]string `json:"reported_labels"`
	}
	if err := json.Unmarshal([]byte(h.cli("nodes", "-o", "json")), &listed); err != nil || len(listed) != 1 {
		t.Fatalf("nodes: %v %v", listed, err)
	}
	if rep := listed[0].Reported; rep["site"] != "shop-7" || rep["rack"] != "r1" {
		t.Fatalf("reported labels %v", rep)
	}
	for _, f := range []string{"node.key", "node.crt", "ca.crt", "node.json"} {
		fi, err := os.Stat(filepath.Join(m.state, f))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s: %v %v", f, fi, err)
		}
	}
	if _, err := os.Stat(filepath.Join(m.root, "etc/systemd/system/tether-edge.service")); err != nil {
		t.Fatalf("unit not written under the root: %v", err)
	}
	// Run again: onboarded already, said so, nothing done.
	r2, errOut, code := onboardCmd(t, m.args(h, pin, "--apply")...)
	if code == 0 || !strings.Contains(errOut, "already holds node") {
		t.Fatalf("second run: exit %d %+v\n%s", code, r2, errOut)
	}
}

// --write-only leaves valid cloud-init in the NoCloud seed dir and starts
// nothing.
func TestOnboardWriteOnly(t *testing.T) {
	h := startOnboardHub(t)
	cred, pin := h.credential()
	m := newMachine(t, "5c4c4544-0042-3510-8052-b4c04f333231", cred)
	r, errOut, code := onboardCmd(t, m.args(h, pin, "--write-only")...)
	if code != 0 {
		t.Fatalf("onboard: exit %d: %s\n%s", code, r.Error, errOut)
	}
	ud, err := os.ReadFile(filepath.Join(m.seed, "user-data"))
	if err != nil {
		t.Fatal(err)
	}
	u, err := onboardproto.ParseUserData(string(ud))
	if err != nil {
		t.Fatalf("user-data: %v\n%s", err, ud)
	}
	if len(u.WriteFiles) == 0 || len(u.RunCmd) == 0 || bytes.Contains(ud, []byte("PRIVATE KEY")) {
		t.Fatalf("user-data %s", ud)
	}
	md, err := os.ReadFile(filepath.Join(m.seed, "meta-data"))
	if err != nil || !strings.Contains(string(md), "instance-id") {
		t.Fatalf("meta-data %q %v", md, err)
	}
	if _, err := os.Stat(filepath.Join(m.state, "agent.pid")); err == nil {
		t.Fatal("--write-only started an agent")
	}
	if ci, err := exec.LookPath("cloud-init"); err == nil {
		out, err := exec.Command(ci, "schema", "--config-file", filepath.Join(m.seed, "user-data")).CombinedOutput()
		if err != nil {
			t.Fatalf("cloud-init schema: %v\n%s", err, out)
		}
		t.Logf("cloud-init schema: %s", bytes.TrimSpace(out))
	} else {
		t.Log("cloud-init is not installed: the user-data is checked by the parser only")
	}
}

// Killing the CLI after the hub created the node, then running it again,
// finishes the same node: the credential has one use only, so a second
// node could not have been made.
func TestOnboardRetryAfterKill(t *testing.T) {
	h := startOnboardHub(t)
	cred, pin := h.credential("--uses", "1")
	m := newMachine(t, "6c4c4544-0042-3510-8052-b4c04f333231", cred)
	args := m.args(h, pin, "--apply", "--timeout", "60s")
	cmd := exec.Command(filepath.Join(binDir, "tether-edge"), args...)
	var stderr testenv.SyncBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	// Killed right after the hub answered (the node exists, nothing is
	// applied or only part of it).
	waitFor(t, "the CLI to report the node created", 60*time.Second, func() bool {
		return strings.Contains(stderr.String(), "created; OS profile")
	})
	_ = cmd.Process.Kill()
	<-done
	m.stopAgent() // if it got as far as starting one: the re-run must cope either way

	r, errOut, code := onboardCmd(t, args...)
	if code != 0 {
		t.Fatalf("re-run: exit %d: %s\n%s\nfirst run:\n%s", code, r.Error, errOut, stderr.String())
	}
	if !r.Existing || !r.KeyReused || r.AgentState != "connected" {
		t.Fatalf("re-run result %+v", r)
	}
	nodes := h.nodes()
	if len(nodes) != 1 || !nodes[r.Name].Online {
		t.Fatalf("nodes after the retry: %v", nodes)
	}
	// One agent: the one a killed run may have started is found, not doubled.
	if n := agentsOn(m.state); n != 1 {
		t.Fatalf("%d agents run on %s, want 1", n, m.state)
	}
}

// Refusals: each stops with the reason and sends or creates nothing more.
func TestOnboardRefused(t *testing.T) {
	h := startOnboardHub(t)
	cred, pin := h.credential("--uses", "1")
	first := newMachine(t, "7c4c4544-0042-3510-8052-b4c04f333231", cred)
	if r, errOut, code := onboardCmd(t, first.args(h, pin, "--write-only")...); code != 0 {
		t.Fatalf("first machine: %d %s\n%s", code, r.Error, errOut)
	}

	t.Run("wrong fingerprint", func(t *testing.T) {
		m := newMachine(t, "8c4c4544-0042-3510-8052-b4c04f333231", cred)
		wrong := strings.Repeat("ab", 32)
		r, _, code := onboardCmd(t, m.args(h, wrong, "--write-only")...)
		if code == 0 || !strings.Contains(r.Error, "sha256:"+pin) || !strings.Contains(r.Error, "sha256:"+wrong) {
			t.Fatalf("exit %d, error %q: want both fingerprints", code, r.Error)
		}
		if _, err := os.Stat(filepath.Join(m.state, "node.key")); err == nil {
			t.Fatal("a key was made for an untrusted hub")
		}
	})
	t.Run("exhausted credential", func(t *testing.T) {
		m := newMachine(t, "9c4c4544-0042-3510-8052-b4c04f333231", cred)
		r, _, code := onboardCmd(t, m.args(h, pin, "--write-only")...)
		if code == 0 || !strings.Contains(r.Error, "refused") || !strings.Contains(r.Error, "used") {
			t.Fatalf("exit %d, error %q", code, r.Error)
		}
	})
	t.Run("expired credential", func(t *testing.T) {
		expiring := h.credentialJSON("--ttl", "1s")
		m := newMachine(t, "ac4c4544-0042-3510-8052-b4c04f333231", expiring.Credential)
		// Bounded poll until the hub's expiry time has passed (same clock).
		waitFor(t, "the credential's expiry", 20*time.Second, func() bool { return time.Now().After(expiring.ExpiresAt) })
		r, _, code := onboardCmd(t, m.args(h, pin, "--write-only")...)
		if code == 0 || !strings.Contains(r.Error, "refused") || !strings.Contains(r.Error, "expired") {
			t.Fatalf("exit %d, error %q", code, r.Error)
		}
	})
	t.Run("duplicate uuid", func(t *testing.T) {
		other, _ := h.credential("--uses", "5")
		// A second machine whose fake root has a copy of the first's product_uuid.
		m := newMachine(t, "7c4c4544-0042-3510-8052-b4c04f333231", other)
		r, _, code := onboardCmd(t, m.args(h, pin, "--write-only")...)
		if code == 0 || !strings.Contains(r.Error, "409") || !strings.Contains(r.Error, "with another key") {
			t.Fatalf("exit %d, error %q", code, r.Error)
		}
		// The key is named where this machine keeps it (its --state-dir),
		// not where the hub's onboarding puts it by default.
		if key := filepath.Join(m.state, "node.key"); !strings.Contains(r.Error, key) ||
			strings.Contains(r.Error, "/var/lib/tether-edge/node.key") {
			t.Fatalf("error %q: want it to name the node key %s, and no other", r.Error, key)
		}
	})
	if n := len(h.nodes()); n != 1 {
		t.Fatalf("%d nodes after the refusals, want 1", n)
	}
}

// The interactive form, driven through a pseudo-terminal: defaults are
// accepted (the proxy, site, labels, the mode: apply now), the hub, the CA
// confirmation, the name and the credential are typed; the agent it starts
// (supervised: no systemd here) connects.
func TestOnboardInteractive(t *testing.T) {
	h := startOnboardHub(t)
	cred, _ := h.credential()
	m := newMachine(t, "bc4c4544-0042-3510-8052-b4c04f333231", cred)
	cmd := exec.Command(filepath.Join(binDir, "tether-edge"), "onboard", "--root", m.root, "--state-dir", m.state,
		"--cloud-init-dir", m.seed, "--timeout", "60s")
	cmd.Env = append(os.Environ(), "TERM=xterm-256color", "HTTPS_PROXY=", "https_proxy=", "TETHER_HUB=",
		"TETHER_CA_PIN=", "TETHER_ONBOARD_CREDENTIAL=")
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	var screen terminal
	go screen.serve(ptmx)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() { _ = cmd.Process.Kill() })

	expect := func(what string) {
		t.Helper()
		if err := testenv.Poll(
			context.Background(), 30*time.Second, fmt.Sprintf("the prompt %q", what),
			func() bool { return screen.CountAfter(what) },
		); err != nil {
			t.Fatalf("%v; the terminal shows:\n%s\nraw tail: %q", err, screen.String(), screen.rawTail(400))
		}
	}
	send := func(s string) {
		t.Helper()
		if _, err := ptmx.Write([]byte(s)); err != nil {
			t.Fatal(err)
		}
	}
	expect("HTTPS proxy")
	send("\r") // accept the (empty) default
	expect("Hub address")
	send(h.apiAddr() + "\r")
	expect("Trust this hub CA?")
	send("y") // accepts and submits: no enter
	expect("Node name")
	send(m.name + "\r")
	expect("Site")
	send("\r")
	expect("Labels")
	send("\r")
	expect("Apply the node")
	send("\r") // the default: apply now
	expect("Onboarding credential")
	send(cred + "\r")
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("interactive onboard: %v\n%s", err, screen.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("interactive onboard did not finish:\n%s", screen.String())
	}
	// The exit can come before the last output is read from the terminal.
	waitFor(t, "the summary", 10*time.Second, func() bool { return strings.Contains(screen.String(), "onboarded as") })
	if !strings.Contains(screen.String(), "the agent is connected") || !h.online(m.name) {
		t.Fatalf("node %s not online: %v\n%s", m.name, h.nodes(), screen.String())
	}
}

// terminal is what a test sees of a pseudo-terminal: its raw output, read
// as text without escape sequences (over the whole output, so a sequence
// split between two reads is still removed). CountAfter finds a string
// after the last one it found, so the same prompt drawn twice by the form
// is not taken for the next one.
type terminal struct {
	mu  sync.Mutex
	raw []byte
	off int
}

func (s *terminal) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return string(ansiRE.ReplaceAll(s.raw, nil))
}

func (s *terminal) rawTail(n int) []byte {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.raw[max(0, len(s.raw)-n):]
}

func (s *terminal) CountAfter(sub string) bool {
	text := s.String()
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.off > len(text) {
		s.off = len(text)
	}
	i := strings.Index(text[s.off:], sub)
	if i < 0 {
		return false
	}
	s.off += i + len(sub)
	return true
}

var ansiRE = regexp.MustCompile(`\x1b(\[[0-9;?]*[ -/]*[@-~]|\][^\x07\x1b]*(\x07|\x1b\\)|[()][0-9A-Za-z]|[=>])`)

// serve reads the terminal's output until it closes, and answers the
// queries a terminal answers (background color, cursor position) as a
// real one does, so the form is driven as on a real terminal; the form
// does not wait for the answers (TestEdgeCLILeavesTerminalAlone).
func (s *terminal) serve(pt *os.File) {
	buf := make([]byte, 32<<10)
	answered := map[string]int{}
	answers := [][2]string{{"\x1b]11;?", "\x1b]11;rgb:0000/0000/0000\x1b\\"}, {"\x1b[6n", "\x1b[1;1R"}}
	for {
		k, err := pt.Read(buf)
		if k > 0 {
			s.mu.Lock()
			s.raw = append(s.raw, buf[:k]...)
			raw := s.raw
			s.mu.Unlock()
			for _, qa := range answers {
				q := qa[0]
				for n := bytes.Count(raw, []byte(q)); answered[q] < n; answered[q]++ {
					_, _ = pt.Write([]byte(qa[1]))
				}
			}
		}
		if err != nil {
			return
		}
	}
}

// The agent binary leaves the terminal alone outside the interactive
// form: started on a terminal that never answers (a serial console, some
// multiplexers), a command writes no terminal query (background color
// OSC 11, cursor position DSR) and does not wait for an answer. The form
// library's package initialisation once asked at every start.
func TestEdgeCLILeavesTerminalAlone(t *testing.T) {
	empty := t.TempDir()
	for _, args := range [][]string{{"--version"}, {"status", "--state-dir", empty}} {
		t.Run(strings.Join(args[:1], " "), func(t *testing.T) {
			cmd := exec.Command(filepath.Join(binDir, "tether-edge"), args...)
			cmd.Env = append(os.Environ(), "TERM=xterm-256color")
			ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 120})
			if err != nil {
				t.Fatal(err)
			}
			defer ptmx.Close()
			t.Cleanup(func() { _ = cmd.Process.Kill() })
			// Read everything and never answer; the read ends when the
			// command has exited and closed its side of the terminal.
			out := make(chan []byte, 1)
			go func() {
				var b bytes.Buffer
				_, _ = b.ReadFrom(ptmx)
				out <- b.Bytes()
			}()
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }()
			var raw []byte
			select {
			case <-done:
				select {
				case raw = <-out:
				case <-time.After(30 * time.Second):
					t.Fatal("the terminal's output did not end after the command exited")
				}
			case <-time.After(60 * time.Second):
				t.Fatal("tether-edge did not finish on a terminal that does not answer")
			}
			for _, q := range []string{"\x1b]", "\x1b[6n", "\x1b[?"} {
				if bytes.Contains(raw, []byte(q)) {
					t.Errorf("tether-edge %s wrote the terminal sequence %q: %q", strings.Join(args, " "), q, raw)
				}
			}
			if !bytes.Contains(raw, []byte("tether-edge")) {
				t.Errorf("tether-edge %s printed nothing recognisable: %q", strings.Join(args, " "), raw)
			}
		})
	}
}
