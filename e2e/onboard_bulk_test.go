package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/creack/pty"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/knownhosts"

	"github.com/tether-dev/tether/internal/testenv"
)

// bulkHost is one machine of a bulk test: a fake machine (its own root
// with a DMI UUID and Debian's os-release, its own agent state dir) behind
// its own Debian sshd, which runs in its own UTS namespace so that the
// machine has its own host name (the hub names the node after it).
type bulkHost struct {
	machine
	hostname string
	cfg      testenv.SSHDConfig
	port     int
	sshd     *testenv.Proc
}

// bulkSSHDStarter starts sshd in a new UTS namespace named hostname.
func bulkSSHDStarter(t *testing.T, hostname string) testenv.Starter {
	unshare, err := exec.LookPath("unshare")
	if err != nil {
		t.Skip("unshare (util-linux) not installed: each fake machine needs its own host name")
	}
	logs := t.TempDir()
	return func(name string, cmd *exec.Cmd) (*testenv.Proc, error) {
		c := exec.Command(unshare, append([]string{"--uts", "/bin/sh", "-c", `hostname "$0" && exec "$@"`, hostname},
			cmd.Args...)...)
		p, err := testenv.StartProc(name, filepath.Join(logs, name+".log"), c)
		if err == nil {
			t.Cleanup(func() {
				p.Stop(syscall.SIGTERM, 5*time.Second)
				if t.Failed() {
					t.Logf("---- %s log ----\n%s", name, p.Tail(3000))
				}
			})
		}
		return p, err
	}
}

func newBulkHost(t *testing.T, i int, cred string) *bulkHost {
	t.Helper()
	uuid := fmt.Sprintf("b0b0%04x-0000-4000-8000-%012x", i, i)
	h := &bulkHost{machine: newMachine(t, uuid, cred), hostname: fmt.Sprintf("bulk-%03d", i)}
	pub, err := os.ReadFile(opPub)
	if err != nil {
		t.Fatal(err)
	}
	// sshd keeps the first SetEnv it reads: this one, not the harness's.
	// PATH has no tether-edge, so bulk copies it.
	h.cfg = testenv.SSHDConfig{Dir: t.TempDir(), AuthorizedKeys: pub, Lines: []string{
		fmt.Sprintf("SetEnv HOME=%s TETHER_ONBOARD_ROOT=%s TETHER_STATE_DIR=%s PATH=/usr/sbin:/usr/bin:/sbin:/bin",
			filepath.Dir(h.root), h.root, h.state)}}
	return h
}

// start runs the host's sshd on any free port.
func (h *bulkHost) start(t *testing.T) {
	t.Helper()
	s, err := testenv.LaunchSSHD(h.cfg, "sshd-"+h.hostname, bulkSSHDStarter(t, h.hostname))
	if err != nil {
		t.Fatal(err)
	}
	h.port, h.sshd, h.cfg.HostKey = s.Port, s.Proc, s.HostKey
}

// startOn runs the host's sshd on h.port (a port the inventory already
// names).
func (h *bulkHost) startOn(t *testing.T) {
	t.Helper()
	path, err := testenv.WriteSSHDConfig(&h.cfg, h.port)
	if err != nil {
		t.Fatal(err)
	}
	p, err := bulkSSHDStarter(t, h.hostname)("sshd-"+h.hostname, exec.Command(testenv.SSHDPath, "-D", "-e", "-f", path))
	if err != nil {
		t.Fatal(err)
	}
	if err := p.WaitLog("Server listening on", 1, 10*time.Second); err != nil {
		t.Fatalf("sshd on port %d: %v\n%s", h.port, err, p.Tail(2000))
	}
	h.sshd = p
}

func (h *bulkHost) addr() string { return fmt.Sprintf("127.0.0.1:%d", h.port) }

func (h *bulkHost) knownHostsLine() string {
	return knownhosts.Line([]string{knownhosts.Normalize(h.addr())}, h.cfg.HostKey.Pub()) + "\n"
}

// bulkResult is a row of `tether onboard bulk -o json`.
type bulkResult struct {
	Host        string  `json:"host"`
	Line        int     `json:"line"`
	Status      string  `json:"status"`
	Step        string  `json:"step"`
	Node        string  `json:"node"`
	CopiedAgent bool    `json:"copied_agent"`
	Error       string  `json:"error"`
	Seconds     float64 `json:"seconds"`
}

