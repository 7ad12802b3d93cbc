package edge

import (
	"encoding/json"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/tether-dev/tether/edge/upgrade"
	"github.com/tether-dev/tether/tunnel/control"
	"github.com/tether-dev/tether/tunnel/upgradeproto"
	"github.com/tether-dev/tether/tunnel/uplink"
)

// After a welcome, the agent marks its own upgrade healthy first, then
// reports every record to a hub that takes them, then each change; a hub
// without the capability gets none.
func TestUpgradeSession(t *testing.T) {
	dir := t.TempDir()
	n := &upgrade.Node{Dir: dir, Version: Version, Exe: "/usr/bin/tether-edge"}
	waiting := upgrade.State{Name: "patch", Kind: upgradeproto.KindBundle, Digest: upgradeproto.DigestOf(nil),
		ToVersion: "2", Step: upgradeproto.StepPending}
	ours := upgrade.State{Name: "edge", Kind: upgradeproto.KindAgent, Digest: upgradeproto.DigestOf([]byte("x")),
		ToVersion: Version, Step: upgradeproto.StepPending}
	_ = waiting.Move(upgradeproto.StepAwaitingConfirmation, "", time.Now())
	for _, st := range []upgradeproto.Step{
		upgradeproto.StepDownloading, upgradeproto.StepVerifying, upgradeproto.StepInstalling, upgradeproto.StepHealthCheck,
	} {
		if err := ours.Move(st, "", time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []upgrade.State{waiting, ours} {
		if err := os.MkdirAll(filepath.Join(dir, "upgrades", s.Name), 0o700); err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(s)
		if err := os.WriteFile(filepath.Join(dir, "upgrades", s.Name, "state.json"), b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		name string
		caps []string
		want int // records reported
	}{{"hub without upgrades", nil, 0}, {"hub with upgrades", []string{upgradeproto.HubCapUpgrades}, 2}} {
		t.Run(c.name, func(t *testing.T) {
			a := &Agent{cfg: Config{Upgrade: n}, log: slog.New(slog.DiscardHandler)}
			hubEnd, agentEnd := net.Pipe()
			defer hubEnd.Close()
			s := &session{a: a, conn: uplink.NewControlConn(pipeStream{agentEnd}, hubPeer, a.log), log: a.log}
			got := make(chan *control.Message, 4)
			go func() {
				for {
					m, err := control.Read(hubEnd)
					if err != nil {
						close(got)
						return
					}
					got <- m
				}
			}()
			clear := a.upgradeSession(s, &control.Welcome{Capabilities: c.caps})
			if st, _ := n.Load("edge"); st.Step != upgradeproto.StepSucceeded {
				t.Fatalf("own upgrade: %s, want succeeded after the welcome", st.Step)
			}
			a.reportUpgrades([]upgrade.State{waiting})
			clear()
			a.reportUpgrades([]upgrade.State{waiting}) // after the session: not sent
			agentEnd.Close()
			var msgs []*control.Message
			for m := range got {
				msgs = append(msgs, m)
			}
			if c.want == 0 {
				if len(msgs) != 0 {
					t.Fatalf("sent %d messages to a hub without upgrades", len(msgs))
				}
				return
			}
			if len(msgs) != 2 || msgs[0].Type != upgradeproto.TypeState || len(msgs[0].UpgradeStates) != c.want ||
				len(msgs[1].UpgradeStates) != 1 {
				t.Fatalf("messages %+v", msgs)
			}
			for _, st := range msgs[0].UpgradeStates {
				if st.Name == "edge" && st.Step != upgradeproto.StepSucceeded {
					t.Fatalf("reported %s before the health mark", st.Step)
				}
			}
		})
	}
	// The hello announces the updater.
	a := &Agent{cfg: Config{Upgrade: n}, id: &Identity{}, log: slog.New(slog.DiscardHandler)}
	h := (&session{a: a, log: a.log}).hello().Hello
	if h.Upgrade == nil || h.Upgrade.Exe != "/usr/bin/tether-edge" ||
		!slices.Contains(h.Capabilities, upgradeproto.CapUpgrade) {
		t.Fatalf("hello %+v %v", h.Upgrade, h.Capabilities)
	}
}
