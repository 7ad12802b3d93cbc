package upgrade

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// fakeConn plays the node-side updater: answers[verb] is its stdout.
type fakeConn struct {
	answers map[string]string
	codes   map[string]int
	lines   []string
	uploads map[string][]byte
	corrupt bool
}

func (c *fakeConn) Run(_ context.Context, line string, script []byte, stdout, stderr io.Writer) (int, error) {
	if script != nil {
		line = string(script)
	}
	c.lines = append(c.lines, line)
	for _, verb := range []string{"offer", "apply", "status", "cancel"} {
		if strings.Contains(line, " upgrade "+verb+" ") {
			fmt.Fprint(stderr, "log of "+verb+"\n")
			fmt.Fprint(stdout, c.answers[verb])
			return c.codes[verb], nil
		}
	}
	return 127, nil
}

func (c *fakeConn) Upload(_ context.Context, src io.Reader, size int64, dst string) (string, error) {
	b, err := io.ReadAll(src)
	if err != nil {
		return "", err
	}
	if c.corrupt {
		b = append(b, 'x')
	}
	c.uploads[dst] = b
	s := sha256.Sum256(b)
	return hex.EncodeToString(s[:]), nil
}

func answer(t *testing.T, step upgradeproto.Step, reason string) string {
	t.Helper()
	b, err := json.Marshal(upgradeproto.NodeState{
		Name:      "u1",
		Kind:      upgradeproto.KindBundle,
		Digest:    "sha256:" + strings.Repeat("a", 64),
		ToVersion: "2",
		Step:      step,
		Reason:    reason,
	})
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestDrive(t *testing.T) {
	payload := []byte("#!/bin/sh\necho hi\n")
	sum := sha256.Sum256(payload)
	digest := "sha256:" + hex.EncodeToString(sum[:])
	files := []upgradeproto.File{{Name: "install.sh", Digest: digest, Size: int64(len(payload))}}
	open := func(h string) (io.ReadCloser, int64, error) {
		if h != hex.EncodeToString(sum[:]) {
			return nil, 0, errors.New("no such blob")
		}
		return io.NopCloser(bytes.NewReader(payload)), int64(len(payload)), nil
	}
	for _, tc := range []struct {
		name        string
		offer       string
		apply       string
		applyCode   int
		by          string
		corrupt     bool
		wantStep    upgradeproto.Step
		wantErr     string
		wantApplied bool
		wantPushed  bool
	}{
		{
			name:        "installed",
			offer:       answer(t, upgradeproto.StepPending, ""),
			apply:       answer(t, upgradeproto.StepSucceeded, ""),
			wantStep:    upgradeproto.StepSucceeded,
			wantApplied: true,
			wantPushed:  true,
		},
		{
			name:        "refused by the node",
			offer:       answer(t, upgradeproto.StepPending, ""),
			apply:       answer(t, upgradeproto.StepFailed, "digest mismatch (want a, got b)"),
			applyCode:   1,
			wantStep:    upgradeproto.StepFailed,
			wantApplied: true,
			wantPushed:  true,
		},
		{
			name:       "waits for a person",
			offer:      answer(t, upgradeproto.StepAwaitingConfirmation, ""),
			wantStep:   upgradeproto.StepAwaitingConfirmation,
			wantPushed: true,
		},
		{
			name:        "confirmed on the hub",
			offer:       answer(t, upgradeproto.StepAwaitingConfirmation, ""),
			by:          "operator:alice",
			apply:       answer(t, upgradeproto.StepInstalling, ""),
			wantStep:    upgradeproto.StepInstalling,
			wantApplied: true,
			wantPushed:  true,
		},
		{name: "node had it already", offer: answer(t, upgradeproto.StepSucceeded, ""), wantStep: upgradeproto.StepSucceeded},
		{name: "no updater", offer: "", wantErr: "node-side updater failed"},
		{name: "garbage answer", offer: `{"name":"../x","step":"pending"}`, wantErr: "bad state"},
		{
			name:       "corrupted in transit",
			offer:      answer(t, upgradeproto.StepPending, ""),
			corrupt:    true,
			wantErr:    "digest mismatch",
			wantPushed: true,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := &fakeConn{
				answers: map[string]string{"offer": tc.offer, "apply": tc.apply},
				codes:   map[string]int{"apply": tc.applyCode, "offer": 0},
				uploads: map[string][]byte{},
				corrupt: tc.corrupt,
			}
			if tc.offer == "" {
				c.codes["offer"] = 127
			}
			n := Node{Conn: c, Exe: "/usr/local/bin/tether-edge", StateDir: "/var/lib/tether-edge"}
			var log bytes.Buffer
			st, sent, err := n.Drive(context.Background(), upgradeproto.Offer{
				Name:   "u1",
				Kind:   upgradeproto.KindBundle,
				Digest: "sha256:" + strings.Repeat("a", 64),
			}, files, open, tc.by, &log, nil)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err %v, want %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatal(err)
			} else if st.Step != tc.wantStep {
				t.Errorf("step %s, want %s", st.Step, tc.wantStep)
			}
			applied := strings.Contains(strings.Join(c.lines, "\n"), " upgrade apply ")
			if applied != tc.wantApplied {
				t.Errorf("applied %t, want %t: %q", applied, tc.wantApplied, c.lines)
			}
			dst := "/var/lib/tether-edge/upgrades/u1/incoming/" + hex.EncodeToString(sum[:])
			if _, pushed := c.uploads[dst]; pushed != tc.wantPushed {
				t.Errorf("pushed %t, want %t (%v)", pushed, tc.wantPushed, c.uploads)
			}
			if tc.wantPushed && !tc.corrupt && sent != int64(len(payload)) {
				t.Errorf("sent %d", sent)
			}
			if tc.by != "" && !strings.Contains(strings.Join(c.lines, "\n"), "'--confirmed-by' 'operator:alice'") {
				t.Errorf("apply without the confirmer: %q", c.lines)
			}
			if tc.offer != "" && !strings.Contains(log.String(), "log of offer") {
				t.Errorf("log %q", log.String())
			}
		})
	}
}

