package main

import (
	"context"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/edge/upgrade"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// captureStdout runs f with os.Stdout going to a pipe and returns what it
// wrote.
func captureStdout(t *testing.T, f func() error) (string, error) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	old := os.Stdout
	os.Stdout = w
	defer func() { os.Stdout = old }()
	done := make(chan string)
	go func() {
		b, _ := io.ReadAll(r)
		done <- string(b)
	}()
	ferr := f()
	w.Close()
	return <-done, ferr
}

// TestUpgradeStatusOutput: `upgrade status` prints JSON by default (what
// the hub reads) and with -o json, a table with -o text, and refuses other
// formats naming the flag.
func TestUpgradeStatusOutput(t *testing.T) {
	dir := t.TempDir()
	for _, tc := range []struct {
		args      []string
		want, err string
	}{
		{nil, "[]\n", ""},
		{[]string{"-o", "json"}, "[]\n", ""},
		{[]string{"--output=json"}, "[]\n", ""},
		{[]string{"-o", "text"}, "no upgrade records on this node\n", ""},
		{[]string{"-o", "yaml"}, "", `--output "yaml": want json or text`},
	} {
		t.Run(strings.Join(tc.args, " "), func(t *testing.T) {
			args := append([]string{"upgrade", "status", "--state-dir", dir}, tc.args...)
			out, err := captureStdout(t, func() error {
				return newRoot().Execute(context.Background(), args, io.Discard)
			})
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || out != tc.want {
				t.Fatalf("got %q, %v; want %q", out, err, tc.want)
			}
		})
	}
}

func TestPrintUpgrades(t *testing.T) {
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.Local)
	var b strings.Builder
	printUpgrades(&b, []upgrade.State{
		{Name: "edge-1.1", Kind: upgradeproto.KindAgent, FromVersion: "1.0.0", ToVersion: "1.1.0",
			Step: upgradeproto.StepFailed, Reason: "digest mismatch (want sha256:a, got sha256:b)", UpdatedAt: at},
		{
			Name:      "pkgs",
			Kind:      upgradeproto.KindBundle,
			ToVersion: "7",
			Step:      upgradeproto.StepAwaitingConfirmation,
			UpdatedAt: at,
		},
	})
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	want := [][]string{
		{"NAME", "KIND", "VERSION", "STEP", "UPDATED", "REASON"},
		{"edge-1.1", "agent", "1.0.0", "->", "1.1.0", "failed", at.Format(time.RFC3339), "digest", "mismatch"},
		{"pkgs", "bundle", "-", "->", "7", "awaiting_confirmation", at.Format(time.RFC3339), "-"},
	}
	if len(lines) != len(want) {
		t.Fatalf("table:\n%s", b.String())
	}
	for i, w := range want {
		if f := strings.Fields(lines[i]); len(f) < len(w) || strings.Join(f[:len(w)], " ") != strings.Join(w, " ") {
			t.Errorf("row %d = %q, want it to start with %q", i, lines[i], w)
		}
	}
}
