package store

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"
)

// One node, one Kubernetes: a node in a KubeOne cluster cannot be desired
// active in the cluster state machine, and a node with an engine (desired
// active, or still uninstalling) cannot join a KubeOne cluster, whichever
// came first. Deregistering stays possible whatever the node's KubeOne
// membership.
func TestOneKubernetesPerNode(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		t.Parallel()
		ctx := context.Background()
		s := openTest(t)
		for _, n := range []string{"n1", "n2", "n3"} {
			addNode(t, s, "id-"+n, n)
		}
		now := time.Now().UTC().Truncate(time.Millisecond)
		kube := func(name string, nodes ...string) KubeOneCluster {
			c := KubeOneCluster{Name: name, ID: "cid-" + name, Kubernetes: "1.30.5", Login: "root", CNI: "canal",
				PublicKey: "ssh-ed25519 AAAA", Status: "created", CreatedAt: now}
			for _, n := range nodes {
				c.Members = append(c.Members, KubeOneMember{NodeID: "id-" + n, Role: KubeOneControlPlane})
			}
			return c
		}
		register := func(node string) error {
			_, err := s.ChangeClusterMember(ctx, "id-"+node, func(m *ClusterMember, exists bool) error {
				m.Engine, m.Desired, m.UpdatedAt = "rke2", "active", now
				if !exists {
					m.State = "inactive"
				}
				return nil
			})
			return err
		}

		// KubeOne first: the register is refused, naming the cluster.
		if err := s.CreateKubeOneCluster(ctx, kube("edge2", "n1")); err != nil {
			t.Fatal(err)
		}
		err := register("n1")
		var owner *KubernetesOwnerError
		if !errors.Is(err, ErrKubernetesOwned) || !errors.As(err, &owner) || owner.KubeOneCluster != "edge2" {
			t.Fatalf("register on a KubeOne member: %v, want a KubernetesOwnerError naming edge2", err)
		}
		if _, err := s.GetClusterMember(ctx, "id-n1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("the refused register stored a member: %v", err)
		}
		err = s.PutClusterMember(ctx, ClusterMember{NodeID: "id-n1", Engine: "k3s", Desired: "active", State: "inactive"})
		if !errors.Is(err, ErrKubernetesOwned) {
			t.Fatalf("PutClusterMember on a KubeOne member: %v, want ErrKubernetesOwned", err)
		}

		// The engine first: KubeOne is refused, naming the engine, on create
		// and on a change of members, and nothing of the cluster is stored.
		if err := register("n2"); err != nil {
			t.Fatal(err)
		}
		err = s.CreateKubeOneCluster(ctx, kube("edge3", "n3", "n2"))
		if !errors.As(err, &owner) || owner.Engine != "rke2" || owner.NodeID != "id-n2" {
			t.Fatalf("KubeOne create over an engine: %v, want a KubernetesOwnerError naming rke2", err)
		}
		if _, err := s.GetKubeOneCluster(ctx, "edge3"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("the refused cluster was stored: %v", err)
		}
		err = s.SetKubeOneMembers(ctx, "edge2", kube("edge2", "n1", "n2").Members, now)
		if !errors.Is(err, ErrKubernetesOwned) {
			t.Fatalf("KubeOne members over an engine: %v, want ErrKubernetesOwned", err)
		}

		// Deregistered but still uninstalling: still the engine's.
		if _, err := s.ChangeClusterMember(ctx, "id-n2", func(m *ClusterMember, _ bool) error {
			m.Desired, m.State = "inactive", "uninstall_in_progress"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateKubeOneCluster(ctx, kube("edge3", "n2")); !errors.Is(err, ErrKubernetesOwned) {
			t.Fatalf("KubeOne create while the engine uninstalls: %v, want ErrKubernetesOwned", err)
		}
		// Uninstalled: free.
		if _, err := s.ChangeClusterMember(ctx, "id-n2", func(m *ClusterMember, _ bool) error {
			m.State = "inactive"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateKubeOneCluster(ctx, kube("edge3", "n2")); err != nil {
			t.Fatalf("KubeOne create on a node whose engine is gone: %v", err)
		}
		// A deregister of a KubeOne member is never refused.
		if _, err := s.ChangeClusterMember(ctx, "id-n2", func(m *ClusterMember, _ bool) error {
			m.Desired, m.State = "inactive", "deregistering"
			return nil
		}); err != nil {
			t.Fatalf("deregister of a KubeOne member: %v", err)
		}
		// A change that refuses stores nothing.
		refuse := errors.New("no")
		_, err = s.ChangeClusterMember(ctx, "id-n3", func(*ClusterMember, bool) error { return refuse })
		if !errors.Is(err, refuse) {
			t.Fatalf("change's own error: %v", err)
		}
		_, err = s.ChangeClusterMember(ctx, "id-none", func(*ClusterMember, bool) error { return nil })
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("member of an unregistered node: %v, want ErrNotFound", err)
		}
	})
}

// Concurrent requests for one node, half a KubeOne create and half a
// register: exactly one owner wins, on both backends (PostgreSQL runs
// them truly in parallel).
func TestOneKubernetesPerNodeRace(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		t.Parallel()
		ctx := context.Background()
		s := openTest(t)
		const rounds, pairs = 5, 4
		for r := range rounds {
			node := fmt.Sprintf("r%d", r)
			addNode(t, s, "id-"+node, node)
			var wg sync.WaitGroup
			errs := make([]error, 2*pairs)
			for i := range pairs {
				wg.Go(func() {
					name := fmt.Sprintf("k%d-%d", r, i)
					errs[2*i] = s.CreateKubeOneCluster(ctx, KubeOneCluster{Name: name, ID: "cid-" + name, Kubernetes: "1.30.5",
						Login: "root", CNI: "canal", PublicKey: "ssh-ed25519 AAAA", Status: "created", CreatedAt: time.Now(),
						Members: []KubeOneMember{{NodeID: "id-" + node, Role: KubeOneControlPlane}}})
				})
				wg.Go(func() {
					_, errs[2*i+1] = s.ChangeClusterMember(ctx, "id-"+node, func(m *ClusterMember, exists bool) error {
						if exists {
							return ErrNameTaken // an earlier register won: not the race under test
						}
						m.Engine, m.Desired, m.State, m.UpdatedAt = "k3s", "active", "inactive", time.Now()
						return nil
					})
				})
			}
			wg.Wait()
			won := 0
			for _, err := range errs {
				switch {
				case err == nil:
					won++
				case errors.Is(err, ErrKubernetesOwned), errors.Is(err, ErrInOtherCluster), errors.Is(err, ErrNameTaken):
				default:
					t.Fatalf("round %d: unexpected error %v", r, err)
				}
			}
			if won != 1 {
				t.Fatalf("round %d: %d requests won the node, want 1: %v", r, won, errs)
			}
		}
	})
}