// envWithoutAgent is this environment without the developer's ssh-agent.
func envWithoutAgent() []string {
	var env []string
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "SSH_AUTH_SOCK=") {
			env = append(env, e)
		}
	}
	return env
}

// runBulk runs `tether onboard bulk ARGS -o json` without the developer's
// ssh-agent, and returns its rows by inventory line, exit status and time.
func runBulk(t *testing.T, args ...string) (map[int]bulkResult, string, int, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(binDir, "tether"),
		append([]string{"onboard", "bulk", "-o", "json"}, args...)...)
	cmd.Env = envWithoutAgent()
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatalf("tether onboard bulk: %v", err)
	}
	var rows []bulkResult
	if err := json.Unmarshal(o.Bytes(), &rows); err != nil {
		t.Fatalf("tether onboard bulk -o json: exit %d: %v\nstdout: %s\nstderr: %s", code, err, o.String(), e.String())
	}
	byLine := map[int]bulkResult{}
	for _, r := range rows {
		byLine[r.Line] = r
	}
	return byLine, e.String(), code, took
}

// failedRows are the rows that did not end onboarded, for messages.
func failedRows(rows map[int]bulkResult) []bulkResult {
	var out []bulkResult
	for _, r := range rows {
		if r.Status == "failed" {
			// A supervised agent that died: its log says why.
			if m := regexp.MustCompile(`see (\S+agent\.log)`).FindStringSubmatch(r.Error); m != nil {
				b, _ := os.ReadFile(m[1])
				r.Error += "\n---- agent.log ----\n" + string(b)
			}
			out = append(out, r)
		}
	}
	return out
}

// bulkFleet is a hub, an onboarding credential, n fake machines behind
// their sshd, and the admin's files (known_hosts, inventory, credential).
type bulkFleet struct {
	h                          onboardHub
	pin                        string
	hosts                      []*bulkHost
	known, inventory, credFile string
	agentPath                  string
	lineOf                     map[*bulkHost]int
}

// newBulkFleet starts n machines; skip names machines whose sshd is not
// started (their port is reserved) and unknown those left out of
// known_hosts.
func newBulkFleet(t *testing.T, n int, notStarted, unknown map[int]bool) *bulkFleet {
	t.Helper()
	return newBulkFleetNamed(t, n, notStarted, unknown, nil)
}

// newBulkFleetNamed is newBulkFleet whose machine i has the host name
// hostname(i) (nil: bulk-00i).
func newBulkFleetNamed(t *testing.T, n int, notStarted, unknown map[int]bool, hostname func(int) string) *bulkFleet {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("bulk onboarding logs in as root to sshd instances in their own UTS namespaces: needs root (CI runs " +
			"`make test` as root)")
	}
	f := &bulkFleet{h: startOnboardHub(t), lineOf: map[*bulkHost]int{}}
	cred, pin := f.h.credential("--uses", fmt.Sprint(n+10), "--label", "fleet=bulk")
	f.pin = pin
	dir := t.TempDir()
	f.known, f.inventory, f.credFile = filepath.Join(dir, "known_hosts"), filepath.Join(dir, "hosts.txt"),
		filepath.Join(dir, "cred")
	f.agentPath = filepath.Join(dir, "opt", "tether-edge")
	testenv.WriteFile(t, f.credFile, []byte(cred+"\n"), 0o600)
	var known, inv strings.Builder
	inv.WriteString("# machines in the field, not managed yet\n\n")
	line := 2
	for i := range n {
		h := newBulkHost(t, i, cred)
		if hostname != nil {
			h.hostname = hostname(i)
		}
		if notStarted[i] {
			h.port = freePort(t)
			h.cfg.HostKey = testenv.NewKeyFile(t, filepath.Join(h.cfg.Dir, "ssh_host_ed25519_key"))
		} else {
			h.start(t)
		}
		if !unknown[i] {
			known.WriteString(h.knownHostsLine())
		}
		line++
		fmt.Fprintf(&inv, "root@%s rack=r%d   # %s\n", h.addr(), i%4, h.hostname)
		f.lineOf[h] = line
		f.hosts = append(f.hosts, h)
	}
	testenv.WriteFile(t, f.known, []byte(known.String()), 0o644)
	testenv.WriteFile(t, f.inventory, []byte(inv.String()), 0o644)
	return f
}

