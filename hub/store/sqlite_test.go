package store

import (
	"bytes"
	"context"
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

func accept(Token) error { return nil }

func TestJoinConsumesToken(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		now := time.Now()
		cases := []struct {
			name    string
			token   Token
			joins   int
			wantErr error // of the last join
		}{
			{"single use", Token{ID: "a", UsesLeft: 1, ExpiresAt: now.Add(time.Hour)}, 1, nil},
			{"reused", Token{ID: "a", UsesLeft: 1, ExpiresAt: now.Add(time.Hour)}, 2, ErrTokenUsedUp},
			{"three uses", Token{ID: "a", UsesLeft: 3, ExpiresAt: now.Add(time.Hour)}, 3, nil},
			{"expired", Token{ID: "a", UsesLeft: 3, ExpiresAt: now.Add(-time.Second)}, 1, ErrTokenExpired},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				s := openTest(t)
				tc.token.SecretHash = []byte("h")
				tc.token.Labels = map[string]string{"site": "lab"}
				if err := s.CreateToken(ctx, tc.token); err != nil {
					t.Fatal(err)
				}
				var err error
				for i := 0; i < tc.joins; i++ {
					_, err = s.Join(ctx, "a", accept, Node{
						ID:     fmt.Sprint("id", i),
						Name:   fmt.Sprint("n", i),
						Labels: map[string]string{"role": "x"},
					})
				}
				if !errors.Is(err, tc.wantErr) && !(tc.wantErr == nil && err == nil) {
					t.Fatalf("last join: %v, want %v", err, tc.wantErr)
				}
				if tc.wantErr == nil {
					n, err := s.GetNodeByName(ctx, "n0")
					if err != nil || n.Labels["site"] != "lab" || n.Labels["role"] != "x" {
						t.Fatalf("node after join: %+v %v", n, err)
					}
				}
			})
		}
	})
}

func TestJoinUnknownTokenAndCheck(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		if _, err := s.Join(ctx, "nope", accept, Node{ID: "1", Name: "n1"}); !errors.Is(err, ErrTokenUnknown) {
			t.Fatalf("unknown token: %v", err)
		}
		s.CreateToken(ctx, Token{ID: "a", SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour)})
		bad := errors.New("bad secret")
		if _, err := s.Join(ctx, "a", func(Token) error { return bad }, Node{ID: "1", Name: "n1"}); !errors.Is(err, bad) {
			t.Fatalf("check error not returned: %v", err)
		}
		// A failed check must not consume the use.
		if _, err := s.Join(ctx, "a", accept, Node{ID: "1", Name: "n1"}); err != nil {
			t.Fatalf("use was consumed by a failed check: %v", err)
		}
	})
}

func TestJoinNameTakenKeepsTokenUse(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		s.CreateToken(ctx, Token{ID: "a", SecretHash: []byte("h"), UsesLeft: 2, ExpiresAt: time.Now().Add(time.Hour)})
		if _, err := s.Join(ctx, "a", accept, Node{ID: "1", Name: "n1"}); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Join(ctx, "a", accept, Node{ID: "2", Name: "n1"}); !errors.Is(err, ErrNameTaken) {
			t.Fatalf("duplicate name: %v", err)
		}
		toks, _ := s.ListTokens(ctx)
		if toks[0].UsesLeft != 1 {
			t.Fatalf("uses left = %d, want 1 (failed join must roll back)", toks[0].UsesLeft)
		}
	})
}

