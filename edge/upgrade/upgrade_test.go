package upgrade

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// newNode is a node whose agent runs under a service manager the tests
// never ask to restart (those that do install a fake one).
func newNode(t *testing.T, version string) *Node {
	t.Helper()
	n := &Node{Dir: t.TempDir(), Version: version, Exe: "/bin/true", Log: testenv.Logger(t)}
	if err := n.SetManager(Manager{Kind: ManagerSystemd, Unit: "tether-edge-test-never-restarted.service"}); err != nil {
		t.Fatal(err)
	}
	return n
}

func TestOffer(t *testing.T) {
	bin := []byte("new agent")
	cases := []struct {
		name     string
		running  string
		offer    func(t *testing.T) upgradeproto.Offer
		step     upgradeproto.Step
		reason   string
		notFresh bool // offered twice: the second is compared
	}{
		{"agent upgrade", "v1.0.0",
			func(t *testing.T) upgradeproto.Offer { return testenv.AgentOffer(t, "edge-1.1", "v1.1.0", bin) },
			upgradeproto.StepDownloading, "", false},
		{"already there", "v1.1.0",
			func(t *testing.T) upgradeproto.Offer { return testenv.AgentOffer(t, "edge-1.1", "v1.1.0", bin) },
			upgradeproto.StepSkipped, "already at v1.1.0", false},
		{"downgrade refused", "v1.2.0",
			func(t *testing.T) upgradeproto.Offer { return testenv.AgentOffer(t, "edge-1.1", "v1.1.0", bin) },
			upgradeproto.StepFailed, "downgrade from v1.2.0 to v1.1.0 refused", false},
		{"downgrade allowed", "v1.2.0", func(t *testing.T) upgradeproto.Offer {
			o := testenv.AgentOffer(t, "edge-1.1", "v1.1.0", bin)
			o.AllowDowngrade = true
			return o
		}, upgradeproto.StepDownloading, "", false},
		{"confirmation", "v1.0.0", func(t *testing.T) upgradeproto.Offer {
			o := testenv.AgentOffer(t, "edge-1.1", "v1.1.0", bin)
			o.RequireConfirmation = true
			return o
		}, upgradeproto.StepAwaitingConfirmation, "", false},
		{"no service manager", "",
			func(t *testing.T) upgradeproto.Offer { return testenv.AgentOffer(t, "edge-1.1", "v1.1.0", bin) },
			upgradeproto.StepFailed, "the agent runs under no service manager that can restart it", false},
		{"bundle", "v1.0.0", func(t *testing.T) upgradeproto.Offer {
			return testenv.BundleOffer(t, "patch-42", "42", map[string][]byte{"install.sh": []byte("true")})
		}, upgradeproto.StepDownloading, "", true},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			n := newNode(t, c.running)
			if c.running == "" {
				n.Version = "v1.0.0"
				if err := n.SetManager(Manager{Kind: ManagerNone}); err != nil {
					t.Fatal(err)
				}
			}
			o := c.offer(t)
			s, err := n.Offer(o)
			if err != nil {
				t.Fatal(err)
			}
			if s.Step != c.step || !strings.Contains(s.Reason, c.reason) {
				t.Fatalf("step %s (%q), want %s (%q)", s.Step, s.Reason, c.step, c.reason)
			}
			again, err := n.Offer(o)
			if err != nil || again.Step != s.Step || len(again.History) != len(s.History) {
				t.Fatalf("the same offer again: %+v, %v; want the record as it was", again, err)
			}
			loaded, err := n.Load(o.Name)
			if err != nil || loaded.Step != c.step {
				t.Fatalf("persisted: %+v, %v", loaded, err)
			}
		})
	}
}

