package testenv

import (
	"fmt"
	"os/exec"
	"path/filepath"
	"runtime"
)

// KubeOneStandInEnv names the environment variable that moves the stand-in
// kubeone's kube-apiserver probe off 127.0.0.1:6443 (see
// internal/testenv/kubeonestandin).
const KubeOneStandInEnv = "KUBEONE_STANDIN_APISERVER_PORT"

// BuildKubeOneStandIn builds the stand-in `kubeone` (internal/testenv/
// kubeonestandin) into dir and returns its path: dir/kubeone.
func BuildKubeOneStandIn(dir string) (string, error) {
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Dir(filepath.Dir(filepath.Dir(file))) // internal/testenv/ -> module root
	out := filepath.Join(dir, "kubeone")
	cmd := exec.Command("go", "build", "-o", out, "./internal/testenv/kubeonestandin")
	cmd.Dir = root
	if b, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("testenv: build the stand-in kubeone: %w\n%s", err, b)
	}
	return out, nil
}

// KubeOneStandIn is BuildKubeOneStandIn into the test's temporary directory.
func KubeOneStandIn(t T) string {
	t.Helper()
	p, err := BuildKubeOneStandIn(t.TempDir())
	if err != nil {
		t.Fatalf("%v", err)
	}
	return p
}
