package e2e

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// fleet is a hub with four nodes: embedded SSH and a real local sshd, each
// over QUIC and over TCP.
type fleet struct {
	h       *hub
	ssh     *sshClient
	sshd    *sshd // unmanaged: its host key is pinned by hand
	managed *sshd // managed by its agent (--manage-sshd): verified by host certificate
}

func startFleet(t *testing.T, extraAgentArgs ...string) *fleet {
	t.Helper()
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub)
	join := h.token("--ttl", "10m", "--uses", "4", "--label", "site=lab")
	f := &fleet{h: h, ssh: newSSHClient(t, h), sshd: startSSHD(t), managed: startSSHD(t)}
	type node struct {
		name, transport string
		ssh             []string
	}
	nodes := []node{
		{"emb-quic", "quic", []string{"--ssh", "embedded"}},
		{"emb-tcp", "tcp", []string{"--ssh", "embedded"}},
		{"sshd-quic", "quic", f.managed.managedArgs()},
		{"sshd-tcp", "tcp", []string{"--ssh", fmt.Sprintf("127.0.0.1:%d", f.sshd.port)}},
	}
	for _, n := range nodes {
		startAgent(t, join, n.name, append(append(n.ssh, "--transport", n.transport), extraAgentArgs...)...)
		h.waitOnline(n.name, n.transport)
	}
	// sshd-tcp's sshd is not managed by its agent (no host certificate
	// installed), so its key is pinned by hand, as an operator would.
	f.ssh.trust("sshd-tcp.tether", f.sshd.hostPub)
	// The managed one has its certificate once sshd was reloaded.
	waitFor(t, "managed sshd configured", 20*time.Second, func() bool {
		_, err := os.Stat(filepath.Join(f.managed.dir, "sshd_config.d", "50-tether.conf"))
		return err == nil
	})
	return f
}

