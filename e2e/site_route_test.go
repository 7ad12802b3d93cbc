package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// TestSiteRoute: operators and jobs at a root hub reach nodes below a site
// hub. Site berlin has n1 (embedded SSH server, role=pos) and n2 (a real
// sshd the agent manages, role=kiosk). At the root, alice's role selects
// site=berlin,role=pos and carol's site=berlin. With stock OpenSSH and a
// certificate from the ROOT's `tether login`, alice reaches n1.berlin and
// carol n2.berlin (both verified by the site's host CA through the root's
// `tether config ssh`), alice is refused n2.berlin at the root, and
// `tether run -l site=berlin` at the root runs on both through the site.
// The site audits every hop. Once the site is killed, a jump and a job for
// its nodes fail fast with "site berlin unreachable since".
func TestSiteRoute(t *testing.T) {
	root := startHubIn(t, "", 0, append([]string{"--site-status-interval", "1s"}, quickDeadPeer...)...)
	join := strings.TrimSpace(root.cli("site", "token", "create", "--ttl", "10m"))
	site := startHubIn(t, "", 0, append([]string{"--parent", join, "--site", "berlin",
		"--site-status-interval", "1s"}, quickDeadPeer...)...)
	startAgent(t, site.token("--label", "role=pos"), "n1", "--ssh", "embedded")
	sd := startSSHD(t)
	startAgent(t, site.token("--label", "role=kiosk"), "n2", sd.managedArgs()...)

	root.cli("role", "create", "berlin-pos", "--nodes", "site=berlin,role=pos", "--logins", loginUser)
	root.cli("role", "create", "berlin-all", "--nodes", "site=berlin", "--logins", loginUser)
	root.cli("operator", "add", "alice", "--key", opPub, "--role", "berlin-pos")
	carol, err := testenv.WriteKey(filepath.Join(t.TempDir(), "carol"))
	if err != nil {
		t.Fatal(err)
	}
	root.cli("operator", "add", "carol", "--key", carol.Path+".pub", "--role", "berlin-all")

	waitForState(t, "n1.berlin and n2.berlin online at the root", 60*time.Second, root.nodes,
		func(ns map[string]nodeJSON) bool {
			return ns["n1.berlin"].Online && ns["n2.berlin"].Online && ns["n1.berlin"].Labels["site"] == "berlin"
		})
	if out := root.cli("nodes"); !strings.Contains(out, "SITE") || !strings.Contains(out, "n2.berlin") {
		t.Fatalf("tether nodes at the root:\n%s", out)
	}
	// The site's nodes trust the root's user CA, scoped: on the managed
	// sshd as a cert-authority line with the root's principals.
	managedKeys := filepath.Join(sd.dir, "tether", "authorized_keys", loginUser)
	waitFor(t, "the root's CA scoped on n2's sshd", 30*time.Second, func() bool {
		b, _ := os.ReadFile(managedKeys)
		return strings.Contains(string(b), "cert-authority,principals=") &&
			strings.Contains(string(b), "tether:berlin-all:"+loginUser)
	})
	if b, _ := os.ReadFile(managedKeys); strings.Contains(string(b), "berlin-pos") {
		t.Fatalf("n2 (role=kiosk) trusts the root's berlin-pos role:\n%s", b)
	}

	login := func(operator, key string) string {
		t.Helper()
		dir := t.TempDir()
		if _, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "login", "--data-dir", root.dataDir,
			"--user", operator, "--key", key, "--out-dir", dir); code != 0 {
			t.Fatalf("tether login %s: exit %d: %s", operator, code, errOut)
		}
		return filepath.Join(dir, operator+"-cert.pub")
	}
	aliceCert, carolCert := login("alice", opKey), login("carol", carol.Path)
	// Stock OpenSSH, the root's `tether config ssh` (its known_hosts has
	// the site's host CA for *.berlin only), ssh -J op@root root@n1.berlin.
	jump := func(c *sshClient, cert, node string, command ...string) (string, string, int) {
		t.Helper()
		args := append([]string{"-F", c.cfg, "-o", "CertificateFile=" + cert, "-J", c.operator + "@" + root.sshAddr(),
			loginUser + "@" + node}, command...)
		return runCmd(t, 45*time.Second, "ssh", args...)
	}
	alice := newSSHClient(t, root)
	carolSSH := newSSHClientAs(t, root, "carol", carol.Path)
	if kh, _ := os.ReadFile(alice.known); !strings.Contains(string(kh), "@cert-authority *.berlin,*.berlin.tether ") {
		t.Fatalf("tether config ssh at the root wrote no line for site berlin:\n%s", kh)
	}
	if out, errOut, code := jump(alice, aliceCert, "n1.berlin", "echo reached-n1"); code != 0 ||
		strings.TrimSpace(out) != "reached-n1" {
		t.Fatalf("alice to n1.berlin: exit %d, %q, %s", code, out, errOut)
	}
	if out, errOut, code := jump(
		carolSSH, carolCert, "n2.berlin", "echo reached-n2",
	); code != 0 || strings.TrimSpace(out) != "reached-n2" {
		t.Fatalf("carol to n2.berlin (managed sshd): exit %d, %q, %s", code, out, errOut)
	}
	// The root's role does not select n2 for alice: refused at the root.
	if _, errOut, code := jump(alice, aliceCert, "n2.berlin", "true"); code == 0 ||
		!strings.Contains(errOut, "administratively prohibited") {
		t.Fatalf("alice to n2.berlin: exit %d, %s", code, errOut)
	}
	// A name outside the root's tree resolves to nothing.
	if _, errOut, code := jump(alice, aliceCert, "n1.paris", "true"); code == 0 ||
		!strings.Contains(errOut, "administratively prohibited: tether: not a node") {
		t.Fatalf("n1.paris: exit %d, %s", code, errOut)
	}

	// A job from the root fans out through the site, by labels.
	j, code := root.runJSON(90*time.Second, "-l", "site=berlin", "--", "uptime")
	if code != 0 || j.State != "succeeded" || len(j.Nodes) != 2 || j.node("n1.berlin").State != "ok" ||
		j.node("n2.berlin").State != "ok" {
		t.Fatalf("tether run -l site=berlin at the root: exit %d, %+v", code, j)
	}
	// Every node at the root is the nodes below berlin, never the site hub
	// itself (it serves only route streams); named, it is told so.
	if j, code := root.runJSON(90*time.Second, "-l", "*", "--", "true"); code != 0 || len(j.Nodes) != 2 {
		t.Fatalf("tether run -l '*' at the root: exit %d, %+v (want n1.berlin and n2.berlin only)", code, j)
	}
	if _, errOut, code := root.run(
		30*time.Second, "--nodes", "berlin", "--", "true",
	); code == 0 || !strings.Contains(errOut, "is a site hub, not a node") {
		t.Fatalf("tether run --nodes berlin: exit %d, %s", code, errOut)
	}
	// Every hop audited at the site, with the root's operator.
	var siteAudit string
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("the site's audit:\n%s", siteAudit)
		}
	})
	waitFor(t, "the site's audit of the hops", 20*time.Second, func() bool {
		var hops []string
		siteAudit = site.cli("audit")
		for _, l := range strings.Split(siteAudit, "\n") {
			if strings.Contains(l, "site_route") {
				hops = append(hops, l)
			}
		}
		a := strings.Join(hops, "\n")
		return strings.Contains(a, "alice") && strings.Contains(a, "carol") && strings.Contains(a, "purpose job")
	})

	// The site killed: commands for it fail fast, saying since when.
	site.p.Kill()
	waitForState(t, "berlin unreachable at the root", 30*time.Second, func() string {
		_, errOut, _ := jump(alice, aliceCert, "n1.berlin", "true")
		return errOut
	}, func(s string) bool { return strings.Contains(s, "site berlin unreachable since ") })
	start := time.Now()
	j, code = root.runJSON(60*time.Second, "-l", "site=berlin", "--", "true")
	if code == 0 || !strings.Contains(j.node("n1.berlin").Error, "site berlin unreachable since ") {
		t.Fatalf("tether run while the site is down: exit %d, %+v", code, j)
	}
	if took := time.Since(start); took > 30*time.Second {
		t.Fatalf("a job for an unreachable site took %s to fail", took)
	}
}