func TestNodeSeenAndOperators(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		s.CreateToken(ctx, Token{ID: "a", SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour)})
		s.Join(ctx, "a", accept, Node{ID: "1", Name: "n1"})
		at := time.Now().Truncate(time.Millisecond)
		if err := s.UpdateNodeSeen(ctx, "1", Seen{Online: true, Transport: "quic", AgentVersion: "v1", At: at}); err != nil {
			t.Fatal(err)
		}
		n, _ := s.GetNode(ctx, "1")
		if !n.Online || n.Transport != "quic" || n.AgentVersion != "v1" || !n.LastSeen.Equal(at) {
			t.Fatalf("after seen: %+v", n)
		}
		s.MarkAllOffline(ctx)
		if n, _ = s.GetNode(ctx, "1"); n.Online || n.Transport != "quic" {
			t.Fatalf("after MarkAllOffline: %+v", n)
		}
		if err := s.UpdateNodeSeen(ctx, "missing", Seen{}); !errors.Is(err, ErrNotFound) {
			t.Fatalf("missing node: %v", err)
		}
		if err := s.AddOperator(ctx, Operator{Name: "alice", PublicKey: "k", Fingerprint: "f"}); err != nil {
			t.Fatal(err)
		}
		if err := s.AddOperator(ctx, Operator{Name: "bob", PublicKey: "k", Fingerprint: "f"}); !errors.Is(err, ErrNameTaken) {
			t.Fatalf("same key twice: %v", err)
		}
		if err := s.RemoveOperator(ctx, "bob"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("remove missing: %v", err)
		}
		if err := s.RemoveOperator(ctx, "alice"); err != nil {
			t.Fatal(err)
		}
		if keys, err := s.ListRevokedKeys(ctx); err != nil || len(keys) != 1 || keys[0] != "k" {
			t.Fatalf("revoked keys after removing alice: %v %v", keys, err)
		}
		if err := s.AddOperator(ctx, Operator{Name: "alice", PublicKey: "k", Fingerprint: "f"}); err != nil {
			t.Fatal(err)
		}
		if keys, _ := s.ListRevokedKeys(ctx); len(keys) != 0 {
			t.Fatalf("re-registered key still revoked: %v", keys)
		}
		if err := s.DeleteNode(ctx, "1"); err != nil {
			t.Fatal(err)
		}
		if _, err := s.GetNode(ctx, "1"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("deleted node: %v", err)
		}
	})
}

// TestCrashDuringWrites kills (SIGKILL) a child process that is writing
// nodes as fast as it can, then reopens the file: it must open cleanly, pass
// SQLite's integrity check, and hold every node the child reported committed.
func TestCrashDuringWrites(t *testing.T) {
	if os.Getenv("TETHER_STORE_CRASH_CHILD") != "" {
		return
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "tether.db")
	cmd := exec.Command(os.Args[0], "-test.run=^TestCrashChild$", "-test.count=1")
	cmd.Env = append(os.Environ(), "TETHER_STORE_CRASH_CHILD="+path)
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	// Read committed counts until enough writes happened, then kill -9.
	buf := make([]byte, 64<<10)
	committed := 0
	deadline := time.Now().Add(20 * time.Second)
	var acc []byte
	for committed < 200 && time.Now().Before(deadline) {
		n, err := out.Read(buf)
		acc = append(acc, buf[:n]...)
		for {
			i := indexByte(acc, '\n')
			if i < 0 {
				break
			}
			if v, err := strconv.Atoi(string(acc[:i])); err == nil {
				committed = v
			}
			acc = acc[i+1:]
		}
		if err != nil {
			break
		}
	}
	cmd.Process.Signal(syscall.SIGKILL)
	cmd.Wait()
	if committed < 200 {
		t.Fatalf("child committed only %d writes before the deadline", committed)
	}
	s, err := OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatalf("reopen after kill -9: %v", err)
	}
	defer s.Close()
	var res string
	if err := s.db.QueryRow("PRAGMA integrity_check").Scan(&res); err != nil || res != "ok" {
		t.Fatalf("integrity_check = %q, %v", res, err)
	}
	nodes, err := s.ListNodes(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(nodes) < committed {
		t.Fatalf("%d nodes after crash, child reported %d committed", len(nodes), committed)
	}
}

func indexByte(b []byte, c byte) int {
	for i, x := range b {
		if x == c {
			return i
		}
	}
	return -1
}

