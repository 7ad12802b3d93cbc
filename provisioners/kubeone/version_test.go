package kubeone

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

// v18 is what a KubeOne 1.8.1 release binary prints for `kubeone version`
// (pkg/cmd/version.go: apimachinery version.Info of KubeOne and of its
// machine-controller, indented JSON).
const v18 = `{
  "kubeone": {
    "major": "1",
    "minor": "8",
    "gitVersion": "1.8.1",
    "gitCommit": "4e6e8f6a0e3f9f4d2d1a5b1c1c2c3d4e5f6a7b8c",
    "gitTreeState": "",
    "buildDate": "2024-07-04T10:13:37Z",
    "goVersion": "go1.22.4",
    "compiler": "gc",
    "platform": "linux/amd64"
  },
  "machine_controller": {
    "major": "1",
    "minor": "59",
    "gitVersion": "v1.59.1",
    "gitCommit": "",
    "gitTreeState": "",
    "buildDate": "",
    "goVersion": "",
    "compiler": "",
    "platform": "linux/amd64"
  }
}`

// The hub asks its kubeone which release it is and from that which
// Kubernetes minors it installs, as KubeOne's own validation has them.
func TestVersion(t *testing.T) {
	for _, tc := range []struct {
		name      string
		out       string
		release   string
		lo, hi    int
		known, ok bool
		tooOld    bool
	}{
		{"1.8.1 release", v18, "1.8.1", 27, 30, true, true, false},
		{"1.8.0: 1.30 came in 1.8.1", strings.Replace(v18, `"1.8.1"`, `"1.8.0"`, 1), "1.8.0", 27, 29, true, true, false},
		{"git build", strings.Replace(v18, `"1.8.1"`, `"v1.10.2-4-gdeadbee"`, 1), "v1.10.2-4-gdeadbee",
			30, 32, true, true, false},
		{"1.11", strings.Replace(v18, `"1.8.1"`, `"1.11.0"`, 1), "1.11.0", 30, 33, true, true, false},
		{"1.14", strings.Replace(v18, `"1.8.1"`, `"1.14.2"`, 1), "1.14.2", 34, 36, true, true, false},
		{"newer than the hub", strings.Replace(v18, `"1.8.1"`, `"1.99.0"`, 1), "1.99.0", 0, 0, true, false, false},
		{"too old", strings.Replace(v18, `"1.8.1"`, `"1.7.3"`, 1), "1.7.3", 0, 0, true, false, true},
		{"dev build", `{"kubeone": {"gitVersion": "dev", "gitCommit": "none"}, "machine_controller": {}}`, "dev",
			0, 0, false, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bin := fakeKubeOne(t, "[ \"$*\" = version ] || exit 9\ncat <<'X'\n"+tc.out+"\nX")
			r, err := New(Config{Binary: bin, WorkDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			rel, err := r.Version(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			lo, hi, ok := rel.KubernetesMinors()
			if rel.GitVersion != tc.release || rel.Known != tc.known || lo != tc.lo || hi != tc.hi || ok != tc.ok ||
				rel.TooOld() != tc.tooOld {
				t.Fatalf("release %+v: minors %d..%d %v, too old %v", rel, lo, hi, ok, rel.TooOld())
			}
			if !strings.Contains(rel.String(), bin) {
				t.Errorf("%q does not name the binary", rel)
			}
		})
	}
	t.Run("not KubeOne", func(t *testing.T) {
		r, _ := New(Config{Binary: fakeKubeOne(t, "echo 'v1.2.3'"), WorkDir: t.TempDir()})
		if _, err := r.Version(context.Background()); err == nil || !strings.Contains(err.Error(), "is it KubeOne?") {
			t.Fatalf("plain text version: %v", err)
		}
	})
	t.Run("fails", func(t *testing.T) {
		r, _ := New(Config{Binary: fakeKubeOne(t, "echo broken >&2; exit 3"), WorkDir: t.TempDir()})
		if _, err := r.Version(context.Background()); err == nil || !strings.Contains(err.Error(), "broken") {
			t.Fatalf("failing version: %v", err)
		}
	})
}

func TestReleasesFor(t *testing.T) {
	want := map[int]string{27: "1.8", 30: "1.8.1 to 1.11", 34: "1.12 to 1.14", 36: "1.14", 26: "", 37: ""}
	for minor, want := range want {
		if got := ReleasesFor(minor); got != want {
			t.Errorf("ReleasesFor(%d) = %q, want %q", minor, got, want)
		}
	}
	if lo, hi := KnownKubernetesMinors(); lo != 27 || hi != 36 {
		t.Errorf("KnownKubernetesMinors = %d..%d", lo, hi)
	}
}

// "kubeone not found" is read by an operator on another machine: it says
// the hub's PATH (or the --kubeone path given) was searched, and what to do.
func TestBinaryNotFoundSaysWhere(t *testing.T) {
	missing := filepath.Join(t.TempDir(), "kubeone")
	for _, tc := range []struct{ binary, says string }{
		{"kubeone-not-installed-here", `no "kubeone-not-installed-here" on the hub's PATH`},
		{missing, "--kubeone " + missing + " is not an executable on the hub's machine"},
	} {
		r, err := New(Config{Binary: tc.binary, WorkDir: t.TempDir()})
		if err != nil {
			t.Fatal(err)
		}
		_, err = r.Version(context.Background())
		if !errors.Is(err, ErrNoBinary) || !strings.Contains(err.Error(), tc.says) ||
			!strings.Contains(err.Error(), "start the hub with --kubeone") {
			t.Errorf("%s: %v", tc.binary, err)
		}
	}
}