// TestSiteRouteTwoLevels: root → region → berlin. An operator of the root
// reaches n1.berlin.region with the root's certificate (the root's trust
// passed on by region behind its own entry), verified by berlin's host CA
// (from region's status) through the root's `tether config ssh`; a job
// from the root runs there; region and berlin both audit the hop.
func TestSiteRouteTwoLevels(t *testing.T) {
	root := startHubIn(t, "", 0, "--site-status-interval", "1s")
	region := startHubIn(t, "", 0, "--parent", strings.TrimSpace(root.cli("site", "token", "create")),
		"--site", "region", "--site-status-interval", "1s")
	berlin := startHubIn(t, "", 0, "--parent", strings.TrimSpace(region.cli("site", "token", "create")),
		"--site", "berlin", "--site-status-interval", "1s")
	startAgent(t, berlin.token("--label", "role=pos"), "n1", "--ssh", "embedded")
	root.cli("role", "create", "eu-pos", "--nodes", "site=berlin.region,role=pos", "--logins", loginUser)
	root.cli("operator", "add", "alice", "--key", opPub, "--role", "eu-pos")
	waitForState(t, "n1.berlin.region online at the root", 60*time.Second, root.nodes, func(ns map[string]nodeJSON) bool {
		return ns["n1.berlin.region"].Online && ns["n1.berlin.region"].Labels["site"] == "berlin.region"
	})
	dir := t.TempDir()
	if _, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "login", "--data-dir", root.dataDir,
		"--user", "alice", "--key", opKey, "--out-dir", dir); code != 0 {
		t.Fatalf("tether login: exit %d: %s", code, errOut)
	}
	var alice *sshClient
	waitFor(t, "berlin's host CA at the root", 30*time.Second, func() bool {
		alice = newSSHClient(t, root)
		kh, _ := os.ReadFile(alice.known)
		return strings.Contains(string(kh), "@cert-authority *.berlin.region,")
	})
	var out, errOut string
	code := -1
	waitFor(t, "alice reaches n1.berlin.region (the root's trust reached n1)", 30*time.Second, func() bool {
		out, errOut, code = runCmd(t, 45*time.Second, "ssh", "-F", alice.cfg,
			"-o", "CertificateFile="+filepath.Join(dir, "alice-cert.pub"),
			"-J", "alice@"+root.sshAddr(), loginUser+"@n1.berlin.region", "echo reached")
		return code == 0
	})
	if strings.TrimSpace(out) != "reached" {
		t.Fatalf("alice to n1.berlin.region: exit %d, %q, %s", code, out, errOut)
	}
	j, code := root.runJSON(90*time.Second, "-l", "site=berlin.region", "--", "true")
	if code != 0 || j.node("n1.berlin.region").State != "ok" {
		t.Fatalf("tether run at the root two levels down: exit %d, %+v", code, j)
	}
	for name, h := range map[string]*hub{"region": region, "berlin": berlin} {
		waitFor(t, name+" audits the hop", 20*time.Second, func() bool {
			a := h.cli("audit")
			return strings.Contains(a, "site_route") && strings.Contains(a, "alice")
		})
	}
}
