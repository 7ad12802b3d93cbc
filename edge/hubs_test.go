package edge

import (
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"testing"

	"github.com/tether-dev/tether/tunnel/control"
)

// TestHubOrderAcrossAttempts: the hub the agent was connected to is dialed
// first again; after a hub answered but the handshake failed the next hub
// is; a dial that reached no hub changes nothing.
func TestHubOrderAcrossAttempts(t *testing.T) {
	a := &Agent{id: &Identity{Config: NodeConfig{Hubs: []string{"a:1", "b:1", "c:1"}}}}
	for _, step := range []struct {
		name      string
		connected bool
		state     State  // where the attempt stopped
		hub       string // the hub of the last connected session
		want      []string
	}{
		{"connected to b", true, StateConnected, "b:1", []string{"b:1", "a:1", "c:1"}},
		{"no hub answered", false, StateConnecting, "b:1", []string{"b:1", "a:1", "c:1"}},
		{"a hub refused the handshake", false, StateHandshaking, "b:1", []string{"a:1", "c:1", "b:1"}},
		{"again", false, StateHandshaking, "b:1", []string{"c:1", "b:1", "a:1"}},
		{"connected to a", true, StateConnected, "a:1", []string{"a:1", "c:1", "b:1"}},
	} {
		a.state, a.status.Hub = step.state, step.hub
		a.attemptEnded(step.connected)
		if !slices.Equal(a.id.Config.Hubs, step.want) {
			t.Fatalf("%s: hubs %v, want %v", step.name, a.id.Config.Hubs, step.want)
		}
	}
}

// TestLearnHubs: addresses a welcome announces are added and kept in
// node.json; a welcome with nothing new writes nothing.
func TestLearnHubs(t *testing.T) {
	dir := t.TempDir()
	a := &Agent{cfg: Config{StateDir: dir}, log: slog.New(slog.DiscardHandler),
		id: &Identity{Config: NodeConfig{NodeID: "id", Name: "n1", Hubs: []string{"a:1"}}}}
	path := filepath.Join(dir, configFile)

	a.learnHubs(&control.Welcome{NodeID: "id"}) // no replicas
	a.learnHubs(&control.Welcome{NodeID: "id", Hubs: []string{"a:1"}})
	if _, err := os.Stat(path); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("node.json written for a welcome with nothing new: %v", err)
	}
	a.learnHubs(&control.Welcome{NodeID: "id", Hubs: []string{"a:1", "b:1", "not an address"}})
	want := []string{"a:1", "b:1"}
	if !slices.Equal(a.id.Config.Hubs, want) {
		t.Fatalf("hubs %v, want %v", a.id.Config.Hubs, want)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var kept NodeConfig
	if err := json.Unmarshal(b, &kept); err != nil || !slices.Equal(kept.Hubs, want) || kept.Name != "n1" {
		t.Fatalf("node.json %s (%v), want the node with hubs %v", b, err, want)
	}
}
