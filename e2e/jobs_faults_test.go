package e2e

import (
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// checkIdentity fails unless the agent's state dir holds a key and a
// certificate chain that belong together and are valid now: nothing torn
// by a kill -9.
func checkIdentity(t *testing.T, stateDir string) {
	t.Helper()
	certPEM, err := os.ReadFile(filepath.Join(stateDir, "node.crt"))
	if err != nil {
		t.Fatal(err)
	}
	keyPEM, err := os.ReadFile(filepath.Join(stateDir, "node.key"))
	if err != nil {
		t.Fatal(err)
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		t.Fatalf("node.crt and node.key do not form a pair: %v", err)
	}
	leaf, err := x509.ParseCertificate(pair.Certificate[0])
	if err != nil {
		t.Fatal(err)
	}
	if now := time.Now(); now.Before(leaf.NotBefore) || now.After(leaf.NotAfter) {
		t.Fatalf("node certificate not valid now: %s..%s", leaf.NotBefore, leaf.NotAfter)
	}
	for _, f := range []string{"ca.crt", "node.json"} {
		b, err := os.ReadFile(filepath.Join(stateDir, f))
		if err != nil || len(b) == 0 {
			t.Fatalf("%s: %v (%d bytes)", f, err, len(b))
		}
	}
	if block, _ := pem.Decode(certPEM); block == nil {
		t.Fatal("node.crt is not PEM")
	}
}

// victim is one agent the tests below kill and restart.
type victim struct {
	t        *testing.T
	h        *hub
	p        *proc
	stateDir string
}

func startVictim(t *testing.T, hubArgs ...string) *victim {
	h := startHubIn(t, "", 0, hubArgs...)
	v := &victim{t: t, h: h}
	v.p, v.stateDir = startAgent(t, h.token("--uses", "1"), "victim", "--ssh", "embedded", "--keepalive", "1s",
		"--dead-peer-timeout", "4s")
	h.waitOnline("victim", "")
	return v
}

// restart starts the agent again from its state dir (no join string: the
// identity is on disk) and waits for the new process to connect. Online
// alone is not enough: until the hub notices that the killed agent's
// connection is dead (QUIC sends nothing on SIGKILL) the old session still
// reads online.
func (v *victim) restart() {
	v.t.Helper()
	connects := v.h.connects("victim")
	v.p = start(v.t, "agent-victim", filepath.Join(binDir, "tether-edge"), testenv.AgentArgs("", v.stateDir, "",
		"--ssh", "embedded", "--backoff-max", "2s", "--keepalive", "1s", "--dead-peer-timeout", "4s",
		"--log-level", "debug")...)
	v.h.waitConnected("victim", connects)
}

// TestAgentKilledMidUpload kills tether-edge with SIGKILL while the hub
// uploads a large file to it: the job records the node's failure with a
// reason, no partial file appears at the destination, the agent comes back
// with a valid identity and a rerun completes. The hub keeps the upload's
// stream for its resume window (the node's link could come back), so the
// node fails once that has passed: 5 s here.
func TestAgentKilledMidUpload(t *testing.T) {
	v := startVictim(t, "--keepalive", "1s", "--dead-peer-timeout", "4s", "--resume-window", "5s")
	h := v.h
	{
		dir := t.TempDir()
		big := filepath.Join(dir, "big.bin")
		f, _ := os.Create(big)
		buf := make([]byte, 1<<20)
		for range 256 {
			rand.Read(buf)
			f.Write(buf)
		}
		f.Close()
		dest := filepath.Join(dir, "dest", "big.bin")
		os.MkdirAll(filepath.Dir(dest), 0o755)
		out, errOut, code := h.run(time.Minute, "--detach", "--nodes", "victim", "--upload", big+":"+dest, "--", "true")
		if code != 0 {
			t.Fatalf("run: %d %s", code, errOut)
		}
		id := strings.TrimSpace(out)
		// Kill once the upload is under way: a temporary file appears next
		// to the destination.
		waitFor(t, "upload under way", 30*time.Second, func() bool {
			entries, _ := os.ReadDir(filepath.Dir(dest))
			return len(entries) > 0
		})
		v.p.Stop(syscall.SIGKILL, stopWait)
		waitFor(t, "job over", 60*time.Second, func() bool { return h.job(id).State != "running" })
		j := h.job(id)
		n := j.node("victim")
		if j.State != "failed" || n.State != "failed" || !strings.Contains(n.Error, "upload") {
			t.Fatalf("job after the agent was killed: %+v", j)
		}
		if _, err := os.Stat(dest); !os.IsNotExist(err) {
			t.Fatalf("a partial upload is at the destination: %v", err)
		}
		v.restart()
		checkIdentity(t, v.stateDir)
		re := strings.TrimSpace(h.cli("jobs", "rerun", id, "--failed", "--detach"))
		waitFor(t, "rerun over", 60*time.Second, func() bool { return h.job(re).State != "running" })
		if j := h.job(re); j.State != "succeeded" {
			t.Fatalf("rerun after restart: %+v", j)
		}
		if st, err := os.Stat(dest); err != nil || st.Size() != 256<<20 {
			t.Fatalf("destination after the rerun: %v", err)
		}
	}
}

// TestAgentKilledAroundRenewals kills tether-edge with SIGKILL at spread-out
// moments of its renewal cycle (9 s certificates renew about every 6 s):
// after every kill the state dir holds a key and certificate that belong
// together and are valid, and the agent reconnects with them.
func TestAgentKilledAroundRenewals(t *testing.T) {
	v := startVictim(t, "--node-cert-ttl", "9s")
	for i, wait := range []time.Duration{1300, 3700, 4600, 5300, 5900} {
		time.Sleep(wait * time.Millisecond)
		v.p.Stop(syscall.SIGKILL, stopWait)
		checkIdentity(t, v.stateDir)
		v.restart()
		t.Logf("kill %d after %dms: back online with a valid identity", i+1, wait)
	}
	// Renewals go on after all that: the certificate is replaced.
	before, _ := os.ReadFile(filepath.Join(v.stateDir, "node.crt"))
	waitFor(t, "another renewal", 20*time.Second, func() bool {
		after, _ := os.ReadFile(filepath.Join(v.stateDir, "node.crt"))
		return len(after) > 0 && string(after) != string(before)
	})
	checkIdentity(t, v.stateDir)
}
