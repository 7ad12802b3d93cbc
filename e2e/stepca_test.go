package e2e

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.step.sm/crypto/jose"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
)

// stepCABinary finds step-ca: TETHER_STEP_CA (make test builds it with
// `go install github.com/smallstep/certificates/cmd/step-ca`), or PATH.
func stepCABinary(t *testing.T) string {
	if p := os.Getenv("TETHER_STEP_CA"); p != "" {
		return p
	}
	if p, err := exec.LookPath("step-ca"); err == nil {
		return p
	}
	t.Skip("step-ca not found: run through `make test`, which builds it, or set TETHER_STEP_CA")
	return ""
}

// startStepCA runs a real step-ca on loopback with a root and intermediate
// made here and one JWK provisioner "tether" whose key is encrypted with
// password. (The step CLI on the module proxy is too old to init one.)
func startStepCA(t *testing.T, password string) (url, rootFile string) {
	t.Helper()
	bin := stepCABinary(t)
	dir := t.TempDir()
	// The same x509util-based code as the hub's CA, in its own directory: a
	// CA that has nothing to do with the hub's.
	if _, err := ca.LoadOrCreate(dir, "Step"); err != nil {
		t.Fatal(err)
	}
	jwk, err := jose.GenerateJWK("EC", "P-256", "ES256", "sig", "", 0)
	if err != nil {
		t.Fatal(err)
	}
	kid, err := jose.Thumbprint(jwk)
	if err != nil {
		t.Fatal(err)
	}
	jwk.KeyID = kid
	jwe, err := jose.EncryptJWK(jwk, []byte(password))
	if err != nil {
		t.Fatal(err)
	}
	encrypted, err := jwe.CompactSerialize()
	if err != nil {
		t.Fatal(err)
	}
	pub := jwk.Public()
	port := freePort(t)
	cfg := map[string]any{
		"root":     filepath.Join(dir, ca.CertFile),
		"crt":      filepath.Join(dir, ca.IntermediateCertFile),
		"key":      filepath.Join(dir, ca.IntermediateKeyFile),
		"address":  fmt.Sprintf("127.0.0.1:%d", port),
		"dnsNames": []string{"127.0.0.1", "localhost"},
		"logger":   map[string]any{"format": "text"},
		"authority": map[string]any{
			"claims": map[string]any{"minTLSCertDuration": "10s", "maxTLSCertDuration": "48h", "defaultTLSCertDuration": "24h"},
			"provisioners": []any{map[string]any{
				"type": "JWK", "name": "tether", "key": &pub, "encryptedKey": encrypted,
			}},
		},
	}
	b, _ := json.MarshalIndent(cfg, "", "  ")
	cfgFile := filepath.Join(dir, "ca.json")
	os.WriteFile(cfgFile, b, 0o600)
	p := start(t, "step-ca", bin, cfgFile)
	rootFile = filepath.Join(dir, ca.CertFile)
	rootPEM, _ := os.ReadFile(rootFile)
	roots, _ := pki.ParseCerts(rootPEM)
	pool := x509.NewCertPool()
	pool.AddCert(roots[0])
	hc := &http.Client{Timeout: 2 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}}
	url = fmt.Sprintf("https://127.0.0.1:%d", port)
	waitFor(t, "step-ca to serve /health", 30*time.Second, func() bool {
		if p.Exited() {
			t.Fatalf("step-ca exited: %s", p.Log())
		}
		resp, err := hc.Get(url + "/health")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == 200
	})
	return url, rootFile
}

// TestStepCAMode: the hub delegates node certificates to a real step-ca;
// a node joins, its certificate chains to the step-ca root, it connects,
// renews through the step-ca, and an operator jumps to it.
func TestStepCAMode(t *testing.T) {
	t.Parallel()
	const password = "correct horse battery staple"
	url, root := startStepCA(t, password)
	pwFile := filepath.Join(t.TempDir(), "pw")
	os.WriteFile(pwFile, []byte(password+"\n"), 0o600)
	h := startHubIn(t, "", 0, "--ca", "step-ca", "--step-ca-url", url, "--step-ca-root", root,
		"--step-ca-provisioner", "tether",
		"--step-ca-password-file", pwFile, "--node-cert-ttl", "15s")
	h.cli("operator", "add", "alice", "--key", opPub)
	_, stateDir := startAgent(t, h.token(), "stepnode", "--ssh", "embedded")
	h.waitOnline("stepnode", "")

	chainPEM, _ := os.ReadFile(filepath.Join(stateDir, "node.crt"))
	chain, err := pki.ParseCerts(chainPEM)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(chain[0].Issuer.CommonName, "Step Intermediate") {
		t.Fatalf("node certificate issued by %q, want the step-ca intermediate", chain[0].Issuer.CommonName)
	}
	id, err := pki.IdentityOf(chain[0])
	if err != nil || id.Kind != pki.KindNode || id.ID != h.nodes()["stepnode"].ID {
		t.Fatalf("identity in step-ca certificate: %+v %v", id, err)
	}
	c := newSSHClient(t, h)
	if out, errOut, code := c.run(30*time.Second, "stepnode", "echo via-step-ca"); code != 0 ||
		strings.TrimSpace(out) != "via-step-ca" {
		t.Fatalf("jump: %d %q %q", code, out, errOut)
	}
	// Renewal goes through the step-ca too (15 s certificates).
	waitFor(t, "a renewal", 30*time.Second, func() bool {
		for _, e := range h.audit("--node", "stepnode") {
			if e.Kind == "renew" && e.Result == "ok" {
				return true
			}
		}
		return false
	})
	renewedPEM, _ := os.ReadFile(filepath.Join(stateDir, "node.crt"))
	renewed, _ := pki.ParseCerts(renewedPEM)
	if renewed[0].SerialNumber.Cmp(chain[0].SerialNumber) == 0 ||
		!strings.Contains(renewed[0].Issuer.CommonName, "Step Intermediate") {
		t.Fatalf("renewed certificate: serial %v issuer %q", renewed[0].SerialNumber, renewed[0].Issuer.CommonName)
	}
}
