package store

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"syscall"
	"testing"
	"time"
)

// migrationOnboardingVersion is the schema version that adds the
// onboarding tables (renumbered with the list at merge).
const migrationOnboardingVersion = 12

func openTestStore(t *testing.T) (*DB, string) {
	t.Helper()
	path := filepath.Join(t.TempDir(), "tether.db")
	s, err := OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, path
}

func testCredential(id, name string, uses int) OnboardingCredential {
	now := time.Now()
	return OnboardingCredential{ID: id, Name: name, SecretHash: []byte("hash-" + id), Role: "onboarder",
		Labels: map[string]string{"site": "berlin"}, Uses: uses, UsesLeft: uses, ExpiresAt: now.Add(time.Hour),
		CreatedAt: now}
}

func acceptCredential(OnboardingCredential) error { return nil }

// TestOnboardTransaction: a new machine spends one use and gets a node with
// the credential's labels over its own; the same machine and key again
// finds that node and spends nothing; the same UUID with another key, an
// exhausted, expired or revoked credential, a refused check, or a taken
// name change nothing.
func TestOnboardTransaction(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		if err := s.CreateOnboardingCredential(ctx, testCredential("c1", "berlin", 2)); err != nil {
			t.Fatal(err)
		}
		if err := s.CreateOnboardingCredential(ctx, testCredential("c9", "berlin", 1)); !errors.Is(err, ErrNameTaken) {
			t.Fatalf("same name twice: %v, want ErrNameTaken", err)
		}
		n, existing, err := s.Onboard(ctx, "c1", acceptCredential, Machine{UUID: "uuid-1", PublicKey: "k1"},
			Node{ID: "n1", Name: "shop-1", Labels: map[string]string{"site": "paris", "rack": "r1"}})
		if err != nil || existing {
			t.Fatalf("first onboarding: %v existing=%v", err, existing)
		}
		if n.Labels["site"] != "berlin" || n.Labels["rack"] != "r1" {
			t.Fatalf("labels %v", n.Labels)
		}
		again, existing, err := s.Onboard(ctx, "c1", acceptCredential, Machine{
			UUID: "uuid-1", PublicKey: "k1",
		}, Node{ID: "n2", Name: "other"})
		if err != nil || !existing || again.ID != "n1" {
			t.Fatalf("retry: %+v existing=%v %v", again, existing, err)
		}
		uses := func() int {
			c, err := s.GetOnboardingCredential(ctx, "c1")
			if err != nil {
				t.Fatal(err)
			}
			return c.UsesLeft
		}
		if uses() != 1 {
			t.Fatalf("uses left %d, want 1", uses())
		}
		refusals := []struct {
			name string
			cred string
			m    Machine
			n    Node
			chk  func(OnboardingCredential) error
			want error
		}{
			{
				"another key",
				"c1",
				Machine{UUID: "uuid-1", PublicKey: "k2"},
				Node{ID: "n3", Name: "x3"},
				acceptCredential,
				ErrMachineKeyMismatch,
			},
			{
				"unknown credential",
				"nope",
				Machine{UUID: "uuid-3", PublicKey: "k3"},
				Node{ID: "n3", Name: "x3"},
				acceptCredential,
				ErrCredentialUnknown,
			},
			{"check refuses", "c1", Machine{UUID: "uuid-3", PublicKey: "k3"}, Node{ID: "n3", Name: "x3"},
				func(OnboardingCredential) error { return ErrCredentialUnknown }, ErrCredentialUnknown},
			{
				"name taken",
				"c1",
				Machine{UUID: "uuid-3", PublicKey: "k3"},
				Node{ID: "n3", Name: "shop-1"},
				acceptCredential,
				ErrNameTaken,
			},
		}
		for _, tc := range refusals {
			t.Run(tc.name, func(t *testing.T) {
				if _, _, err := s.Onboard(ctx, tc.cred, tc.chk, tc.m, tc.n); !errors.Is(err, tc.want) {
					t.Fatalf("got %v, want %v", err, tc.want)
				}
				if uses() != 1 {
					t.Fatalf("uses left %d after a refusal, want 1", uses())
				}
				if _, err := s.GetMachine(ctx, "uuid-3"); !errors.Is(err, ErrNotFound) {
					t.Fatalf("machine bound after a refusal: %v", err)
				}
			})
		}
		if _, _, err := s.Onboard(ctx, "c1", acceptCredential, Machine{
			UUID: "uuid-2", PublicKey: "k2",
		}, Node{ID: "n2", Name: "shop-2"}); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Onboard(ctx, "c1", acceptCredential, Machine{
			UUID: "uuid-3", PublicKey: "k3",
		}, Node{ID: "n3", Name: "shop-3"}); !errors.Is(err, ErrCredentialUsedUp) {
			t.Fatalf("exhausted: %v", err)
		}

		exp := testCredential("c2", "old", 5)
		exp.ExpiresAt = time.Now().Add(-time.Second)
		if err := s.CreateOnboardingCredential(ctx, exp); err != nil {
			t.Fatal(err)
		}
		if _, _, err := s.Onboard(ctx, "c2", acceptCredential, Machine{
			UUID: "uuid-3", PublicKey: "k3",
		}, Node{ID: "n3", Name: "shop-3"}); !errors.Is(err, ErrCredentialExpired) {
			t.Fatalf("expired: %v", err)
		}
		if err := s.CreateOnboardingCredential(ctx, testCredential("c3", "gone", 5)); err != nil {
			t.Fatal(err)
		}
		c, err := s.RevokeOnboardingCredential(ctx, "gone", time.Now())
		if err != nil || c.RevokedAt.IsZero() {
			t.Fatalf("revoke: %+v %v", c, err)
		}
		if _, err := s.RevokeOnboardingCredential(ctx, "nobody", time.Now()); !errors.Is(err, ErrNotFound) {
			t.Fatalf("revoke unknown: %v", err)
		}
		if _, _, err := s.Onboard(ctx, "c3", acceptCredential, Machine{
			UUID: "uuid-3", PublicKey: "k3",
		}, Node{ID: "n3", Name: "shop-3"}); !errors.Is(err, ErrCredentialRevoked) {
			t.Fatalf("revoked: %v", err)
		}

		// A removed node frees its machine: it may be onboarded again.
		if err := s.DeleteNode(ctx, "n1"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetMachine(ctx, "uuid-1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("machine still bound after its node was removed: %v", err)
		}
	})
}

