package e2e

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/onboardproto"
)

// TestOnboardingHubSide drives the hub side of onboarding with the real
// binaries: OS profiles (a bad template refused at add), an onboarding
// credential printed once, the CA endpoint, a machine onboarded, the hub
// killed -9 and restarted, the machine's retry served with the same node
// and no use spent, and the revoked credential refused with its reason in
// the audit log.
func TestOnboardingHubSide(t *testing.T) {
	h := startHub(t)
	tether := filepath.Join(binDir, "tether")
	h.cli("osprofile", "add", "debian-12", "--distro", "debian", "--version", "12", "--family", "debian")
	bad := filepath.Join(t.TempDir(), "bad.tmpl")
	if err := os.WriteFile(bad, []byte("#cloud-config\nbootcmd: [[reboot]]\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, errOut, code := runCmd(
		t, 30*time.Second, tether, "osprofile", "add", "bad", "--distro", "x", "--version", "1", "--cloud-init", bad,
		"--data-dir", h.dataDir,
	); code == 0 || !strings.Contains(errOut, "field bootcmd not found") {
		t.Fatalf("bad template: exit %d, %s", code, errOut)
	}
	if out := h.cli("osprofile", "list"); !strings.Contains(out, "debian-12") || strings.Contains(out, "bad") {
		t.Fatalf("osprofile list:\n%s", out)
	}

	cred := strings.TrimSpace(h.cli("onboarding", "create", "berlin-shop", "--role", "onboarder", "--uses", "50",
		"--ttl", "7d", "--label", "site=berlin"))
	if !regexp.MustCompile(`^[a-z2-7]{8}\.[a-z2-7]{32}$`).MatchString(cred) {
		t.Fatalf("onboarding create printed %q, want only ID.SECRET", cred)
	}

	// The CA, fetched without trust, is checked against the pin.
	insecure := &http.Client{
		Timeout:   10 * time.Second,
		Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
	}
	defer insecure.CloseIdleConnections()
	resp, err := insecure.Get("https://" + h.apiAddr() + onboardproto.CAPath)
	if err != nil {
		t.Fatal(err)
	}
	caPEM, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	cas, err := pki.ParseCerts(caPEM)
	if err != nil {
		t.Fatal(err)
	}
	pin := pki.Fingerprint(cas[0])
	adminCA, _ := os.ReadFile(filepath.Join(h.dataDir, "admin", "ca.crt"))
	if want, _ := pki.ParseCerts(adminCA); len(want) == 0 || pki.Fingerprint(want[0]) != pin {
		t.Fatalf("CA endpoint served a CA with pin %s, not the hub's", pin)
	}
	tc, err := pki.PinnedTLSConfig(pin, nil)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: tc}}
	defer hc.CloseIdleConnections()

	key, _ := pki.GenerateKey()
	csr, _ := pki.NewCSR(key, "m")
	onboard := func(cred, uuid string) (int, onboardproto.Response, string) {
		b, _ := json.Marshal(onboardproto.Request{Credential: cred, CSR: csr, AgentVersion: "e2e",
			Facts:   control.Facts{Hostname: "shop-1", OSID: "ubuntu", OSVersion: "24.04", Arch: "amd64"},
			Machine: onboardproto.MachineFacts{UUID: uuid, UUIDSource: "/etc/machine-id", OSIDLike: "debian"}})
		resp, err := hc.Post("https://"+h.apiAddr()+onboardproto.Path, "application/json", bytes.NewReader(b))
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		var out onboardproto.Response
		_ = json.Unmarshal(body, &out)
		return resp.StatusCode, out, string(body)
	}
	status, first, body := onboard(cred, "e2e-machine-0001")
	if status != 200 || first.Existing || first.Profile != "debian-12" || first.MatchedBy != "family" {
		t.Fatalf("onboard: %d %s", status, body)
	}
	if _, err := onboardproto.ParseUserData(first.UserData); err != nil {
		t.Fatal(err)
	}
	certs, err := pki.ParseCerts([]byte(first.Cert))
	if err != nil || !bytes.Equal(certs[0].RawSubjectPublicKeyInfo, mustSPKI(t, key.Public())) {
		t.Fatalf("node certificate not for the machine's key: %v", err)
	}

	h.p.Kill()
	h.start()

	status, again, body := onboard(cred, "e2e-machine-0001")
	if status != 200 || !again.Existing || again.NodeID != first.NodeID {
		t.Fatalf("retry after the hub's kill -9: %d %s", status, body)
	}
	if out := h.cli("onboarding", "list"); !strings.Contains(out, "49/50") || !strings.Contains(out, "active") {
		t.Fatalf("onboarding list after one machine and a retry:\n%s", out)
	}
	if n := h.nodes()["shop-1"]; n.ID != first.NodeID || n.Labels["site"] != "berlin" {
		t.Fatalf("node %+v", n)
	}

	h.cli("onboarding", "revoke", "berlin-shop")
	if status, _, body := onboard(cred, "e2e-machine-0002"); status != 403 || !strings.Contains(body, "revoked") {
		t.Fatalf("revoked credential: %d %s", status, body)
	}
	if out := h.cli("audit"); !strings.Contains(out, "reason=revoked") || !strings.Contains(out, "onboarding_revoke") {
		t.Fatalf("audit:\n%s", out)
	}
	h.cli("osprofile", "rm", "debian-12")
}

func mustSPKI(t *testing.T, pub any) []byte {
	t.Helper()
	b, err := x509.MarshalPKIXPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
