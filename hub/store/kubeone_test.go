package store

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"
)

// kubeOneSchemaVersion is the schema version that added KubeOne clusters
// (the coordinator renumbers migrations at merge: change it here only).
const kubeOneSchemaVersion = 11

func memberIDs(c KubeOneCluster) []string {
	var out []string
	for _, m := range c.Members {
		out = append(out, m.Role+":"+m.Node.Name)
	}
	return out
}

// TestKubeOneClusters: a cluster is stored with its members in order
// (control plane first), a node is in one cluster at most, a cluster
// whose member cannot be stored leaves nothing behind, members follow
// their node's removal, and everything is there after reopening the file
// without a clean close (what a kill -9 leaves).
func TestKubeOneClusters(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		path := b.newLoc(t)
		s, err := b.open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		if migrations[kubeOneSchemaVersion-1] != migrationKubeOne {
			t.Fatalf("migration v%d is not the KubeOne migration; update kubeOneSchemaVersion", kubeOneSchemaVersion)
		}
		if err := s.CreateToken(ctx, Token{
			ID:         "t",
			SecretHash: []byte("h"),
			UsesLeft:   10,
			ExpiresAt:  time.Now().Add(time.Hour),
		}); err != nil {
			t.Fatal(err)
		}
		for _, n := range []string{"n1", "n2", "n3", "n4", "n5"} {
			if _, err := s.Join(ctx, "t", accept, Node{ID: "id-" + n, Name: n}); err != nil {
				t.Fatal(err)
			}
		}
		now := time.Now().Truncate(time.Millisecond)
		cluster := func(name string, members ...string) KubeOneCluster {
			c := KubeOneCluster{Name: name, ID: "cid-" + name, Kubernetes: "1.30.5", Login: "root", CNI: "canal",
				PublicKey: "ssh-ed25519 AAAA", Status: "created", CreatedAt: now}
			for i, m := range members {
				role := KubeOneWorker
				if i == 0 {
					role = KubeOneControlPlane
				}
				c.Members = append(c.Members, KubeOneMember{NodeID: "id-" + m, Role: role})
			}
			return c
		}
		// Workers listed first still come after the control plane, in their
		// own order.
		a := cluster("a", "n2", "n1")
		a.Members = append([]KubeOneMember{{NodeID: "id-n3", Role: KubeOneWorker}}, a.Members...)
		a.Extra = `{"features":{}}`
		if err := s.CreateKubeOneCluster(ctx, a); err != nil {
			t.Fatal(err)
		}
		cases := []struct {
			name string
			c    KubeOneCluster
			want error
		}{
			{"name taken", cluster("a", "n4"), ErrNameTaken},
			{"member of another cluster", cluster("b", "n4", "n1"), ErrInOtherCluster},
			{"unknown node", cluster("b", "n4", "nope"), ErrNotFound},
		}
		for _, tc := range cases {
			if err := s.CreateKubeOneCluster(ctx, tc.c); !errors.Is(err, tc.want) {
				t.Errorf("%s: got %v, want %v", tc.name, err, tc.want)
			}
		}
		if _, err := s.GetKubeOneCluster(ctx, "b"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("a refused cluster was stored: %v", err)
		}
		if err := s.CreateKubeOneCluster(ctx, cluster("b", "n4")); err != nil {
			t.Fatalf("n4 was left a member of a refused cluster: %v", err)
		}

		got, err := s.GetKubeOneCluster(ctx, "a")
		if err != nil {
			t.Fatal(err)
		}
		if g, w := memberIDs(got), []string{"control-plane:n2", "worker:n3", "worker:n1"}; !slices.Equal(g, w) {
			t.Errorf("members %v, want %v", g, w)
		}
		if got.Extra != a.Extra || got.ID != "cid-a" || !got.CreatedAt.Equal(now) {
			t.Errorf("got %+v", got)
		}

		// A member change: n1 leaves, n5 joins; n4 (in b) may not.
		if err := s.SetKubeOneMembers(ctx, "a", []KubeOneMember{
			{NodeID: "id-n2", Role: KubeOneControlPlane}, {NodeID: "id-n4", Role: KubeOneWorker},
		}, now); !errors.Is(err, ErrInOtherCluster) {
			t.Fatalf("n4 moved from b to a: %v", err)
		}
		if err := s.SetKubeOneMembers(ctx, "a", []KubeOneMember{
			{NodeID: "id-n2", Role: KubeOneControlPlane}, {NodeID: "id-n5", Role: KubeOneWorker},
		}, now); err != nil {
			t.Fatal(err)
		}
		if err := s.SetKubeOneMembers(ctx, "nope", nil, now); !errors.Is(err, ErrNotFound) {
			t.Fatalf("members of a missing cluster: %v", err)
		}
		// A removed node leaves its cluster.
		if err := s.DeleteNode(ctx, "id-n5"); err != nil {
			t.Fatal(err)
		}
		apply := KubeOneApply{Job: "j1", Result: "succeeded", At: now}
		if err := s.SetKubeOneStatus(ctx, "a", "installed", apply, now); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteKubeOneCluster(ctx, "b"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteKubeOneCluster(ctx, "b"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("second delete: %v", err)
		}

		// Reopen beside the open handle, as after kill -9.
		s2, err := b.open(ctx, path)
		if err != nil {
			t.Fatal(err)
		}
		defer s2.Close()
		list, err := s2.ListKubeOneClusters(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if len(list) != 1 || list[0].Name != "a" {
			t.Fatalf("after reopen: %+v", list)
		}
		if g, w := memberIDs(list[0]), []string{"control-plane:n2"}; !slices.Equal(g, w) {
			t.Errorf("after reopen members %v, want %v", g, w)
		}
		if list[0].Status != "installed" || list[0].LastApply.Job != apply.Job || list[0].LastApply.Result != apply.Result ||
			!list[0].LastApply.At.Equal(apply.At) {
			t.Errorf("after reopen status %q, last apply %+v", list[0].Status, list[0].LastApply)
		}
		// n4 is free again once b is gone.
		if err := s2.SetKubeOneMembers(ctx, "a", []KubeOneMember{
			{NodeID: "id-n4", Role: KubeOneControlPlane},
		}, now); err != nil {
			t.Fatal(err)
		}
	})
}
