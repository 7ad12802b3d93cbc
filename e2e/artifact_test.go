package e2e

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// TestArtifactPushInspect publishes an agent and a bundle with the real
// `tether artifact push` to a real registry over TLS with credentials,
// reads them back with `tether artifact inspect`, and checks the refusals
// an operator meets: an untrusted certificate, wrong credentials, a bad
// reference, an invalid bundle. Then a hub starts with --registry-ca and
// --registry-auth, and refuses to start with a CA file that is none.
func TestArtifactPushInspect(t *testing.T) {
	reg := testenv.StartRegistry(t, testenv.RegistryOptions{User: "ci", Password: "pw"})
	dir := t.TempDir()
	write := func(name, content string) (path, digest string) {
		path = filepath.Join(dir, name)
		if err := os.WriteFile(path, []byte(content), 0o755); err != nil {
			t.Fatal(err)
		}
		s := sha256.Sum256([]byte(content))
		return path, "sha256:" + hex.EncodeToString(s[:])
	}
	tether := filepath.Join(binDir, "tether")
	regFlags := []string{"--registry-ca", reg.CAFile, "--registry-auth", reg.AuthFile}
	cli := func(args ...string) (string, string, int) {
		t.Helper()
		return runCmd(t, 60*time.Second, tether, args...)
	}
	must := func(args ...string) string {
		t.Helper()
		out, errOut, code := cli(append(args, regFlags...)...)
		if code != 0 {
			t.Fatalf("tether %v: exit %d: %s", args, code, errOut)
		}
		return out
	}
	type inspected struct {
		Pinned, Digest, Kind, Version string
		Files                         map[string][]struct {
			Name, Digest string
			Size         int64
		}
	}
	inspect := func(ref string) inspected {
		t.Helper()
		var in inspected
		if err := json.Unmarshal([]byte(must("artifact", "inspect", ref, "-o", "json")), &in); err != nil {
			t.Fatal(err)
		}
		return in
	}

	// A real tether-edge of this platform at v1.4.0: the push checks the
	// binary's platform, that it is tether-edge, and its version.
	edge := testenv.EdgeVersion(t, "v1.4.0")
	edgeBytes, err := os.ReadFile(edge)
	if err != nil {
		t.Fatal(err)
	}
	edgeSum := sha256.Sum256(edgeBytes)
	platform := "linux/" + runtime.GOARCH
	otherPlatform := map[bool]string{true: "linux/amd64", false: "linux/arm64"}[runtime.GOARCH == "arm64"]
	script, _ := write("edge-script", "#!/bin/sh\necho v1.4.0\n")
	agentRef := reg.Ref("tether/edge:v1.4.0")
	var pushed struct{ Digest, Pinned string }
	if err := json.Unmarshal([]byte(must("artifact", "push", "agent", agentRef, "--version", "v1.4.0",
		"--binary", platform+"="+edge, "-o", "json")), &pushed); err != nil {
		t.Fatal(err)
	}
	in := inspect(agentRef)
	if in.Digest != pushed.Digest || in.Kind != "agent" || in.Version != "v1.4.0" || in.Pinned != pushed.Pinned {
		t.Fatalf("inspect %s: %+v, pushed %+v", agentRef, in, pushed)
	}
	edgeDigest := "sha256:" + hex.EncodeToString(edgeSum[:])
	if f := in.Files[platform]; len(in.Files) != 1 || len(f) != 1 || f[0].Digest != edgeDigest ||
		f[0].Name != "tether-edge" {
		t.Errorf("files %+v, want tether-edge %x for %s only", in.Files, edgeSum, platform)
	}
	if by := inspect(pushed.Pinned); by.Digest != pushed.Digest {
		t.Errorf("inspect by digest: %s, want %s", by.Digest, pushed.Digest)
	}

	install, _ := write("install.sh", "#!/bin/sh\necho installing\n")
	health, _ := write("check.sh", "#!/bin/sh\nexit 0\n")
	payload, payloadDigest := write("openssl_3.0.15.deb", "a package")
	bundleRef := reg.Ref("patches/openssl:42")
	must("artifact", "push", "bundle", bundleRef, "--version", "42", "--install", install, "--health", health,
		"--file", payload)
	text := must("artifact", "inspect", bundleRef)
	for _, want := range []string{
		"kind      bundle", "version   42", "install.sh", "health.sh", "openssl_3.0.15.deb", payloadDigest,
	} {
		if !strings.Contains(text, want) {
			t.Errorf("inspect %s does not show %q:\n%s", bundleRef, want, text)
		}
	}

	wrongAuth := filepath.Join(dir, "wrong.json")
	if err := testenv.WriteDockerConfig(wrongAuth, reg.Host, "ci", "nope"); err != nil {
		t.Fatal(err)
	}
	// Pushes of an agent that the agents would fail to run, or that would
	// report another version, are refused before anything is sent.
	pushAgent := func(version, binary string) []string {
		ref := reg.Ref("tether/edge:v1.4.1")
		return append([]string{"artifact", "push", "agent", ref, "--version", version, "--binary", binary}, regFlags...)
	}
	refusals := []struct {
		name string
		args []string
		says string
	}{
		{"untrusted certificate", []string{"artifact", "inspect", agentRef, "--registry-auth", reg.AuthFile},
			"--registry-ca"},
		{"wrong credentials",
			[]string{"artifact", "inspect", agentRef, "--registry-ca", reg.CAFile, "--registry-auth", wrongAuth},
			"--registry-auth"},
		{"bad reference",
			append([]string{"artifact", "inspect", strings.TrimPrefix(agentRef, "oci://")}, regFlags...),
			"does not start with oci://"},
		{"no tag", append([]string{"artifact", "inspect", reg.Ref("tether/edge")}, regFlags...), "no :TAG"},
		{"unknown tag", append([]string{"artifact", "inspect", reg.Ref("tether/edge:v9")}, regFlags...), "not found"},
		{"bad file name",
			append([]string{"artifact", "push", "bundle", bundleRef, "--version", "43", "--install", install,
				"--file", filepath.Join(dir, "..")}, regFlags...), "not a regular file"},
		{"bad binary flag", append([]string{"artifact", "push", "agent", agentRef, "--version", "1", "--binary", edge},
			regFlags...), "OS/ARCH=PATH"},
		{"agent: a script", pushAgent("v1.4.0", platform+"="+script), "not an ELF executable"},
		{"agent: another platform", pushAgent("v1.4.0", otherPlatform+"="+edge),
			"not for " + strings.TrimPrefix(otherPlatform, "linux/")},
		{"agent: another version", pushAgent("v1.4.1", platform+"="+edge), `does not report version "v1.4.1"`},
	}
	for _, r := range refusals {
		_, errOut, code := cli(r.args...)
		if code == 0 || !strings.Contains(errOut, r.says) {
			t.Errorf("%s: exit %d, stderr %q; want an error saying %q", r.name, code, errOut, r.says)
		}
	}
	// The refused push left the tag where it was, and pushed no agent.
	if again := inspect(bundleRef); again.Version != "42" {
		t.Errorf("after a refused push the tag names version %s", again.Version)
	}
	inspectRefused := append([]string{"artifact", "inspect", reg.Ref("tether/edge:v1.4.1")}, regFlags...)
	if out, errOut, code := cli(inspectRefused...); code == 0 {
		t.Errorf("a refused agent push published tether/edge:v1.4.1: %s%s", out, errOut)
	}

	startHubIn(t, "", 0, regFlags...)
	notCA, _ := write("not-a-ca.pem", "hello")
	_, errOut, code := cli(append([]string{"hub"},
		testenv.HubArgs(filepath.Join(t.TempDir(), "hub"), "127.0.0.1:"+strconv.Itoa(freePort(t)),
			"127.0.0.1:"+strconv.Itoa(freePort(t)), "info", "--registry-ca", notCA)...)...)
	if code == 0 || !strings.Contains(errOut, "--registry-ca") {
		t.Errorf("hub with a CA file that is none: exit %d, %s", code, errOut)
	}
}