func TestOfferOtherDigest(t *testing.T) {
	n := newNode(t, "v1.0.0")
	if _, err := n.Offer(testenv.AgentOffer(t, "edge", "v1.1.0", []byte("a"))); err != nil {
		t.Fatal(err)
	}
	_, err := n.Offer(testenv.AgentOffer(t, "edge", "v1.1.0", []byte("b")))
	if err == nil || !strings.Contains(err.Error(), "a different digest") {
		t.Fatalf("another digest under a running name: %v, want refused", err)
	}
	if _, err := n.Cancel("edge"); err != nil {
		t.Fatal(err)
	}
	s, err := n.Offer(testenv.AgentOffer(t, "edge", "v1.1.0", []byte("b")))
	if err != nil || s.Step != upgradeproto.StepDownloading ||
		s.Digest != upgradeproto.DigestOf(testenv.AgentOffer(t, "x", "v1.1.0", []byte("b")).Index) {
		t.Fatalf("after cancel: %+v, %v", s, err)
	}
	other := testenv.AgentOffer(t, "edge3", "v1.1.0", []byte("a"))
	var ix upgradeproto.OCIIndex
	_ = json.Unmarshal(other.Index, &ix)
	ix.Manifests[0].Platform.Architecture = "other-arch"
	other.Index, _ = json.Marshal(ix)
	other.Digest = upgradeproto.DigestOf(other.Index)
	if _, err := n.Offer(other); err == nil || !strings.Contains(err.Error(), "no agent for") {
		t.Fatalf("offer for another platform: %v", err)
	}
	bad := testenv.AgentOffer(t, "edge2", "v1.1.0", []byte("a"))
	bad.Digest = upgradeproto.DigestOf([]byte("other"))
	if _, err := n.Offer(bad); err == nil || !strings.Contains(err.Error(), "digest mismatch") {
		t.Fatalf("offer whose index is not the pinned digest: %v", err)
	}
}

// A file that does not hash to its manifest digest fails the upgrade with
// the exact reason, runs nothing, and leaves nothing of it on disk.
func TestApplyDigestMismatch(t *testing.T) {
	for _, kind := range []string{"bundle", "agent"} {
		t.Run(kind, func(t *testing.T) {
			n := newNode(t, "v1.0.0")
			marker := filepath.Join(t.TempDir(), "ran")
			good := []byte("touch " + marker + "\n")
			var o upgradeproto.Offer
			if kind == "bundle" {
				o = testenv.BundleOffer(t, "patch", "1", map[string][]byte{"install.sh": good})
			} else {
				o = testenv.AgentOffer(t, "edge", "v1.1.0", good)
			}
			if _, err := n.Offer(o); err != nil {
				t.Fatal(err)
			}
			testenv.UploadUpgradeFiles(t, n.Dir, o.Name, good)
			p := filepath.Join(upgradeproto.IncomingDir(n.Dir, o.Name), upgradeproto.DigestHex(upgradeproto.DigestOf(good)))
			evil := []byte("echo pwned > " + marker + "\n")
			if err := os.WriteFile(p, evil, 0o600); err != nil {
				t.Fatal(err)
			}
			s, err := n.Apply(context.Background(), o.Name, "")
			if err != nil {
				t.Fatal(err)
			}
			want := "digest mismatch (want " + upgradeproto.DigestOf(good) + ", got " + upgradeproto.DigestOf(evil) + ")"
			if s.Step != upgradeproto.StepFailed || s.Reason != want {
				t.Fatalf("%s %q, want failed %q", s.Step, s.Reason, want)
			}
			if _, err := os.Stat(marker); err == nil {
				t.Fatal("the tampered file ran")
			}
			for _, d := range []string{
				upgradeproto.IncomingDir(n.Dir, o.Name), n.stageDir(o.Name), filepath.Join(n.agentDir(), "versions", "v1.1.0"),
			} {
				if _, err := os.Stat(d); err == nil {
					t.Errorf("%s left on disk", d)
				}
			}
		})
	}
}