// TestCrashChild is the writer process of TestCrashDuringWrites.
func TestCrashChild(t *testing.T) {
	path := os.Getenv("TETHER_STORE_CRASH_CHILD")
	if path == "" {
		t.Skip("helper process for TestCrashDuringWrites")
	}
	ctx := context.Background()
	s, err := OpenSQLite(ctx, path)
	if err != nil {
		t.Fatal(err)
	}
	s.CreateToken(ctx, Token{ID: "t", SecretHash: []byte("h"), UsesLeft: 1 << 30, ExpiresAt: time.Now().Add(time.Hour)})
	for i := 1; i <= 100000; i++ {
		if _, err := s.Join(ctx, "t", accept, Node{ID: fmt.Sprint(i), Name: fmt.Sprint("n", i)}); err != nil {
			t.Fatal(err)
		}
		fmt.Println(i)
	}
}

func TestRolesAuditRevoke(t *testing.T) {
	forEachBackend(t, func(t *testing.T, _ backend, openTest func(t *testing.T) *DB) {
		ctx := context.Background()
		s := openTest(t)
		roles, err := s.ListRoles(ctx)
		if err != nil || len(roles) != 2 || roles[0].Name != "admin" || roles[1].Name != "all" || roles[1].Nodes != "*" {
			t.Fatalf("built-in roles: %+v %v", roles, err)
		}
		if err := s.PutRole(ctx, Role{Name: "ops", Nodes: "site=lab", Logins: []string{"root"}}); err != nil {
			t.Fatal(err)
		}
		if err := s.PutRole(ctx, Role{Name: "ops", Nodes: "site=berlin", Logins: []string{"ubuntu"}}); err != nil {
			t.Fatal(err)
		}
		roles, _ = s.ListRoles(ctx)
		if len(roles) != 3 || roles[2].Nodes != "site=berlin" || roles[2].Logins[0] != "ubuntu" {
			t.Fatalf("after update: %+v", roles)
		}
		if err := s.DeleteRole(ctx, "nope"); !errors.Is(err, ErrNotFound) {
			t.Fatalf("delete missing role: %v", err)
		}
		s.AddOperator(ctx, Operator{Name: "bob", PublicKey: "k", Fingerprint: "f", Roles: []string{"ops"}})
		ops, _ := s.ListOperators(ctx)
		if len(ops) != 1 || len(ops[0].Roles) != 1 || ops[0].Roles[0] != "ops" {
			t.Fatalf("operator roles: %+v", ops)
		}

		base := time.Now().Truncate(time.Millisecond)
		for i, e := range []AuditEvent{
			{At: base, Kind: "join", Node: "n1", Result: "ok"},
			{
				At:          base.Add(time.Second),
				Kind:        "jump",
				Operator:    "bob",
				Node:        "n1",
				Result:      "ok",
				BytesToNode: 10,
				EndedAt:     base.Add(2 * time.Second),
			},
			{At: base.Add(3 * time.Second), Kind: "jump", Operator: "eve", Node: "n2", Result: "denied"},
		} {
			if err := s.AppendAudit(ctx, e); err != nil {
				t.Fatalf("event %d: %v", i, err)
			}
		}
		for _, tc := range []struct {
			f    AuditFilter
			want int
		}{
			{AuditFilter{}, 3}, {AuditFilter{Node: "n1"}, 2}, {AuditFilter{Operator: "eve"}, 1},
			{AuditFilter{Since: base.Add(500 * time.Millisecond)}, 2}, {AuditFilter{Limit: 1}, 1},
		} {
			got, err := s.ListAudit(ctx, tc.f)
			if err != nil || len(got) != tc.want {
				t.Errorf("ListAudit(%+v) = %d events, %v; want %d", tc.f, len(got), err, tc.want)
			}
		}
		last, _ := s.ListAudit(ctx, AuditFilter{Limit: 1})
		if last[0].Operator != "eve" {
			t.Fatalf("limit keeps the newest: %+v", last)
		}
		if _, err := s.db.Exec(`DELETE FROM audit`); err == nil {
			t.Fatal("audit log allowed a delete")
		}
		if _, err := s.db.Exec(`UPDATE audit SET result = 'ok'`); err == nil {
			t.Fatal("audit log allowed an update")
		}

		s.CreateToken(ctx, Token{ID: "a", SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour)})
		s.Join(ctx, "a", accept, Node{ID: "1", Name: "n1"})
		if err := s.RevokeNode(ctx, "1", base); err != nil {
			t.Fatal(err)
		}
		n, _ := s.GetNode(ctx, "1")
		if !n.RevokedAt.Equal(base) {
			t.Fatalf("revoked_at = %v", n.RevokedAt)
		}
		if err := s.RevokeNode(ctx, "missing", base); !errors.Is(err, ErrNotFound) {
			t.Fatalf("revoke missing: %v", err)
		}
	})
}