// The controller's progress never overwrites a request: a deregister made
// during an install survives the install's end, and a step whose state a
// request moved is refused (ErrMemberMoved) rather than undoing it.
func TestAdvanceClusterMemberKeepsRequests(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		t.Parallel()
		ctx := context.Background()
		s := openTest(t)
		addNode(t, s, "id-n1", "n1")
		now := time.Now().UTC().Truncate(time.Millisecond)
		installing := ClusterMember{NodeID: "id-n1", Engine: "rke2", Desired: "active", State: "install_in_progress",
			UpdatedAt: now}
		if err := s.PutClusterMember(ctx, installing); err != nil {
			t.Fatal(err)
		}
		worker, err := s.GetClusterMember(ctx, "id-n1") // read when the install began
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.ChangeClusterMember(ctx, "id-n1", func(m *ClusterMember, _ bool) error {
			m.Desired = "inactive"
			return nil
		}); err != nil {
			t.Fatal(err)
		}
		worker.State, worker.LastTransition, worker.LastJob, worker.EngineDigest = "active", now, "j1", "d1"
		if err := s.AdvanceClusterMember(ctx, worker, "install_in_progress"); err != nil {
			t.Fatal(err)
		}
		got, err := s.GetClusterMember(ctx, "id-n1")
		if err != nil || got.Desired != "inactive" || got.State != "active" || got.LastJob != "j1" ||
			got.EngineDigest != "d1" {
			t.Fatalf("after the install ended: %+v, %v; want desired inactive (the deregister) in state active", got, err)
		}
		// A stale step: the state is active now, not install_in_progress.
		worker.State = "inactive"
		if err := s.AdvanceClusterMember(ctx, worker, "install_in_progress"); !errors.Is(err, ErrMemberMoved) {
			t.Fatalf("stale step: %v, want ErrMemberMoved", err)
		}
		if got, _ := s.GetClusterMember(ctx, "id-n1"); got.State != "active" {
			t.Fatalf("a stale step moved the member to %s", got.State)
		}
		worker.NodeID = "id-gone"
		if err := s.AdvanceClusterMember(ctx, worker, "active"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("member gone: %v, want ErrNotFound", err)
		}
	})
}