func TestApplyBundle(t *testing.T) {
	cases := []struct {
		name    string
		files   map[string]string
		step    upgradeproto.Step
		reason  string
		ran     []string // markers the scripts leave
		timeout time.Duration
	}{
		{
			"install only",
			map[string]string{"install.sh": `touch installed; cat "$TETHER_UPGRADE_DIR/payload.txt" >&2`},
			upgradeproto.StepSucceeded,
			"",
			[]string{"installed"},
			0,
		},
		{
			"install fails",
			map[string]string{"install.sh": "exit 4", "rollback.sh": "touch rolled"},
			upgradeproto.StepFailed,
			"install.sh exited with status 4",
			nil,
			0,
		},
		{
			"health ok",
			map[string]string{"install.sh": "touch installed", "health.sh": "test -f $OUT/installed"},
			upgradeproto.StepSucceeded,
			"",
			[]string{"installed"},
			0,
		},
		{
			"health fails, rollback",
			map[string]string{"install.sh": "touch installed", "health.sh": "exit 2", "rollback.sh": "touch rolled"},
			upgradeproto.StepRolledBack,
			"health.sh exited with status 2; rollback.sh ran",
			[]string{"installed", "rolled"},
			0,
		},
		{
			"health fails, no rollback",
			map[string]string{"install.sh": "true", "health.sh": "exit 2"},
			upgradeproto.StepFailed,
			"health.sh exited with status 2 (the bundle has no rollback.sh)",
			nil,
			0,
		},
		{
			"rollback fails",
			map[string]string{"install.sh": "true", "health.sh": "exit 2", "rollback.sh": "exit 5"},
			upgradeproto.StepFailed,
			"health.sh exited with status 2; rollback.sh exited with status 5",
			nil,
			0,
		},
		{
			"install times out",
			map[string]string{"install.sh": "sleep 60"},
			upgradeproto.StepFailed,
			"install.sh timed out after 300ms",
			nil,
			300 * time.Millisecond,
		},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			out := t.TempDir()
			t.Setenv("OUT", out)
			n := newNode(t, "v1")
			var stderr strings.Builder
			n.Stderr, n.ScriptTimeout = &stderr, c.timeout
			files := map[string][]byte{"payload.txt": []byte("payload here")}
			for f, body := range c.files {
				files[f] = []byte("cd \"$OUT\"\n" + body + "\n")
			}
			o := testenv.BundleOffer(t, "b", "7", files)
			if _, err := n.Offer(o); err != nil {
				t.Fatal(err)
			}
			var up [][]byte
			for _, b := range files {
				up = append(up, b)
			}
			testenv.UploadUpgradeFiles(t, n.Dir, "b", up...)
			s, err := n.Apply(context.Background(), "b", "")
			if err != nil {
				t.Fatal(err)
			}
			if s.Step != c.step || s.Reason != c.reason {
				t.Fatalf("%s %q, want %s %q\n%s", s.Step, s.Reason, c.step, c.reason, stderr.String())
			}
			for _, m := range c.ran {
				if _, err := os.Stat(filepath.Join(out, m)); err != nil {
					t.Errorf("marker %s: %v", m, err)
				}
			}
			if c.name == "install only" && !strings.Contains(stderr.String(), "payload here") {
				t.Errorf("script output not on stderr: %q", stderr.String())
			}
		})
	}
}

func TestApplyNeedsConfirmation(t *testing.T) {
	n := newNode(t, "v1")
	install := []byte("true\n")
	o := testenv.BundleOffer(t, "b", "7", map[string][]byte{"install.sh": install})
	o.RequireConfirmation = true
	if _, err := n.Offer(o); err != nil {
		t.Fatal(err)
	}
	testenv.UploadUpgradeFiles(t, n.Dir, "b", install)
	if _, err := n.Apply(context.Background(), "b", ""); err == nil ||
		!strings.Contains(err.Error(), "waits for confirmation") {
		t.Fatalf("apply without confirmation: %v", err)
	}
	s, err := n.Apply(context.Background(), "b", "alice")
	if err != nil || s.Step != upgradeproto.StepSucceeded || s.ConfirmedBy != "alice" {
		t.Fatalf("%+v, %v", s, err)
	}
}

