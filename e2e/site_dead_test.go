package e2e

import (
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/faultproxy"
)

// siteDeadWithin is how soon after a site hub dies its parent fails the
// commands for the nodes below it, saying so; siteDeadPeer is the silence
// after which the parent takes it for dead (site.DefaultSiteDeadPeer).
const (
	siteDeadWithin = 5 * time.Second
	siteDeadPeer   = 3 * time.Second
)

// unreachableSince finds the time in a "site NAME unreachable since TIME"
// reason.
var unreachableSince = regexp.MustCompile(`site (\S+) unreachable since (\S+) \(`)

// TestSiteKilled: a site hub killed -9 (no goodbye: on QUIC its parent
// hears nothing more), with the hubs' default liveness settings. A jump
// from the root to a node below it, started right after the kill, fails
// within siteDeadWithin of it with "site berlin unreachable since TIME",
// TIME being when the root lost the site's session (not before the kill);
// the next jump and a job fail at once with the same time. Restarted, the
// site is reached again; with the node below it stopped, the jump fails
// with the site's word for it before a ConnectTimeout of 10 s runs out.
// Over QUIC and over TCP.
func TestSiteKilled(t *testing.T) {
	for _, transport := range []string{"quic", "tcp"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel() // trees of their own, mostly waiting on timeouts
			testSiteKilled(t, transport)
		})
	}
}

func testSiteKilled(t *testing.T, transport string) {
	root := startHubIn(t, "", 0)
	join := strings.TrimSpace(root.cli("site", "token", "create", "--ttl", "10m"))
	site := startHubIn(t, "", 0, "--parent", join, "--site", "berlin", "--parent-transport", transport)
	agent, _ := startAgent(t, site.token(), "n1", "--ssh", "embedded")
	root.cli("role", "create", "berlin", "--nodes", "site=berlin", "--logins", loginUser)
	root.cli("operator", "add", "alice", "--key", opPub, "--role", "berlin")
	waitForState(t, "n1.berlin online at the root", 60*time.Second, root.nodes, func(ns map[string]nodeJSON) bool {
		return ns["n1.berlin"].Online
	})
	dir := t.TempDir()
	if _, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "login", "--data-dir",
		root.dataDir, "--user", "alice", "--key", opKey, "--out-dir", dir); code != 0 {
		t.Fatalf("tether login: exit %d: %s", code, errOut)
	}
	alice := newSSHClient(t, root) // ConnectTimeout 10, as many ssh configurations
	jump := func() (errOut string, took time.Duration, code int) {
		t.Helper()
		start := time.Now()
		_, errOut, code = runCmd(t, 45*time.Second, "ssh", "-F", alice.cfg,
			"-o", "CertificateFile="+filepath.Join(dir, "alice-cert.pub"),
			"-J", "alice@"+root.sshAddr(), loginUser+"@n1.berlin", "true")
		return errOut, time.Since(start), code
	}
	waitFor(t, "alice reaches n1.berlin (the root's trust reached n1)", 60*time.Second, func() bool {
		_, _, code := jump()
		return code == 0
	})

	killed := time.Now()
	site.p.Kill()
	errOut, took, code := jump()
	failed := time.Since(killed)
	t.Logf("%s: the jump started at the kill failed after %s (%s after the kill): %s", transport,
		took.Round(time.Millisecond), failed.Round(time.Millisecond), strings.TrimSpace(errOut))
	m := unreachableSince.FindStringSubmatch(errOut)
	if code == 0 || m == nil || m[1] != "berlin" {
		t.Fatalf("the jump after the kill: exit %d, want \"site berlin unreachable since\": %s", code, errOut)
	}
	if failed > siteDeadWithin {
		t.Errorf("the jump failed %s after the kill, want at most %s", failed.Round(time.Millisecond), siteDeadWithin)
	}
	since, err := time.Parse(time.RFC3339, m[2])
	if err != nil {
		t.Fatalf("the since time %q: %v", m[2], err)
	}
	// The reason names whole seconds.
	if since.Before(killed.Truncate(time.Second)) || since.After(killed.Add(failed)) {
		t.Errorf("unreachable since %s, want between the kill (%s) and the failure (%s)", m[2],
			killed.UTC().Format(time.RFC3339Nano), killed.Add(failed).UTC().Format(time.RFC3339Nano))
	}

	// Known dead: the next jump and a job fail at once, with the same time.
	errOut, took, code = jump()
	t.Logf("%s: the next jump failed after %s: %s", transport, took.Round(time.Millisecond), strings.TrimSpace(errOut))
	if code == 0 || !strings.Contains(errOut, "site berlin unreachable since "+m[2]) {
		t.Errorf("the next jump: exit %d, want \"site berlin unreachable since %s\": %s", code, m[2], errOut)
	}
	if took > 3*time.Second {
		t.Errorf("the next jump took %s to fail", took.Round(time.Millisecond))
	}
	start := time.Now()
	j, code := root.runJSON(60*time.Second, "--nodes", "n1.berlin", "--", "true")
	took = time.Since(start)
	if code == 0 || !strings.Contains(j.node("n1.berlin").Error, "site berlin unreachable since "+m[2]) {
		t.Errorf("a job while the site is down: exit %d, %+v", code, j)
	}
	if took > 5*time.Second {
		t.Errorf("a job for a dead site's node took %s to fail", took.Round(time.Millisecond))
	}

	site.start()
	waitFor(t, "alice reaches n1.berlin again after the site's restart", 60*time.Second, func() bool {
		_, _, code := jump()
		return code == 0
	})

	// The site is up but the node below it does not answer (its agent
	// stopped, once its session with the restarted site is settled and
	// the root has the site's word that it is online): the site says so
	// before ssh's ConnectTimeout of 10 s gives up.
	waitSteady(t, site, "n1")
	waitForState(t, "n1.berlin online at the root", 30*time.Second, root.nodes, func(ns map[string]nodeJSON) bool {
		return ns["n1.berlin"].Online
	})
	if err := agent.Cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	defer agent.Cmd.Process.Signal(syscall.SIGCONT)
	errOut, took, code = jump()
	t.Logf("%s: a jump to a stopped node below the live site failed after %s: %s", transport,
		took.Round(time.Millisecond), strings.TrimSpace(errOut))
	if code == 0 || !strings.Contains(errOut, "site berlin refused: node n1 did not answer within") {
		t.Errorf("a jump to a node that does not answer: exit %d, want \"node n1 did not answer\": %s", code, errOut)
	}
}