func TestFleet(t *testing.T) {
	f := startFleet(t)
	nodes := []string{"emb-quic", "emb-tcp", "sshd-quic", "sshd-tcp"}

	t.Run("nodes json", func(t *testing.T) {
		got := f.h.nodes()
		for _, name := range nodes {
			n := got[name]
			if !n.Online || n.ID == "" || n.Labels["site"] != "lab" || n.AgentVersion == "" || n.OS == "" ||
				n.LastSeen.IsZero() {
				t.Errorf("node %s: %+v", name, n)
			}
			if want := name[strings.Index(name, "-")+1:]; n.Transport != want {
				t.Errorf("node %s transport = %q, want %q", name, n.Transport, want)
			}
		}
	})

	t.Run("jump", func(t *testing.T) {
		for _, name := range nodes {
			t.Run(name, func(t *testing.T) {
				out, errOut, code := f.ssh.run(30*time.Second, name, "echo hello-from-$(hostname); exit 7")
				if code != 7 || !strings.Contains(out, "hello-from-") {
					t.Fatalf("ssh -J to %s: exit %d, out %q, err %q", name, code, out, errOut)
				}
			})
		}
	})

	t.Run("config ssh route", func(t *testing.T) {
		// ssh -F CONFIG login@NODE.tether: ProxyJump through the alias, no -J.
		out, errOut, code := runCmd(t, 30*time.Second, "ssh", "-F", f.ssh.cfg, loginUser+"@emb-tcp.tether", "echo via-config")
		if code != 0 || strings.TrimSpace(out) != "via-config" {
			t.Fatalf("exit %d, out %q, err %q", code, out, errOut)
		}
	})

	t.Run("managed sshd", func(t *testing.T) {
		// The agent installed a host certificate for NAME and NAME.tether,
		// the user CA and an (empty) revoked-keys file, and sshd uses them.
		for _, name := range []string{"ssh_host_ed25519_key-cert.pub", "trusted_user_ca_keys.pub", "revoked_keys"} {
			if _, err := os.Stat(filepath.Join(f.managed.dir, "tether", name)); err != nil {
				t.Fatal(err)
			}
		}
		c := newSSHClient(t, f.h) // trusts only the host CA
		if out, errOut, code := c.run(30*time.Second, "sshd-quic", "echo managed"); code != 0 ||
			strings.TrimSpace(out) != "managed" {
			t.Fatalf("exit %d, out %q, err %q", code, out, errOut)
		}
	})

	t.Run("node without host certificate refused", func(t *testing.T) {
		// A fresh client that trusts only the host CA: the unmanaged sshd
		// node presents a plain key, which strict checking refuses.
		c := newSSHClient(t, f.h)
		_, errOut, code := c.run(30*time.Second, "sshd-tcp", "true")
		if code != 255 || !strings.Contains(errOut, "Host key verification failed") {
			t.Fatalf("exit %d, stderr %q", code, errOut)
		}
	})

	t.Run("scp 50MiB with checksum", func(t *testing.T) {
		src := filepath.Join(t.TempDir(), "blob")
		data := make([]byte, 50<<20)
		rand.Read(data)
		os.WriteFile(src, data, 0o600)
		want := sha256.Sum256(data)
		for _, name := range []string{"emb-quic", "sshd-tcp"} {
			t.Run(name, func(t *testing.T) {
				dst := filepath.Join(t.TempDir(), "copy")
				start := time.Now()
				_, errOut, code := runCmd(t, 2*time.Minute, "scp", "-F", f.ssh.cfg, "-J", "alice@"+f.h.sshAddr(), src,
					loginUser+"@"+name+".tether:"+dst)
				if code != 0 {
					t.Fatalf("scp: exit %d: %s", code, errOut)
				}
				t.Logf("scp 50 MiB through hub to %s: %.1f MB/s", name, 50/time.Since(start).Seconds())
				// The node is this machine, so the copy lands in our temp dir.
				got, err := os.ReadFile(dst)
				if err != nil {
					t.Fatal(err)
				}
				if sha256.Sum256(got) != want {
					t.Fatal("checksum mismatch after scp through the hub")
				}
				out, _, code := f.ssh.run(30*time.Second, name, "sha256sum "+dst)
				if code != 0 || !strings.HasPrefix(out, hex.EncodeToString(want[:])) {
					t.Fatalf("remote sha256sum: %q (exit %d)", out, code)
				}
			})
		}
	})

	t.Run("refused targets", func(t *testing.T) {
		f.h.cli("token", "list") // hub is up
		cases := []struct {
			target, want string
		}{
			{"127.0.0.1", "tether forwards only to node names"},
			{"localhost", "tether forwards only to node names"},
			{"::1", "tether forwards only to node names"},
			{"hub.tether.internal", "not a node"},
			{"no-such-node", `no node named "no-such-node"`},
			{"Not_A_Name", "not a node"},
		}
		for _, tc := range cases {
			t.Run(tc.target, func(t *testing.T) {
				_, errOut, code := runCmd(t, 30*time.Second, "ssh", "-F", f.ssh.cfg, "-J", "alice@"+f.h.sshAddr(),
					loginUser+"@"+tc.target, "true")
				if code == 0 || !strings.Contains(errOut, tc.want) {
					t.Fatalf("ssh -J to %s: exit %d, stderr %q, want it to contain %q", tc.target, code, errOut, tc.want)
				}
			})
		}
		// The hub's own ports are not reachable either: -W to the hub's API port by IP.
		_, errOut, code := runCmd(t, 30*time.Second, "ssh", "-F", f.ssh.cfg, "-W", f.h.apiAddr(), "alice@127.0.0.1",
			"-p", strconv.Itoa(f.h.sshPort))
		if code == 0 || !strings.Contains(errOut, "tether forwards only to node names") {
			t.Fatalf("-W to hub API: exit %d, %q", code, errOut)
		}
	})

	t.Run("unknown operator key refused", func(t *testing.T) {
		dir := t.TempDir()
		key := filepath.Join(dir, "k")
		runCmd(t, 10*time.Second, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", key)
		_, errOut, code := runCmd(t, 30*time.Second, "ssh", "-F", f.ssh.cfg, "-o", "IdentityFile="+key, "-i", key,
			"-p", strconv.Itoa(f.h.sshPort), "mallory@127.0.0.1", "true")
		if code != 255 || !strings.Contains(errOut, "Permission denied") {
			t.Fatalf("unknown key: exit %d, %q", code, errOut)
		}
	})

	t.Run("bastion has no shell", func(t *testing.T) {
		_, errOut, code := runCmd(t, 30*time.Second, "ssh", "-F", f.ssh.cfg, "-p", strconv.Itoa(f.h.sshPort),
			"alice@127.0.0.1", "id")
		if code == 0 || !strings.Contains(errOut, "jump host") {
			t.Fatalf("shell on bastion: exit %d, %q", code, errOut)
		}
	})

	// Stock OpenSSH lists chacha20-poly1305 first; on a CPU with AES-GCM
	// instructions the bastion offers an OpenSSH client that has AES-GCM
	// only AES-GCM (hub/bastion/ciphers.go), so the stock client negotiates
	// aes128-gcm, with no option of its own. Clients without AES-GCM:
	// TestParamikoJump.
	t.Run("stock OpenSSH negotiates AES-GCM", func(t *testing.T) {
		if !cpuHasAESGCM(t) {
			t.Skip("no AES-GCM instructions in /proc/cpuinfo: the bastion keeps x/crypto's cipher list")
		}
		_, errOut, _ := runCmd(t, 30*time.Second, "ssh", "-v", "-F", f.ssh.cfg, "-p", strconv.Itoa(f.h.sshPort),
			"alice@127.0.0.1", "id")
		for _, dir := range []string{"server->client", "client->server"} {
			if want := "kex: " + dir + " cipher: aes128-gcm@openssh.com"; !strings.Contains(errOut, want) {
				t.Errorf("ssh -v lacks %q:\n%s", want, errOut)
			}
		}
	})

	t.Run("metrics", func(t *testing.T) {
		body := f.h.metrics(t)
		for _, want := range []string{
			`tether_nodes_connected{transport="quic"} 2`,
			`tether_nodes_connected{transport="tcp"} 2`,
			`tether_jump_attempts_total{result="ok"}`,
			`tether_jump_attempts_total{result="not_a_node"}`,
			`tether_relayed_bytes_total{direction="to_node"}`,
			`tether_streams_opened_total{result="ok",service="ssh"}`,
			`tether_tunnel_handshake_duration_seconds_bucket`,
		} {
			if !strings.Contains(body, want) {
				t.Errorf("metrics lack %q", want)
			}
		}
	})

	t.Run("idle hub on one P", func(t *testing.T) {
		// The fleet is idle now: within 10 s of quiet (hub/idleprocs) the
		// hub schedules its goroutines on one P. The widening under load is
		// tested on the real runtime in hub/idleprocs.
		if runtime.NumCPU() < 2 {
			t.Skip("one CPU: the hub has nothing to narrow")
		}
		deadline := time.Now().Add(45 * time.Second)
		for {
			procs := testenv.SumMetrics(f.h.metrics(t))["go_sched_gomaxprocs_threads"]
			if procs == 1 {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("go_sched_gomaxprocs_threads = %v after 45 s of an idle fleet, want 1", procs)
			}
			time.Sleep(time.Second)
		}
	})
}

// metrics fetches /metrics over TLS, trusting only the hub's CA, on a
// connection closed afterwards: the scrape leaves no descriptor open in the
// hub (the fault tests count them).
func (h *hub) metrics(t *testing.T) string {
	t.Helper()
	caPEM, err := os.ReadFile(filepath.Join(h.dataDir, "ca", "ca.crt"))
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(caPEM)
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true,
		TLSClientConfig: &tls.Config{RootCAs: pool, ServerName: "hub.tether.internal"}}}
	resp, err := c.Get("https://" + h.apiAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// TestTCPService: an allow-listed local port is reachable through the hub
// (ssh -W node:port), any other port is refused by the agent.
func TestTCPService(t *testing.T) {
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() { io.Copy(c, c); c.Close() }()
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	startAgent(t, h.token(), "web", "--ssh", "embedded", "--allow-port", strconv.Itoa(port))
	h.waitOnline("web", "")
	c := newSSHClient(t, h)
	cmd := []string{"-F", c.cfg, "-p", strconv.Itoa(h.sshPort), "-W", fmt.Sprintf("web:%d", port), "alice@127.0.0.1"}
	out, errOut, code := runCmdInput(t, 30*time.Second, "ping-through-tether\n", "ssh", cmd...)
	if code != 0 || out != "ping-through-tether\n" {
		t.Fatalf("echo through allowed port: exit %d, out %q, err %q", code, out, errOut)
	}
	other := freePort(t)
	_, errOut, code = runCmdInput(t, 30*time.Second, "x", "ssh", "-F", c.cfg, "-p", strconv.Itoa(h.sshPort),
		"-W", fmt.Sprintf("web:%d", other), "alice@127.0.0.1")
	if code == 0 || !strings.Contains(errOut, "not in this node's allow-list") {
		t.Fatalf("non-allow-listed port: exit %d, %q", code, errOut)
	}
}

func runCmdInput(t *testing.T, timeout time.Duration, input, bin string, args ...string) (string, string, int) {
	t.Helper()
	cmd := execCommand(timeout, bin, args...)
	cmd.Stdin = strings.NewReader(input)
	var o, e bytes.Buffer
	cmd.Stdout, cmd.Stderr = &o, &e
	err := cmd.Run()
	code := 0
	if ee, ok := err.(interface{ ExitCode() int }); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return o.String(), e.String(), code
}

// TestAgentForwarding: `ssh -A` through the jump reaches the node's
// embedded server, where the forwarded agent lists the operator's key.
func TestAgentForwarding(t *testing.T) {
	t.Parallel()
	h := startHub(t)
	h.cli("operator", "add", "alice", "--key", opPub)
	startAgent(t, h.token(), "fwd", "--ssh", "embedded")
	h.waitOnline("fwd", "")
	c := newSSHClient(t, h)
	sock := filepath.Join(t.TempDir(), "agent.sock")
	ag := start(t, "ssh-agent", "/usr/bin/ssh-agent", "-D", "-a", sock)
	waitFor(t, "ssh-agent socket", 10*time.Second,
		func() bool { _, err := os.Stat(sock); return err == nil && !ag.Exited() })
	env := append(os.Environ(), "SSH_AUTH_SOCK="+sock)
	add := execCommand(10*time.Second, "ssh-add", opKey)
	add.Env = env
	if out, err := add.CombinedOutput(); err != nil {
		t.Fatalf("ssh-add: %v: %s", err, out)
	}
	cmd := execCommand(30*time.Second, "ssh", append(c.jumpArgs("fwd", "-A"), "ssh-add -l")...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "e2e-operator") {
		t.Fatalf("ssh -A through the jump: %v: %s", err, out)
	}
}

// cpuHasAESGCM reports whether this machine's CPU has the AES-GCM
// instructions the bastion's cipher choice looks for, read from
// /proc/cpuinfo (x86 "flags": aes, pclmulqdq; arm64 "Features": aes, pmull).
func cpuHasAESGCM(t *testing.T) bool {
	t.Helper()
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		t.Fatalf("read /proc/cpuinfo: %v", err)
	}
	key, need := "flags", []string{"aes", "pclmulqdq"}
	if runtime.GOARCH == "arm64" {
		key, need = "Features", []string{"aes", "pmull"}
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && strings.TrimSpace(k) == key {
			flags := strings.Fields(v)
			return !slices.ContainsFunc(need, func(f string) bool { return !slices.Contains(flags, f) })
		}
	}
	return false
}