// TestSQLiteFilesPrivate: the database and the files SQLite keeps beside
// it (the WAL holds the latest writes: token hashes, operators' keys) are
// readable by the hub's user only, under the common umask 022, for a new
// database and for one an earlier hub left world-readable.
func TestSQLiteFilesPrivate(t *testing.T) {
	old := syscall.Umask(0o022)
	defer syscall.Umask(old)
	for _, tc := range []struct {
		name  string
		older bool // files made 0644 by an earlier hub
	}{{"new", false}, {"left by an earlier hub", true}} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "tether.db")
			if tc.older {
				for _, f := range []string{path, path + "-wal"} {
					if err := os.WriteFile(f, nil, 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			s, err := OpenSQLite(context.Background(), path)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			tok := Token{ID: "t", SecretHash: []byte("h"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour)}
			if err := s.CreateToken(context.Background(), tok); err != nil {
				t.Fatal(err)
			}
			for _, f := range []string{path, path + "-wal", path + "-shm"} {
				st, err := os.Stat(f)
				if err != nil {
					t.Fatalf("after a write: %v", err)
				}
				if st.Mode().Perm() != 0o600 {
					t.Errorf("%s: mode %v, want -rw-------", filepath.Base(f), st.Mode().Perm())
				}
			}
		})
	}
}

// Hub replicas sharing one new SQLite file start together: every process's
// first open must succeed (the first connection switches the file to WAL,
// which SQLite refuses at once, without its busy handler, while another
// process does the same). Six processes open the same new file at a signal,
// over a few rounds.
func TestSQLiteOpenedByManyAtOnce(t *testing.T) {
	if os.Getenv("TETHER_STORE_OPEN_CHILD") != "" {
		t.Skip("run as a child of itself")
	}
	const procs, rounds = 6, 5
	for round := range rounds {
		path := filepath.Join(t.TempDir(), "shared.db")
		start := filepath.Join(t.TempDir(), "go")
		cmds := make([]*exec.Cmd, procs)
		outs := make([]bytes.Buffer, procs)
		for i := range cmds {
			cmds[i] = exec.Command(os.Args[0], "-test.run=^TestSQLiteOpenChild$", "-test.count=1", "-test.v")
			cmds[i].Env = append(os.Environ(), "TETHER_STORE_OPEN_CHILD="+path, "TETHER_STORE_OPEN_START="+start)
			cmds[i].Stdout, cmds[i].Stderr = &outs[i], &outs[i]
			if err := cmds[i].Start(); err != nil {
				t.Fatal(err)
			}
		}
		// The children wait for this file, so their opens meet.
		time.Sleep(300 * time.Millisecond)
		if err := os.WriteFile(start, nil, 0o600); err != nil {
			t.Fatal(err)
		}
		for i, c := range cmds {
			if err := c.Wait(); err != nil {
				t.Errorf("round %d: process %d of %d opening %s at once: %v\n%s", round, i, procs, path, err, outs[i].Bytes())
			}
		}
	}
}

// TestSQLiteOpenChild is a process of TestSQLiteOpenedByManyAtOnce.
func TestSQLiteOpenChild(t *testing.T) {
	path := os.Getenv("TETHER_STORE_OPEN_CHILD")
	if path == "" {
		t.Skip("helper process for TestSQLiteOpenedByManyAtOnce")
	}
	start := os.Getenv("TETHER_STORE_OPEN_START")
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(time.Millisecond) {
		if _, err := os.Stat(start); err == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no start signal %s", start)
		}
	}
	s, err := OpenSQLite(context.Background(), path)
	if err != nil {
		t.Fatal(err)
	}
	s.Close()
}