func (f *bulkFleet) run(t *testing.T, parallel int) (map[int]bulkResult, string, int, time.Duration) {
	t.Helper()
	// --agent-binary is left to its default: the tether-edge next to
	// the tether binary.
	return runBulk(t, "--inventory", f.inventory, "--credential", "@"+f.credFile, "--parallel", fmt.Sprint(parallel),
		"--hub", f.h.apiAddr(), "--ca-pin", "sha256:"+f.pin, "-i", opKey, "--known-hosts", f.known,
		"--remote-path", f.agentPath, "--timeout", "3m")
}

// checkOnline: every host in want is a node online on the hub, named
// after the machine, with the credential's label (the hub's) and the
// inventory's rack label as a reported label (the machine's word, from the
// labels file onboarding wrote).
func (f *bulkFleet) checkOnline(t *testing.T, want []*bulkHost) {
	t.Helper()
	type listed struct {
		Name     string            `json:"name"`
		Online   bool              `json:"online"`
		Labels   map[string]string `json:"labels"`
		Reported map[string]string `json:"reported_labels"`
	}
	waitForState(t, "the onboarded nodes online with their labels", 30*time.Second, func() []string {
		var list []listed
		if err := json.Unmarshal([]byte(f.h.cli("nodes", "-o", "json")), &list); err != nil {
			t.Fatal(err)
		}
		nodes := map[string]listed{}
		for _, n := range list {
			nodes[n.Name] = n
		}
		var missing []string
		for _, h := range want {
			n := nodes[h.hostname]
			if !n.Online || n.Labels["fleet"] != "bulk" || n.Reported["rack"] != fmt.Sprintf("r%d", f.index(h)%4) {
				missing = append(missing, fmt.Sprintf("%s: %+v", h.hostname, n))
			}
		}
		return missing
	}, func(missing []string) bool { return len(missing) == 0 })
}

// index is h's position in the fleet.
func (f *bulkFleet) index(h *bulkHost) int { return f.lineOf[h] - 3 }