func TestOSProfiles(t *testing.T) {
	forEachBackend(t, func(t *testing.T, b backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		if err := s.AddOSProfile(ctx, OSProfile{
			Name:      "debian-12",
			Distro:    "debian",
			Version:   "12",
			Family:    "debian",
			CloudInit: "#cloud-config\n",
		}); err != nil {
			t.Fatal(err)
		}
		for _, p := range []OSProfile{
			{Name: "debian-12", Distro: "debian", Version: "13"}, {Name: "deb", Distro: "debian", Version: "12"},
		} {
			if err := s.AddOSProfile(ctx, p); !errors.Is(err, ErrNameTaken) {
				t.Fatalf("%+v: %v, want ErrNameTaken", p, err)
			}
		}
		ps, err := s.ListOSProfiles(ctx)
		if err != nil || len(ps) != 1 || ps[0].CloudInit != "#cloud-config\n" || ps[0].Family != "debian" {
			t.Fatalf("list: %+v %v", ps, err)
		}
		if err := s.DeleteOSProfile(ctx, "debian-12"); err != nil {
			t.Fatal(err)
		}
		if err := s.DeleteOSProfile(ctx, "debian-12"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete twice: %v", err)
		}
	})
}

// TestMigrateOnboarding: a database of the schema before onboarding, with
// nodes, gains the (empty) onboarding tables.
func TestMigrateOnboarding(t *testing.T) {
	ctx := context.Background()
	path := dataDirAt(t, migrationOnboardingVersion-1,
		`INSERT INTO nodes (id, name, created_at) VALUES ('n1', 'old', 1)`)
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if cs, err := s.ListOnboardingCredentials(ctx); err != nil || len(cs) != 0 {
		t.Fatalf("credentials: %v %v", cs, err)
	}
	if _, err := s.GetNode(ctx, "n1"); err != nil {
		t.Fatal(err)
	}
}

// TestOnboardSurvivesKill9 onboards machines in a child process and kills
// it with SIGKILL mid-way: every use spent has its node and its machine
// binding, and every node its spent use (the transaction is all or
// nothing, and committed data is durable).
func TestOnboardSurvivesKill9(t *testing.T) {
	if path := os.Getenv("TETHER_ONBOARD_KILL_DB"); path != "" {
		onboardForever(path)
		return
	}
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "tether.db")
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.CreateOnboardingCredential(ctx, testCredential("c1", "bulk", 100000)); err != nil {
		t.Fatal(err)
	}
	s.Close()
	cmd := exec.Command(os.Args[0], "-test.run=^TestOnboardSurvivesKill9$")
	cmd.Env = append(os.Environ(), "TETHER_ONBOARD_KILL_DB="+path)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Kill it once it has onboarded some machines (bounded poll).
	db, err := sql.Open("sqlite", "file:"+path+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var nodes int
		if err := db.QueryRowContext(ctx, `SELECT count(*) FROM nodes`).Scan(&nodes); err == nil && nodes >= 50 {
			break
		}
		if time.Now().After(deadline) {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			t.Fatal("child onboarded nothing in 30s")
		}
		time.Sleep(20 * time.Millisecond)
	}
	_ = cmd.Process.Signal(syscall.SIGKILL)
	_ = cmd.Wait()

	s, err = OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	c, err := s.GetOnboardingCredential(ctx, "c1")
	if err != nil {
		t.Fatal(err)
	}
	nodes, err := s.ListNodes(ctx)
	if err != nil {
		t.Fatal(err)
	}
	spent := c.Uses - c.UsesLeft
	if spent == 0 || spent != len(nodes) {
		t.Fatalf("after kill -9: %d uses spent, %d nodes", spent, len(nodes))
	}
	for _, n := range nodes {
		m, err := s.GetMachine(ctx, "uuid-"+n.ID)
		if err != nil || m.NodeID != n.ID {
			t.Fatalf("node %s without its machine binding: %+v %v", n.ID, m, err)
		}
	}
}

// onboardForever is the child of TestOnboardSurvivesKill9.
func onboardForever(path string) {
	ctx := context.Background()
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	for i := 0; ; i++ {
		id := strconv.Itoa(i)
		if _, _, err := s.Onboard(ctx, "c1", acceptCredential, Machine{
			UUID: "uuid-" + id, PublicKey: "k",
		}, Node{ID: id, Name: "n" + id}); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
	}
}