// The offer reaches the updater on stdin through a here-document that no
// offer can end early, and names are quoted.
func TestOfferScript(t *testing.T) {
	c := &fakeConn{
		answers: map[string]string{"offer": answer(t, upgradeproto.StepPending, "")},
		codes:   map[string]int{},
		uploads: map[string][]byte{},
	}
	n := Node{Conn: c, Exe: "/opt/it's/tether-edge", StateDir: "/var/lib/tether-edge"}
	if _, err := n.Offer(context.Background(), upgradeproto.Offer{
		Name: "u1", Manifest: []byte("{\n}"),
	}, io.Discard); err != nil {
		t.Fatal(err)
	}
	s := c.lines[0]
	if !strings.Contains(s,
		`exec '/opt/it'\''s/tether-edge' upgrade offer --state-dir '/var/lib/tether-edge' <<'TETHER_UPGRADE_OFFER'`) {
		t.Errorf("script %q", s)
	}
	if strings.Count(s, "\n") != 4 {
		t.Errorf("the offer is not one line in %q", s)
	}
	if _, err := (Node{
		Conn: c, Exe: "tether-edge", StateDir: "/x",
	}).Offer(context.Background(), upgradeproto.Offer{}, io.Discard); !errors.Is(err, ErrUpdater) {
		t.Errorf("relative exe: %v", err)
	}
}

// FuzzAnswer: whatever a node answers, Drive returns an error or a valid
// state, and never panics.
func FuzzAnswer(f *testing.F) {
	f.Add(`{"name":"u1","kind":"bundle","digest":"sha256:` + strings.Repeat("a", 64) +
		`","to_version":"2","step":"succeeded"}`)
	f.Add(`{"name":"u1","kind":"agent","step":"nope"}`)
	f.Add(`[]`)
	f.Add(`{"history":[{"step":"x"}]}`)
	f.Fuzz(func(t *testing.T, ans string) {
		c := &fakeConn{
			answers: map[string]string{"offer": ans, "apply": ans},
			codes:   map[string]int{},
			uploads: map[string][]byte{},
		}
		n := Node{Conn: c, Exe: "/bin/e", StateDir: "/s"}
		st, _, err := n.Drive(context.Background(), upgradeproto.Offer{Name: "u1"}, nil, nil, "", io.Discard, nil)
		if err == nil {
			if verr := st.Validate(); verr != nil {
				t.Fatalf("accepted an invalid state: %v", verr)
			}
		}
	})
}
