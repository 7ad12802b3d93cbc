package e2e

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/pki"
)

// TestTwoHubsOneDataDir: a second hub on a data dir a hub already holds is
// refused, naming the first one's PID and address, and leaves its hub.json
// alone; once the first is killed -9 the kernel drops its lock and a new hub
// starts on the same data dir.
func TestTwoHubsOneDataDir(t *testing.T) {
	h := startHub(t)
	second := []string{"hub"}
	second = append(second, testenv.HubArgs(h.dataDir, fmt.Sprintf("127.0.0.1:%d", freePort(t)),
		fmt.Sprintf("127.0.0.1:%d", freePort(t)), "info")...)
	_, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), second...)
	if code == 0 {
		t.Fatalf("second hub on %s exited 0", h.dataDir)
	}
	for _, want := range []string{"in use by another hub", "PID " + strconv.Itoa(h.p.PID()), h.apiAddr(), h.sshAddr()} {
		if !strings.Contains(errOut, want) {
			t.Errorf("second hub's error %q does not say %q", errOut, want)
		}
	}
	// The first hub's hub.json survived the second's exit: commands still find it.
	h.cli("nodes")

	h.p.Kill()
	h.start() // same data dir and ports: the dead hub's lock is gone
	h.cli("nodes")
}

// TestHubHTTPSNamesAndHealth: the hub's certificate names the address it
// listens on, so curl verifies it with only --cacert (no --resolve), and
// /healthz, /readyz and /v1/openapi.yaml answer without credentials.
func TestHubHTTPSNamesAndHealth(t *testing.T) {
	h := startHub(t)
	caFile := filepath.Join(h.dataDir, "admin", "ca.crt")
	base := "https://" + h.apiAddr()
	if _, err := exec.LookPath("curl"); err == nil {
		for path, want := range map[string]string{"/healthz": "ok", "/readyz": "ok", "/v1/openapi.yaml": "openapi: 3"} {
			out, errOut, code := runCmd(t, 30*time.Second, "curl", "-sS", "--fail", "--cacert", caFile, base+path)
			if code != 0 || !strings.Contains(out, want) {
				t.Errorf("curl --cacert %s %s: exit %d, out %.80q, err %q", caFile, path, code, out, errOut)
			}
		}
	} else {
		t.Log("no curl; checking with Go's TLS verification only")
	}

	// Go's own verification, with the IP address as the server name.
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	c := &http.Client{Timeout: 10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1"}}}
	defer c.CloseIdleConnections()
	for path, status := range map[string]int{"/healthz": 200, "/readyz": 200, "/v1/openapi.yaml": 200, "/v1/nodes": 401} {
		resp, err := c.Get(base + path)
		if err != nil {
			t.Fatalf("GET %s verified for 127.0.0.1: %v", path, err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != status {
			t.Errorf("GET %s: %d %q, want %d", path, resp.StatusCode, body, status)
		}
		if path == "/readyz" && strings.TrimSpace(string(body)) != "ok" {
			t.Errorf("/readyz says %q; it must say only ok or not ready", body)
		}
	}
}

// TestCLIWaitsForStartingHub: a command run while the hub is still starting
// (`tether hub & tether nodes`) waits for it and says so on stderr; with no
// hub coming it gives up within its bound.
func TestCLIWaitsForStartingHub(t *testing.T) {
	dataDir := filepath.Join(t.TempDir(), "hub")
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		t.Fatal(err)
	}
	// A live process named in hub.lock is a hub on its way (this test
	// stands in for one until the real hub starts, so the order is fixed).
	testenv.WriteFile(t, filepath.Join(dataDir, "hub.lock"), []byte(strconv.Itoa(os.Getpid())+"\n"), 0o600)

	cli := exec.Command(filepath.Join(binDir, "tether"), "nodes", "--data-dir", dataDir, "--wait", "60s")
	var stderr testenv.SyncBuffer
	var stdout strings.Builder
	cli.Stdout, cli.Stderr = &stdout, &stderr
	if err := cli.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var waitErr error
	go func() { waitErr = cli.Wait(); close(done) }()
	t.Cleanup(func() {
		_ = cli.Process.Signal(syscall.SIGKILL)
		<-done
	})
	waitFor(t, "the CLI to say it waits", 30*time.Second,
		func() bool { return strings.Contains(stderr.String(), "waiting for hub at "+dataDir) })

	apiPort := freePort(t)
	startHubIn(t, dataDir, apiPort)
	select {
	case <-done:
		if waitErr != nil || !strings.HasPrefix(stdout.String(), "NAME") {
			t.Fatalf("tether nodes after waiting: %v, out %q, err %q", waitErr, stdout.String(), stderr.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatalf("tether nodes still waiting after the hub started; err %q", stderr.String())
	}

	// No hub coming: bounded, and the error says what to do.
	empty := t.TempDir()
	start := time.Now()
	_, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "nodes", "--data-dir", empty,
		"--wait", "1s")
	if code == 0 || !strings.Contains(errOut, "no running hub") || !strings.Contains(errOut, "tether hub --data-dir") {
		t.Fatalf("no hub: exit %d, err %q", code, errOut)
	}
	if took := time.Since(start); took > 20*time.Second {
		t.Errorf("no hub: gave up after %s, want about --wait 1s", took)
	}
}

// TestVersionFlag: both binaries answer --version like their version command.
func TestVersionFlag(t *testing.T) {
	for _, bin := range []string{"tether", "tether-edge"} {
		flag, _, code := runCmd(t, 10*time.Second, filepath.Join(binDir, bin), "--version")
		cmd, _, code2 := runCmd(t, 10*time.Second, filepath.Join(binDir, bin), "version")
		if code != 0 || code2 != 0 || !strings.HasPrefix(flag, bin+" ") || flag != cmd {
			t.Errorf("%s --version: %q (exit %d); %s version: %q (exit %d)", bin, flag, code, bin, cmd, code2)
		}
	}
}

// TestSSHProfilesTwoHubsE2E: two hubs (node suffixes tether and prod), their
// profiles written into one ssh config and one known_hosts by `tether config
// ssh --ssh-config`, and a real jump through each with stock OpenSSH,
// verified by each hub's own host CA.
func TestSSHProfilesTwoHubsE2E(t *testing.T) {
	dir := t.TempDir()
	cfg, known := filepath.Join(dir, "ssh_config"), filepath.Join(dir, "known_hosts")
	hubs := []struct {
		h      *hub
		name   string // profile (--name); "" for the default
		suffix string
		node   string
	}{
		{h: startHub(t), suffix: "tether", node: "dev1"},
		{h: startHubIn(t, "", 0, "--node-suffix", "prod"), name: "prod", suffix: "prod", node: "prod1"},
	}
	for _, x := range hubs {
		x.h.cli("operator", "add", "alice", "--key", opPub)
		startAgent(t, x.h.token("--ttl", "10m"), x.node, "--ssh", "embedded")
		args := []string{"config", "ssh", "--user", "alice", "--known-hosts", known, "--identity-file", opKey,
			"--ssh-config", cfg}
		if x.name != "" {
			args = append(args, "--name", x.name)
		}
		x.h.cli(args...)
	}
	kh, _ := os.ReadFile(known)
	if n := strings.Count(string(kh), "@cert-authority "); n != 2 {
		t.Fatalf("known_hosts has %d CA lines, want one per hub:\n%s", n, kh)
	}
	// Strict checking against that known_hosts only; nothing is learned.
	full := filepath.Join(dir, "full_config")
	base, _ := os.ReadFile(cfg)
	testenv.WriteFile(t, full, append(base,
		[]byte("Host *\n  GlobalKnownHostsFile /dev/null\n  BatchMode yes\n  ConnectTimeout 10\n")...), 0o600)
	for _, x := range hubs {
		x.h.waitOnline(x.node, "")
		target := loginUser + "@" + x.node + "." + x.suffix
		out, errOut, code := runCmd(t, 60*time.Second, "ssh", "-F", full, target, "echo via-"+x.suffix)
		if code != 0 || strings.TrimSpace(out) != "via-"+x.suffix {
			t.Errorf("ssh -F CONFIG %s: exit %d, out %q, err %q", target, code, out, errOut)
		}
	}
	after, _ := os.ReadFile(known)
	if string(after) != string(kh) {
		t.Errorf("ssh changed known_hosts (learned a key):\n%s", after)
	}
}

// TestLoginWritesSSHProfile: `tether login` leaves the hub's ssh profile
// (ssh_config, known_hosts) next to the certificate, and plain
// `ssh -F OUT/ssh_config USER@NODE.tether` works with it: login and ssh
// config are one step.
func TestLoginWritesSSHProfile(t *testing.T) {
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub)
	startAgent(t, h.token("--ttl", "10m"), "n1", "--ssh", "embedded")
	out := filepath.Join(t.TempDir(), "tether")
	login := exec.Command(filepath.Join(binDir, "tether"), "login", "--data-dir", h.dataDir, "--user", "alice",
		"--key", opKey, "--out-dir", out)
	login.Env = append(os.Environ(), "SSH_AUTH_SOCK=") // the key file, not a developer's agent
	if b, err := login.CombinedOutput(); err != nil {
		t.Fatalf("tether login: %v\n%s", err, b)
	}
	cfg, _ := os.ReadFile(filepath.Join(out, "ssh_config"))
	for _, want := range []string{
		"# BEGIN tether profile tether", "Host tether-hub", "Host *.tether",
		"CertificateFile " + filepath.Join(out, "alice-cert.pub"),
	} {
		if !strings.Contains(string(cfg), want) {
			t.Errorf("ssh_config from login has no %q:\n%s", want, cfg)
		}
	}
	h.waitOnline("n1", "")
	o, errOut, code := runCmd(t, 60*time.Second, "ssh", "-F", filepath.Join(out, "ssh_config"),
		"-o", "BatchMode=yes", "-o", "GlobalKnownHostsFile=/dev/null",
		loginUser+"@n1.tether", "echo after-login")
	if code != 0 || strings.TrimSpace(o) != "after-login" {
		t.Fatalf("ssh with the profile from login: exit %d, out %q, err %q", code, o, errOut)
	}
}

// TestLoginFromElsewhere is an operator on another machine: `tether ca pin`
// on the hub's machine prints the pin the join strings carry; `tether login
// --hub ADDR --ca-pin PIN --identity-file KEY` with it; then `tether nodes`
// and `tether ca pin` with no --data-dir or --hub use the hub logged in to.
// A data dir named outright still wins over the login.
func TestLoginFromElsewhere(t *testing.T) {
	for _, f := range []string{"hub.json", "ca/ca.crt"} {
		if _, err := os.Stat(filepath.Join("/var/lib/tether", f)); err == nil {
			t.Skipf("a hub's data dir is at the default /var/lib/tether on this machine (%s): commands would use it", f)
		}
	}
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub, "--role", "admin")
	join := h.token("--ttl", "10m")
	startAgent(t, join, "n1", "--ssh", "embedded")
	js, err := pki.ParseJoinString(join)
	if err != nil {
		t.Fatal(err)
	}
	pin := strings.TrimSpace(h.cli("ca", "pin"))
	if pin != "sha256:"+js.CAPin {
		t.Fatalf("tether ca pin printed %q; the join string's pin is sha256:%s", pin, js.CAPin)
	}

	home := t.TempDir() // the operator's machine: no hub, ~/.tether lands here
	laptop := func(args ...string) (string, string, int) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(binDir, "tether"), args...)
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, "TETHER_") && !strings.HasPrefix(kv, "HOME=") && !strings.HasPrefix(kv, "SSH_AUTH_SOCK=") {
				env = append(env, kv)
			}
		}
		cmd.Env = append(env, "HOME="+home)
		var o, e bytes.Buffer
		cmd.Stdout, cmd.Stderr = &o, &e
		err := cmd.Run()
		code := 0
		if ee, ok := err.(*exec.ExitError); ok {
			code = ee.ExitCode()
		} else if err != nil {
			t.Fatalf("tether %v: %v", args, err)
		}
		return o.String(), e.String(), code
	}
	if _, errOut, code := laptop("nodes"); code == 0 || !strings.Contains(errOut, "no running hub") {
		t.Fatalf("tether nodes before any login: exit %d, %q; want no running hub found", code, errOut)
	}
	login := []string{"login", "--hub", h.apiAddr(), "--ca-pin", pin, "--user", "alice"}
	if _, errOut, code := laptop(append(login, "--identity-file", opKey)...); code != 0 {
		t.Fatalf("tether login --hub --ca-pin PIN --identity-file: exit %d: %s", code, errOut)
	}
	h.waitOnline("n1", "")
	out, errOut, code := laptop("nodes", "-o", "json")
	if code != 0 || !strings.Contains(out, `"name": "n1"`) {
		t.Fatalf("tether nodes after login, no flags: exit %d, out %q, err %q", code, out, errOut)
	}
	out, errOut, code = laptop("nodes", "-o", "json", "--identity", filepath.Join(home, ".tether", "admin"))
	if code != 0 || !strings.Contains(out, `"name": "n1"`) {
		t.Fatalf("tether nodes --identity DIR (no --hub): exit %d, out %q, err %q", code, out, errOut)
	}
	if out, errOut, code := laptop("ca", "pin"); code != 0 || strings.TrimSpace(out) != pin {
		t.Fatalf("tether ca pin after login: exit %d, out %q, err %q; want %s", code, out, errOut, pin)
	}
	// Named outright, a data dir is used, and one without a hub says so.
	empty := t.TempDir()
	_, errOut, code = laptop("nodes", "--data-dir", empty, "--wait", "0")
	if code == 0 || !strings.Contains(errOut, empty) {
		t.Fatalf("tether nodes --data-dir EMPTY after login: exit %d, %q; want it to name %s", code, errOut, empty)
	}
	// The flag's first name still works (hidden, said to be deprecated).
	_, errOut, code = laptop(append(login, "--key", opKey)...)
	if code != 0 || !strings.Contains(errOut, "--identity-file") {
		t.Fatalf("tether login --key: exit %d, %q; want success and a pointer to --identity-file", code, errOut)
	}
}
