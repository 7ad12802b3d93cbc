package e2e

import (
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/tether-dev/tether/pki"
)

// TestSecretsNeverInLogs: after joins (one refused for a wrong secret),
// jumps, a tether login and certificate renewals, with every process at
// debug level, no log and no command output other than `tether token
// create`'s own holds a join token secret or any private key material.
func TestSecretsNeverInLogs(t *testing.T) {
	t.Parallel()
	h := startHubArgs(t, 0, "--node-cert-ttl", "9s")
	h.cli("operator", "add", "alice", "--key", opPub)
	h.cli("role", "create", "certs", "--nodes", "*", "--logins", loginUser)
	carolKey := filepath.Join(t.TempDir(), "carol")
	runCmd(t, 10*time.Second, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", carolKey)
	h.cli("operator", "add", "carol", "--key", carolKey+".pub", "--role", "certs")

	runJoin := h.token("--uses", "2")
	var outputs []string // command outputs that are logs too
	agent, stateA := startAgent(t, runJoin, "sec1", "--ssh", "embedded")
	stateB := filepath.Join(t.TempDir(), "sec2")
	out, errOut, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether-edge"), "join", runJoin,
		"--name", "sec2", "--state-dir", stateB, "--log-level", "debug")
	if code != 0 {
		t.Fatalf("tether-edge join: %d %s", code, errOut)
	}
	outputs = append(outputs, out, errOut)
	js, _ := pki.ParseJoinString(runJoin)
	_, secret, _ := strings.Cut(js.Token, ".")
	wrong := strings.Repeat("b", 32)
	_, errOut, code = runCmd(t, 30*time.Second, filepath.Join(binDir, "tether-edge"), "join",
		strings.Replace(runJoin, secret, wrong, 1),
		"--name", "sec3", "--state-dir", filepath.Join(t.TempDir(), "sec3"), "--log-level", "debug")
	if code == 0 {
		t.Fatal("join with a wrong secret succeeded")
	}
	outputs = append(outputs, errOut)
	h.waitOnline("sec1", "")
	c := newSSHClient(t, h)
	if out, errOut, code := c.run(30*time.Second, "sec1", "echo hi"); code != 0 || strings.TrimSpace(out) != "hi" {
		t.Fatalf("jump: %d %q %q", code, out, errOut)
	}
	out, errOut, code = runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "login",
		"--data-dir", h.dataDir, "--user", "carol",
		"--key", carolKey, "--out-dir", t.TempDir(), "--log-level", "debug")
	if code != 0 {
		t.Fatalf("tether login: %d %s", code, errOut)
	}
	outputs = append(outputs, out, errOut)
	waitFor(t, "a certificate renewal", 30*time.Second, func() bool {
		for _, e := range h.audit("--node", "sec1") {
			if e.Kind == "renew" && e.Result == "ok" {
				return true
			}
		}
		return false
	})
	agent.Stop(syscall.SIGTERM, stopWait)

	secrets := map[string]string{"join token secret": secret, "wrong join secret": wrong}
	keyFiles := keyMaterial(t, h.dataDir, stateA, stateB, opKey, carolKey)
	for name, lines := range keyFiles {
		for i, l := range lines {
			secrets[fmt.Sprintf("%s line %d", name, i)] = l
		}
	}
	if len(keyFiles) < 6 {
		t.Fatalf("found key material in only %d files: %v", len(keyFiles), keyFiles)
	}
	logs := map[string]string{"hub log": h.p.Log(), "agent sec1 log": agent.Log(),
		"command output": strings.Join(outputs, "\n")}
	for what, text := range logs {
		if strings.Contains(text, "PRIVATE KEY") {
			t.Errorf("%s holds a PEM private key", what)
		}
		for name, s := range secrets {
			if strings.Contains(text, s) {
				t.Errorf("%s holds the %s", what, name)
			}
		}
	}
	t.Logf("checked the hub log (%d bytes), the agent's (%d) and command output (%d) against %d secrets from %d key files",
		len(logs["hub log"]), len(logs["agent sec1 log"]), len(logs["command output"]), len(secrets), len(keyFiles))
}

// keyMaterial returns, per secret file found under the given paths, the
// strings that would give it away in a log: each base64 line of a PEM
// private key (no shorter than 16 characters), or the hex and base64 of a
// raw secret (the QUIC reset key).
func keyMaterial(t *testing.T, paths ...string) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, root := range paths {
		_ = filepath.Walk(root, func(p string, fi os.FileInfo, err error) error {
			if err != nil || fi.IsDir() {
				return nil
			}
			b, err := os.ReadFile(p)
			if err != nil {
				return nil
			}
			switch {
			case strings.Contains(string(b), "PRIVATE KEY"):
				for _, l := range strings.Split(string(b), "\n") {
					if l = strings.TrimSpace(l); len(l) >= 16 && !strings.HasPrefix(l, "-----") {
						out[p] = append(out[p], l)
					}
				}
			case strings.HasSuffix(p, ".key") && len(b) == 32:
				out[p] = []string{hex.EncodeToString(b), base64.StdEncoding.EncodeToString(b)[:40]}
			}
			return nil
		})
	}
	return out
}
