package artifacts_test

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/tether-dev/tether/hub/artifacts"
	"github.com/tether-dev/tether/internal/testenv"
)

// goBuild builds a small Go program with extra go build arguments.
func goBuild(t *testing.T, src string, args ...string) string {
	t.Helper()
	dir := t.TempDir()
	testenv.WriteFile(t, filepath.Join(dir, "go.mod"), []byte("module example.com/notedge\n\ngo 1.22\n"), 0o644)
	testenv.WriteFile(t, filepath.Join(dir, "main.go"), []byte(src), 0o644)
	out := filepath.Join(dir, "prog")
	cmd := exec.Command("go", append(append([]string{"build", "-trimpath"}, args...), "-o", out, ".")...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOFLAGS=")
	if b, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build %v: %v\n%s", args, err, b)
	}
	return out
}

const versionProgram = "package main\n\nvar Version = \"dev\"\n\nfunc main() { println(Version) }\n"

// TestCheckAgentBinary: an agent artifact takes only tether-edge built for
// the platform it is pushed as, at the version it is pushed with; a
// script, a binary of another platform, another Go program or another
// version is refused, saying which.
func TestCheckAgentBinary(t *testing.T) {
	edge := testenv.EdgeVersion(t, "v1.4.0")
	here := "linux/" + runtime.GOARCH
	other := "linux/arm64"
	if runtime.GOARCH == "arm64" {
		other = "linux/amd64"
	}
	script := filepath.Join(t.TempDir(), "tether-edge")
	testenv.WriteFile(t, script, []byte("#!/bin/sh\necho v1.4.0\n"), 0o755)
	notEdge := goBuild(t, versionProgram, "-ldflags", "-X main.Version=v1.4.0")
	for _, tc := range []struct {
		name, path, platform, version string
		says                          string // "" accepted
	}{
		{"tether-edge", edge, here, "v1.4.0", ""},
		{"another version", edge, here, "v1.4.1", `does not report version "v1.4.1"`},
		{"a prefix of its version", edge, here, "v1.4", `does not report version "v1.4"`},
		{"another architecture", edge, other, "v1.4.0", "an executable for EM_"},
		{"another OS", edge, "freebsd/" + runtime.GOARCH, "v1.4.0", "tether-edge built for linux/"},
		{"an unknown architecture", edge, "linux/sparc", "v1.4.0", `architecture "sparc" is not one`},
		{"a shell script", script, here, "v1.4.0", "not an ELF executable"},
		{"another Go program", notEdge, here, "v1.4.0", "the Go program example.com/notedge, not tether-edge"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := artifacts.CheckAgentBinary(tc.path, tc.platform, tc.version)
			if tc.says == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			msg := fmt.Sprint(err)
			if !errors.Is(err, artifacts.ErrNotAgent) || !strings.Contains(msg, tc.says) || !strings.Contains(msg, tc.path) {
				t.Fatalf("CheckAgentBinary = %v, want ErrNotAgent naming %s and saying %q", err, tc.path, tc.says)
			}
		})
	}
}

// TestHoldsString: the version set with -X, or the source's default, is
// found in executables and position-independent executables alike; any
// other value, a prefix or a part of it included, is not.
func TestHoldsString(t *testing.T) {
	for _, mode := range []string{"exe", "pie"} {
		for _, set := range []string{"", "v7.7.7"} {
			args := []string{"-buildmode=" + mode}
			if set != "" {
				args = append(args, "-ldflags", "-X main.Version="+set)
			}
			path := goBuild(t, versionProgram, args...)
			want := set
			if want == "" {
				want = "dev"
			}
			for _, v := range []string{"dev", "v7.7.7", "v7.7", "7.7.7", ""} {
				got, err := artifacts.HoldsString(path, runtime.GOARCH, v)
				if err != nil || got != (v == want) {
					t.Errorf("%s, Version=%q: holdsString(%q) = %v, %v; want %v", mode, want, v, got, err, v == want)
				}
			}
		}
	}
}
