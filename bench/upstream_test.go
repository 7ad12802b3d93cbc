package bench

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// TestUpstreamPatchesApply keeps bench/upstream honest: every quic-go patch
// there (a change measured against the go.mod's quic-go and proposed
// upstream) must still apply to that version, so bench/upstream/build.sh can
// repeat the measurement. It fails after a quic-go upgrade the patch does
// not survive.
func TestUpstreamPatchesApply(t *testing.T) {
	if _, err := exec.LookPath("patch"); err != nil {
		t.Fatal("patch not found: install Debian's patch package")
	}
	patches, err := filepath.Glob("upstream/quic-go-*.patch")
	if err != nil {
		t.Fatal(err)
	}
	if len(patches) == 0 {
		t.Fatal("no bench/upstream/quic-go-*.patch: delete build.sh and this test too if none is left")
	}
	dir, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "github.com/quic-go/quic-go").Output()
	if err != nil {
		t.Fatalf("go list -m github.com/quic-go/quic-go: %v", err)
	}
	src := strings.TrimSpace(string(dir))
	if src == "" {
		t.Fatal("quic-go's module is not in the module cache: run go mod download")
	}
	for _, p := range patches {
		body, err := os.ReadFile(p)
		if err != nil {
			t.Fatal(err)
		}
		cmd := exec.Command("patch", "--dry-run", "--force", "-p1", "-d", src)
		cmd.Stdin = bytes.NewReader(body)
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Errorf("%s does not apply to %s: %v\n%s\nrefresh it against this quic-go, or delete it if quic-go now "+
				"does the same", p, src, err, out)
		}
	}
}
