package store

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/tether-dev/tether/tunnel/upgradeproto"
)

// migrationUpgradesVersion is the schema version that adds upgrades and
// the roles' confirm permission (renumbered at merges: keep it here only).
const migrationUpgradesVersion = 13

func testUpgrade(name string) Upgrade {
	at := time.Now().UTC().Truncate(time.Millisecond)
	return Upgrade{Name: name, Kind: upgradeproto.KindBundle, Reference: "oci://r/x:1",
		Digest: "sha256:" + strings.Repeat("a", 64), Version: "1",
		Pinned: []byte(`{"digest":"x"}`), Spec: UpgradeSpec{
			Batch:                "10%",
			Canary:               1,
			FailureTolerance:     "5%",
			RequireConfirmation:  true,
			HealthTimeoutSeconds: 60,
		},
		State: UpgradeRunning, CreatedBy: "admin", CreatedAt: at, UpdatedAt: at}
}

// The hub's view of each node's state machine survives a restart: each
// step with its time and reason, who confirmed, the rollout's state.
func TestUpgradesPersist(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		path := b.newLoc(t)
		s, err := b.open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		n1 := addNode(t, s, "id-1", "n1")
		addNode(t, s, "id-2", "n2")
		u := testUpgrade("edge-1.4")
		at := u.CreatedAt
		nodes := []UpgradeNode{
			{
				NodeID:    n1.ID,
				Node:      "n1",
				Batch:     0,
				Step:      upgradeproto.StepPending,
				History:   []upgradeproto.Transition{{Step: upgradeproto.StepPending, At: at}},
				UpdatedAt: at,
			},
			{NodeID: "id-2", Node: "n2", Batch: 1, Step: upgradeproto.StepPending, UpdatedAt: at},
		}
		if err := s.CreateUpgrade(ctx, u, nodes); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateUpgrade(ctx, u, nil); !errors.Is(err, ErrNameTaken) {
			t.Errorf("same name again: %v", err)
		}
		noDigest := testUpgrade("nodigest")
		noDigest.Digest = ""
		if err := s.CreateUpgrade(ctx, noDigest, nil); err == nil {
			t.Error("an upgrade without a digest was stored")
		}
		n := nodes[0]
		n.Upgrade, n.Step, n.Reason, n.ConfirmedBy, n.JobID = "edge-1.4", upgradeproto.StepFailed,
			"digest mismatch (want a, got b)", "operator:alice", "job1"
		n.History = append(n.History, upgradeproto.Transition{
			Step: upgradeproto.StepFailed, At: at.Add(time.Second), Reason: n.Reason,
		})
		if err := s.PutUpgradeNode(ctx, n); err != nil {
			t.Fatal(err)
		}
		if err := s.SetUpgradeState(ctx, "edge-1.4", UpgradeHalted, "1 of 2 failed", at); err != nil {
			t.Fatal(err)
		}
		if err := s.SetUpgradeFetched(ctx, "edge-1.4"); err != nil {
			t.Fatal(err)
		}
		if err := s.PutUpgradeNode(ctx, UpgradeNode{
			Upgrade: "edge-1.4", NodeID: "gone", Node: "x",
		}); !errors.Is(err, ErrNotFound) {
			t.Errorf("put of a node not in the upgrade: %v", err)
		}
		s.Close()

		s, err = b.open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		got, err := s.GetUpgrade(ctx, "edge-1.4")
		if err != nil {
			t.Fatal(err)
		}
		if got.State != UpgradeHalted || got.Reason != "1 of 2 failed" || !got.Fetched || got.Digest != u.Digest ||
			got.Spec.Batch != "10%" || !got.Spec.RequireConfirmation || string(got.Pinned) != `{"digest":"x"}` {
			t.Errorf("upgrade after reopen: %+v", got)
		}
		ns, err := s.ListUpgradeNodes(ctx, "edge-1.4")
		if err != nil || len(ns) != 2 {
			t.Fatalf("nodes %v %v", ns, err)
		}
		if g := ns[0]; g.Step != upgradeproto.StepFailed || g.ConfirmedBy != "operator:alice" || len(g.History) != 2 ||
			g.History[1].Reason != "digest mismatch (want a, got b)" || !g.History[1].At.Equal(at.Add(time.Second)) ||
			g.JobID != "job1" {
			t.Errorf("node after reopen: %+v", g)
		}
		of, err := s.UpgradeNodesOf(ctx, "id-2")
		if err != nil || len(of) != 1 || of[0].Upgrade != "edge-1.4" || of[0].Batch != 1 {
			t.Errorf("nodes of id-2: %+v %v", of, err)
		}
		list, err := s.ListUpgrades(ctx)
		if err != nil || len(list) != 1 {
			t.Errorf("list %v %v", list, err)
		}
	})
}

// The migration keeps every role, none of which may confirm until given
// the permission.
func TestUpgradesMigrationRoles(t *testing.T) {
	ctx := context.Background()
	path := dataDirAt(t, migrationUpgradesVersion-1,
		`INSERT INTO roles (name, nodes, logins, forwarding) VALUES ('ops', 'site=lab', '["root"]', 1)`)
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	roles, err := s.ListRoles(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, r := range roles {
		if r.Confirm {
			t.Errorf("role %s may confirm after the migration", r.Name)
		}
	}
	if err := s.PutRole(ctx, Role{Name: "ops", Nodes: "site=lab", Logins: []string{"root"}, Confirm: true}); err != nil {
		t.Fatal(err)
	}
	roles, _ = s.ListRoles(ctx)
	for _, r := range roles {
		if r.Name == "ops" && !r.Confirm {
			t.Error("confirm not stored")
		}
	}
}
