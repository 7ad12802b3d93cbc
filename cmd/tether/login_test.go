package main

import (
	"path/filepath"
	"testing"

	"github.com/tether-dev/tether/pki/ca"
)

// TestPrivateKeyFlagName: every command that takes the operator's private
// key names the flag --identity-file (ssh's -i); login's first name, --key,
// still sets it for scripts but is hidden and deprecated.
func TestPrivateKeyFlagName(t *testing.T) {
	for _, path := range [][]string{{"login"}, {"config", "ssh"}, {"inventory"}, {"onboard", "bulk"}} {
		c, _, err := newRoot().Find(path)
		if err != nil {
			t.Fatalf("%v: %v", path, err)
		}
		if c.Flags().Lookup("identity-file") == nil {
			t.Errorf("%s has no --identity-file", c.CommandPath())
		}
	}
	login, _, _ := newRoot().Find([]string{"login"})
	key := login.Flags().Lookup("key")
	if key == nil || !key.Hidden || key.Deprecated == "" {
		t.Fatalf("login --key: %+v; want a hidden, deprecated alias", key)
	}
	for _, args := range [][]string{{"--key", "/k"}, {"--identity-file", "/k"}, {"-i", "/k"}} {
		login, _, _ := newRoot().Find([]string{"login"})
		if err := login.ParseFlags(args); err != nil {
			t.Fatalf("login %v: %v", args, err)
		}
		if got := login.Flags().Lookup("identity-file").Value.String(); got != "/k" {
			t.Errorf("login %v: --identity-file is %q, want /k", args, got)
		}
	}
}

// TestCAPin: the pin printed is the one join strings carry.
func TestCAPin(t *testing.T) {
	dir := t.TempDir()
	c, err := ca.LoadOrCreate(dir, "Tether")
	if err != nil {
		t.Fatal(err)
	}
	got, err := caPin(filepath.Join(dir, ca.CertFile))
	if err != nil || got != "sha256:"+c.Pin() {
		t.Fatalf("caPin = %q, %v; want sha256:%s", got, err, c.Pin())
	}
	if _, err := caPin(filepath.Join(dir, "missing.crt")); err == nil {
		t.Fatal("caPin of a missing file succeeded")
	}
}