// TestOnboardBulk: `tether onboard bulk` over ten machines in parallel,
// two of which fail: one whose host key is not in known_hosts (no trust on
// first use: it fails, naming the key's fingerprint) and one whose sshd is
// down. The eight others are onboarded with tether-edge copied to them.
// Once the key is added and the sshd started, the same command finishes
// the two and leaves the eight as they are: ten nodes, none twice.
func TestOnboardBulk(t *testing.T) {
	const n = 10
	const unknownHost, downHost = 3, 7
	f := newBulkFleet(t, n, map[int]bool{downHost: true}, map[int]bool{unknownHost: true})

	// Without the hub's pin nothing is tried: a host never guesses its hub.
	noPin := exec.Command(filepath.Join(binDir, "tether"), "onboard", "bulk", "--inventory", f.inventory,
		"--credential", "@"+f.credFile, "--hub", f.h.apiAddr(), "-i", opKey, "--known-hosts", f.known)
	noPin.Env = envWithoutAgent()
	if out, err := noPin.CombinedOutput(); noPin.ProcessState.ExitCode() != 1 ||
		!strings.Contains(string(out), "pin are both required") {
		t.Fatalf("bulk without --ca-pin: %v: %s", err, out)
	}

	rows, errOut, code, took := f.run(t, 20)
	t.Logf("bulk onboarding of %d hosts (2 failing): %v", n, took.Round(10*time.Millisecond))
	if code != 1 || len(rows) != n {
		t.Fatalf("first run: exit %d, %d rows, want exit 1 and %d rows\n%s", code, len(rows), n, errOut)
	}
	var ok []*bulkHost
	copied := 0
	for i, h := range f.hosts {
		r := rows[f.lineOf[h]]
		switch i {
		case unknownHost:
			if r.Status != "failed" || r.Step != "connect" || !strings.Contains(r.Error, "not in known_hosts") ||
				!strings.Contains(r.Error, ssh.FingerprintSHA256(h.cfg.HostKey.Pub())) {
				t.Errorf("host with an unknown key: %+v", r)
			}
		case downHost:
			if r.Status != "failed" || r.Step != "connect" || !strings.Contains(r.Error, "unreachable") ||
				!strings.Contains(r.Error, "connection refused") {
				t.Errorf("host whose sshd is down: %+v", r)
			}
		default:
			if r.Status != "onboarded" || r.Node != h.hostname {
				t.Errorf("host %s: %+v, want onboarded as %s", h.addr(), r, h.hostname)
			}
			if r.CopiedAgent {
				copied++
			}
			ok = append(ok, h)
		}
	}
	// The hosts share this machine's file system, so the first copies
	// land at the same path; every host found it missing or copied.
	if copied == 0 {
		t.Errorf("no host had tether-edge copied")
	}
	want, _ := os.ReadFile(filepath.Join(binDir, "tether-edge"))
	if got, err := os.ReadFile(f.agentPath); err != nil || sha256.Sum256(got) != sha256.Sum256(want) {
		t.Errorf("copied agent at %s differs from the local one: %v", f.agentPath, err)
	}
	f.checkOnline(t, ok)
	if t.Failed() {
		t.FailNow()
	}

	// Fix both: trust the key (as the admin would, after checking its
	// fingerprint) and start the sshd that was down.
	kf, err := os.OpenFile(f.known, os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	kf.WriteString(f.hosts[unknownHost].knownHostsLine())
	kf.Close()
	f.hosts[downHost].startOn(t)

	rows, errOut, code, took = f.run(t, 20)
	t.Logf("re-run over %d hosts (8 done, 2 to finish): %v", n, took.Round(10*time.Millisecond))
	if code != 0 {
		t.Fatalf("re-run: exit %d\n%v\n%s", code, rows, errOut)
	}
	for i, h := range f.hosts {
		r := rows[f.lineOf[h]]
		wantStatus := "already-onboarded"
		if i == unknownHost || i == downHost {
			wantStatus = "onboarded"
		}
		if r.Status != wantStatus || r.Node != h.hostname || r.CopiedAgent {
			t.Errorf("re-run, host %d: %+v, want %s as %s, agent present", i, r, wantStatus, h.hostname)
		}
	}
	f.checkOnline(t, f.hosts)
	count := 0
	for name := range f.h.nodes() {
		if strings.HasPrefix(name, "bulk-") {
			count++
		}
	}
	if count != n {
		t.Errorf("%d nodes on the hub, want %d (one per machine)", count, n)
	}

	// A third run as a person would type it: on a terminal, with the key
	// in ssh-agent instead of -i, and the table: a progress bar, then
	// nothing left to do.
	sock := filepath.Join(t.TempDir(), "agent.sock")
	start(t, "ssh-agent", "ssh-agent", "-D", "-a", sock)
	waitFor(t, "ssh-agent socket", 10*time.Second, func() bool { _, err := os.Stat(sock); return err == nil })
	add := exec.Command("ssh-add", opKey)
	add.Env = append(envWithoutAgent(), "SSH_AUTH_SOCK="+sock)
	if out, err := add.CombinedOutput(); err != nil {
		t.Fatalf("ssh-add: %v\n%s", err, out)
	}
	cmd := exec.Command(filepath.Join(binDir, "tether"), "onboard", "bulk", "--inventory", f.inventory,
		"--credential", "@"+f.credFile,
		"--hub", f.h.apiAddr(), "--ca-pin", "sha256:"+f.pin, "--known-hosts", f.known, "--remote-path", f.agentPath)
	cmd.Env = append(envWithoutAgent(), "SSH_AUTH_SOCK="+sock)
	ptmx, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 40, Cols: 160})
	if err != nil {
		t.Fatal(err)
	}
	defer ptmx.Close()
	var screen bytes.Buffer
	drained := make(chan struct{})
	go func() { io.Copy(&screen, ptmx); close(drained) }()
	if err := cmd.Wait(); err != nil {
		t.Errorf("third run on a terminal: %v", err)
	}
	<-drained // the pty reports EOF (EIO) once the command and its output are gone
	out := screen.String()
	for _, want := range []string{
		"\r[" + strings.Repeat("#", 30) + "] 10/10  10 ok  0 failed", "LINE", "already-onboarded",
		"0 onboarded, 10 already onboarded, 0 failed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("third run's terminal lacks %q:\n%s", want, out)
		}
	}
}