// waitSteady waits until node's session with hub h has stayed up, the
// same one, for two seconds.
func waitSteady(t *testing.T, h *hub, node string) {
	t.Helper()
	state := func() [2]int {
		log := h.p.Log()
		return [2]int{logCount(log, "node connected", node), logCount(log, "node disconnected", node)}
	}
	last, since := state(), time.Now()
	waitFor(t, node+"'s session with the hub to settle", 60*time.Second, func() bool {
		if now := state(); now != last {
			last, since = now, time.Now()
		}
		return last[0] == last[1]+1 && time.Since(since) >= 2*time.Second
	})
}

// TestSiteLossyLink: a site whose uplink is lossy and slow (5 % loss and
// 150 ms each way, through the fault proxy) is not taken for dead: its
// parent's watchdog never closes its session, and a jump through it works.
// The longest silence the watchdog saw is logged (TETHER_SOAK runs it ten
// minutes per transport). Over QUIC and over TCP.
func TestSiteLossyLink(t *testing.T) {
	for _, transport := range []string{"quic", "tcp"} {
		t.Run(transport, func(t *testing.T) {
			t.Parallel() // a minute of waiting each, on links of their own
			testSiteLossyLink(t, transport)
		})
	}
}

func testSiteLossyLink(t *testing.T, transport string) {
	link, port := newLink(t)
	root := startHubIn(t, "", port, "--advertise", link.Addr())
	join := strings.TrimSpace(root.cli("site", "token", "create", "--ttl", "10m"))
	site := startHubIn(t, "", 0, "--parent", join, "--site", "berlin", "--parent-transport", transport)
	startAgent(t, site.token(), "n1", "--ssh", "embedded")
	root.cli("role", "create", "berlin", "--nodes", "site=berlin", "--logins", loginUser)
	root.cli("operator", "add", "alice", "--key", opPub, "--role", "berlin")
	waitForState(t, "n1.berlin online at the root", 60*time.Second, root.nodes, func(ns map[string]nodeJSON) bool {
		return ns["n1.berlin"].Online
	})
	if err := link.SetFaults(faultproxy.Both, faultproxy.Faults{Latency: 150 * time.Millisecond, Loss: 0.05}); err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	if _, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "login", "--data-dir",
		root.dataDir, "--user", "alice", "--key", opKey, "--out-dir", dir); code != 0 {
		t.Fatalf("tether login: exit %d: %s", code, errOut)
	}
	alice := newSSHClient(t, root)
	jump := func() (string, string, int) {
		return runCmd(t, 60*time.Second, "ssh", "-F", alice.cfg, "-o", "ConnectTimeout=30",
			"-o", "CertificateFile="+filepath.Join(dir, "alice-cert.pub"),
			"-J", "alice@"+root.sshAddr(), loginUser+"@n1.berlin", "echo reached")
	}
	var out, errOut string
	waitFor(t, "alice reaches n1.berlin over the lossy link", 90*time.Second, func() bool {
		var code int
		out, errOut, code = jump()
		return code == 0
	})
	if strings.TrimSpace(out) != "reached" {
		t.Fatalf("jump over the lossy link: %q, %s", out, errOut)
	}
	hold := soakOr(60*time.Second, 10*time.Minute)
	deadline := time.Now().Add(hold)
	for time.Now().Before(deadline) {
		if n := strings.Count(root.p.Log(), `msg="site disconnected"`); n > 0 {
			break
		}
		time.Sleep(time.Second)
	}
	closed := strings.Count(root.p.Log(), `msg="nothing heard from the site; closing its session"`)
	gone := strings.Count(root.p.Log(), `msg="site disconnected"`)
	if out, errOut, code := jump(); code != 0 || strings.TrimSpace(out) != "reached" {
		t.Errorf("jump after %s on the lossy link: exit %d, %q, %s", hold, code, out, errOut)
	}
	// The longest silence, from the watchdog's last word as the site stops.
	site.p.Stop(syscall.SIGTERM, stopWait)
	var longest string
	waitFor(t, "the root's watchdog of berlin to end", 30*time.Second, func() bool {
		m := regexp.MustCompile(`msg="site session's watchdog ended" .*longest_silence=(\S+)`).
			FindStringSubmatch(root.p.Log())
		if m != nil {
			longest = m[1]
		}
		return m != nil
	})
	t.Logf("%s, 5%% loss and 150 ms each way for %s: %d sessions closed by the watchdog, %d ended; "+
		"longest silence %s (dead after %s)", transport, hold, closed, gone, longest, siteDeadPeer)
	if closed > 0 || gone > 0 {
		t.Errorf("the site's session flapped on a lossy link: %d closed by the watchdog, %d ended", closed, gone)
	}
}
