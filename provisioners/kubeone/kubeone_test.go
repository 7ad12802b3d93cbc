package kubeone

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
)

// fakeKubeOne writes an executable shell script standing in for kubeone.
func fakeKubeOne(t *testing.T, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "kubeone")
	if err := os.WriteFile(p, []byte("#!/bin/sh\n"+body+"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func manifestFor(p Paths) ([]byte, error) {
	return []byte("sshPrivateKeyFile: " + p.PrivateKey + "\n"), nil
}

func TestRun(t *testing.T) {
	// The script reports what KubeOne would find: its arguments, working
	// directory, the modes of the directory and the files, the key, and
	// whether an ssh-agent socket leaked into its environment.
	report := `echo "args=$*"; echo "pwd=$(pwd)"; echo "dirmode=$(stat -c %a .)"; ` +
		`echo "keymode=$(stat -c %a cluster_ed25519)"; echo "manifestmode=$(stat -c %a kubeone.yaml)"; ` +
		`echo "key=$(cat cluster_ed25519)"; echo "manifest=$(cat kubeone.yaml)"; echo "agent=${SSH_AUTH_SOCK:-none}"; ` +
		`[ -e cluster_ed25519-cert.pub ] && echo "cert=$(cat cluster_ed25519-cert.pub)"; echo oops >&2; `
	tests := []struct {
		name     string
		action   Action
		body     string
		secrets  Secrets
		wantCode int
		want     []string
	}{
		{"apply ok", Apply, report + "exit 0", Secrets{PrivateKey: []byte("PRIVATE")}, 0,
			[]string{
				"args=apply --manifest ",
				"--auto-approve",
				"dirmode=700",
				"keymode=600",
				"manifestmode=600",
				"key=PRIVATE",
				"manifest=sshPrivateKeyFile: ",
				"agent=none",
			}},
		{"reset fails", Reset, report + "exit 3", Secrets{PrivateKey: []byte("K")}, 3, []string{"args=reset --manifest "}},
		{
			"with certificate",
			Apply,
			report,
			Secrets{PrivateKey: []byte("K"), Certificate: []byte("CERT")},
			0,
			[]string{"cert=CERT"},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("SSH_AUTH_SOCK", "/tmp/agent.sock")
			work := filepath.Join(t.TempDir(), "runs")
			r, err := New(Config{Binary: fakeKubeOne(t, tc.body), WorkDir: work})
			if err != nil {
				t.Fatal(err)
			}
			var out, errOut testenv.SyncBuffer
			res, err := r.Run(context.Background(), tc.action, tc.secrets, manifestFor, &out, &errOut)
			if err != nil {
				t.Fatalf("Run: %v", err)
			}
			if res.ExitCode != tc.wantCode {
				t.Fatalf("exit code %d, want %d\n%s", res.ExitCode, tc.wantCode, out.String())
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			if errOut.String() != "oops\n" {
				t.Errorf("stderr %q, want the process's stderr", errOut.String())
			}
			entries, _ := os.ReadDir(work)
			if len(entries) != 0 {
				t.Errorf("run directory left behind (it holds the key): %v", entries)
			}
		})
	}
}

func TestRunRefuses(t *testing.T) {
	r, err := New(Config{Binary: filepath.Join(t.TempDir(), "no-kubeone"), WorkDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Run(context.Background(), Apply, Secrets{PrivateKey: []byte("k")},
		manifestFor, nil, nil); !errors.Is(err, ErrNoBinary) {
		t.Fatalf("missing binary: %v, want ErrNoBinary", err)
	}
	r.cfg.Binary = fakeKubeOne(t, "exit 0")
	if _, err := r.Run(context.Background(), "upgrade", Secrets{PrivateKey: []byte("k")},
		manifestFor, nil, nil); err == nil {
		t.Fatal("unknown action accepted")
	}
	if _, err := r.Run(context.Background(), Apply, Secrets{}, manifestFor, nil, nil); err == nil {
		t.Fatal("run without a key accepted")
	}
	bad := func(Paths) ([]byte, error) { return nil, errors.New("no such node") }
	if _, err := r.Run(context.Background(), Apply, Secrets{PrivateKey: []byte("k")}, bad, nil, nil); err == nil ||
		!strings.Contains(err.Error(), "no such node") {
		t.Fatalf("manifest error: %v", err)
	}
	if entries, _ := os.ReadDir(r.cfg.WorkDir); len(entries) != 0 {
		t.Errorf("run directory left behind after a failed render: %v", entries)
	}
}

// TestRunStop stops a run whose KubeOne ignores SIGTERM and has a child:
// both are gone when Run returns, which reports ErrStopped.
func TestRunStop(t *testing.T) {
	pids := filepath.Join(t.TempDir(), "pids")
	body := `trap '' TERM; sleep 300 & echo "$$ $!" > ` + pids + `; wait`
	r, err := New(Config{Binary: fakeKubeOne(t, body), WorkDir: t.TempDir(), StopGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	type result struct {
		res Result
		err error
	}
	done := make(chan result, 1)
	go func() {
		res, err := r.Run(ctx, Apply, Secrets{PrivateKey: []byte("k")}, manifestFor, nil, nil)
		done <- result{res, err}
	}()
	var got []int
	deadline := time.Now().Add(10 * time.Second)
	for len(got) < 2 {
		if time.Now().After(deadline) {
			t.Fatal("the fake kubeone did not start")
		}
		b, _ := os.ReadFile(pids)
		got = got[:0]
		for _, f := range strings.Fields(string(b)) {
			if n, err := strconv.Atoi(f); err == nil {
				got = append(got, n)
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	cancel()
	res := <-done
	if !errors.Is(res.err, ErrStopped) {
		t.Fatalf("stopped run: %v, want ErrStopped", res.err)
	}
	if res.res.ExitCode != -1 {
		t.Errorf("exit code %d, want -1 (killed)", res.res.ExitCode)
	}
	for _, pid := range got {
		// The leader is reaped by Wait; the child, orphaned, is dead once
		// killed even while init has yet to reap it.
		testenv.WaitProcessGone(t, pid, 10*time.Second)
	}
}

func TestCleanStale(t *testing.T) {
	work := t.TempDir()
	for _, d := range []string{"run-1", "run-2", "keep"} {
		if err := os.MkdirAll(filepath.Join(work, d), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	n, err := CleanStale(work)
	if err != nil || n != 2 {
		t.Fatalf("CleanStale: %d, %v; want 2", n, err)
	}
	if _, err := os.Stat(filepath.Join(work, "keep")); err != nil {
		t.Fatalf("removed a directory it did not create: %v", err)
	}
	if n, err := CleanStale(filepath.Join(work, "missing")); n != 0 || err != nil {
		t.Fatalf("missing work dir: %d, %v", n, err)
	}
}
