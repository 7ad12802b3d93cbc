package onboard

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
)

// TestDefaultTemplateCloudInitSchema checks the built-in template's output
// with cloud-init's own schema validator, where cloud-init is installed.
func TestDefaultTemplateCloudInitSchema(t *testing.T) {
	bin, err := exec.LookPath("cloud-init")
	if err != nil {
		t.Skip("cloud-init is not installed")
	}
	out, err := Render("", SampleData())
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "user-data")
	if err := os.WriteFile(path, []byte(out), 0o600); err != nil {
		t.Fatal(err)
	}
	if b, err := exec.Command(bin, "schema", "--config-file", path).CombinedOutput(); err != nil {
		t.Fatalf("cloud-init schema: %v\n%s\n%s", err, b, out)
	}
}