func TestRecoverBundles(t *testing.T) {
	n := newNode(t, "v1")
	s := &State{
		Name:      "b",
		Kind:      upgradeproto.KindBundle,
		Digest:    upgradeproto.DigestOf(nil),
		ToVersion: "1",
		Step:      upgradeproto.StepPending,
	}
	for _, st := range []upgradeproto.Step{
		upgradeproto.StepDownloading, upgradeproto.StepVerifying, upgradeproto.StepInstalling,
	} {
		if err := s.Move(st, "", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.MkdirAll(n.recordDir("b"), 0o700); err != nil {
		t.Fatal(err)
	}
	if err := n.save(s); err != nil {
		t.Fatal(err)
	}
	if got := n.RecoverBundles(); len(got) != 1 || got[0].Step != upgradeproto.StepFailed ||
		!strings.Contains(got[0].Reason, "interrupted in installing") {
		t.Fatalf("%+v", got)
	}
}

func FuzzDecodeState(f *testing.F) {
	s := State{
		Name:      "edge-1.4",
		Kind:      upgradeproto.KindAgent,
		Digest:    upgradeproto.DigestOf(nil),
		ToVersion: "v1.4.0",
		Step:      upgradeproto.StepPending,
	}
	_ = s.Move(upgradeproto.StepDownloading, "", time.Unix(0, 0))
	b, _ := json.Marshal(s)
	f.Add(b)
	f.Add([]byte(`{"name":"x","kind":"bundle","digest":"sha256:","step":"nope"}`))
	f.Add([]byte(`{}{}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodeState(b, "")
		if err != nil {
			return
		}
		if err := s.Validate(); err != nil {
			t.Fatalf("decoded a record that does not validate: %v", err)
		}
		again, err := json.Marshal(s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodeState(again, s.Name); err != nil {
			t.Fatalf("re-encoded record rejected: %v", err)
		}
	})
}

// An agent upgrade needs something that can restart the agent: without
// one it fails with the reason, and nothing is switched or left staged.
func TestApplyAgentNeedsManager(t *testing.T) {
	n := newNode(t, "v1.0.0")
	bin := []byte("#!/bin/sh\n")
	o := testenv.AgentOffer(t, "edge", "v1.1.0", bin)
	if _, err := n.Offer(o); err != nil {
		t.Fatal(err)
	}
	testenv.UploadUpgradeFiles(t, n.Dir, "edge", bin)
	if err := n.SetManager(Manager{Kind: ManagerSupervisor, PID: 999999999}); err != nil {
		t.Fatal(err)
	}
	s, err := n.Apply(context.Background(), "edge", "")
	if err != nil || s.Step != upgradeproto.StepFailed ||
		s.Reason != "the agent's supervisor (pid 999999999) is not running" {
		t.Fatalf("%s %q, %v", s.Step, s.Reason, err)
	}
	if n.CurrentExe() != "" {
		t.Fatal("switched")
	}
	if _, err := os.Stat(n.stageDir("edge")); err == nil {
		t.Fatal("stage left")
	}
}

// A bundle whose apply was cut short (hub connection lost, apply killed)
// fails as interrupted when the hub drives it again.
func TestApplyInterruptedBundle(t *testing.T) {
	n := newNode(t, "v1")
	install := []byte("true\n")
	o := testenv.BundleOffer(t, "b", "7", map[string][]byte{"install.sh": install})
	if _, err := n.Offer(o); err != nil {
		t.Fatal(err)
	}
	if _, err := n.update("b", func(s *State) error {
		for _, st := range []upgradeproto.Step{upgradeproto.StepVerifying, upgradeproto.StepInstalling} {
			if err := n.move(s, st, ""); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	again, err := n.Offer(o)
	if err != nil || again.Step != upgradeproto.StepInstalling {
		t.Fatalf("offer again: %+v %v", again, err)
	}
	s, err := n.Apply(context.Background(), "b", "")
	if err != nil || s.Step != upgradeproto.StepFailed ||
		s.Reason != "interrupted in installing (the node restarted or the apply was killed); "+
			"the script's outcome is unknown" {
		t.Fatalf("%s %q %v", s.Step, s.Reason, err)
	}
}