// TestOnboardBulkNames: machines of one image share a host name (every
// Raspberry Pi is "raspberrypi"), which the hub names nodes after. The
// first such machine takes the name; the others are refused as "name
// taken", saying what works with bulk: name=NODE on the host's line or
// --name-pattern. With both, the same command finishes them under their
// own names, and leaves the first as it is.
func TestOnboardBulkNames(t *testing.T) {
	f := newBulkFleetNamed(t, 3, nil, nil, func(int) string { return "raspberrypi" })
	// One at a time: the first line takes the name, the others clash.
	rows, errOut, code, _ := f.run(t, 1)
	if code != 1 || len(rows) != 3 {
		t.Fatalf("first run: exit %d, %d rows, want exit 1 and 3 rows\n%s", code, len(rows), errOut)
	}
	for i, h := range f.hosts {
		r := rows[f.lineOf[h]]
		if i == 0 {
			if r.Status != "onboarded" || r.Node != "raspberrypi" {
				t.Errorf("first Pi: %+v, want onboarded as raspberrypi", r)
			}
			continue
		}
		if r.Status != "failed" || r.Step != "onboard" || !strings.Contains(r.Error, `node name "raspberrypi" is taken`) ||
			!strings.Contains(r.Error, "name=NODE on its inventory line or --name-pattern") {
			t.Errorf("Pi %d: %+v, want refused as name taken, saying name= or --name-pattern", i, r)
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The second Pi named on its line, the third by the pattern.
	inv, err := os.ReadFile(f.inventory)
	if err != nil {
		t.Fatal(err)
	}
	second := "root@" + f.hosts[1].addr() + " "
	fixed := strings.Replace(string(inv), second, second+"name=pi-kitchen ", 1)
	testenv.WriteFile(t, f.inventory, []byte(fixed), 0o644)
	rows, errOut, code, _ = runBulk(t, "--inventory", f.inventory, "--credential", "@"+f.credFile,
		"--name-pattern", "pi-{n}", "--hub", f.h.apiAddr(), "--ca-pin", "sha256:"+f.pin, "-i", opKey,
		"--known-hosts", f.known,
		"--remote-path", f.agentPath, "--timeout", "3m")
	if code != 0 {
		t.Fatalf("second run: exit %d\n%v\n%s", code, failedRows(rows), errOut)
	}
	for i, want := range []struct{ status, node string }{
		{"already-onboarded", "raspberrypi"}, {"onboarded", "pi-kitchen"}, {"onboarded", "pi-3"},
	} {
		if r := rows[f.lineOf[f.hosts[i]]]; r.Status != want.status || r.Node != want.node {
			t.Errorf("second run, Pi %d: %+v, want %s as %s", i, r, want.status, want.node)
		}
	}
	waitForState(t, "the three Pis online under their names", 30*time.Second, func() []string {
		nodes := f.h.nodes()
		var missing []string
		for _, name := range []string{"raspberrypi", "pi-kitchen", "pi-3"} {
			if n, ok := nodes[name]; !ok || !n.Online || n.Labels["fleet"] != "bulk" {
				missing = append(missing, name)
			}
		}
		return missing
	}, func(missing []string) bool { return len(missing) == 0 })
}

// TestOnboardBulkScale measures bulk onboarding of 100 machines (100
// sshd instances and 100 agents on this machine: about 15 seconds), and a
// re-run over them; -short skips it.
func TestOnboardBulkScale(t *testing.T) {
	if testing.Short() {
		t.Skip("-short: 100 sshd instances and agents")
	}
	const n = 100
	f := newBulkFleet(t, n, nil, nil)
	rows, errOut, code, took := f.run(t, 20)
	t.Logf("bulk onboarding of %d hosts, --parallel 20: %v", n, took.Round(10*time.Millisecond))
	if code != 0 || len(rows) != n {
		t.Fatalf("exit %d, %d rows\n%s\nfailed: %v", code, len(rows), errOut, failedRows(rows))
	}
	f.checkOnline(t, f.hosts)
	_, _, code, took = f.run(t, 20)
	t.Logf("re-run over %d onboarded hosts: %v", n, took.Round(10*time.Millisecond))
	if code != 0 {
		t.Fatalf("re-run: exit %d", code)
	}
}
