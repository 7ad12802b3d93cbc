package access

import (
	"context"
	"errors"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/nodeconn"
	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/pki/ca"
)

type fixture struct {
	door   *Door
	st     *store.DB
	userCA *ca.SSHCA
	keys   map[string]gossh.Signer // operator name -> key
}

// newKey is a fresh ed25519 key (internal/testenv).
func newKey(t *testing.T) gossh.Signer { return testenv.NewKey(t).Signer }

// newFixture is a door over a real SQLite store with nodes berlin-1
// (site=berlin, online never), munich-1 (site=munich, last seen a minute
// ago), revoked-1 (revoked); roles berlin-ops (site=berlin: ops) and
// everything (*: *); operators alice (berlin-ops), root (everything) and
// nobody (no roles).
func newFixture(t *testing.T) *fixture {
	t.Helper()
	ctx := context.Background()
	dir := t.TempDir()
	st, err := store.OpenSQLite(ctx, filepath.Join(dir, "tether.db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	userCA, err := ca.LoadOrCreateSSH(filepath.Join(dir, "ca"), ca.SSHUserCAFile)
	if err != nil {
		t.Fatal(err)
	}
	f := &fixture{st: st, userCA: userCA, keys: map[string]gossh.Signer{}}
	for i, n := range []store.Node{
		{ID: "id-berlin", Name: "berlin-1", Labels: map[string]string{"site": "berlin"}},
		{ID: "id-munich", Name: "munich-1", Labels: map[string]string{"site": "munich", ProvisionLoginLabel: "deploy"}},
		{ID: "id-revoked", Name: "revoked-1", Labels: map[string]string{"site": "berlin"}},
	} {
		tokID := "tok" + string(rune('a'+i))
		if err := st.CreateToken(ctx, store.Token{
			ID: tokID, SecretHash: []byte("x"), UsesLeft: 1, ExpiresAt: time.Now().Add(time.Hour), CreatedAt: time.Now(),
		}); err != nil {
			t.Fatal(err)
		}
		n.CreatedAt = time.Now()
		if _, err := st.Join(ctx, tokID, func(store.Token) error { return nil }, n); err != nil {
			t.Fatal(err)
		}
	}
	if err := st.UpdateNodeSeen(ctx, "id-munich", store.Seen{
		Online: false, At: time.Now().Add(-time.Minute),
	}); err != nil {
		t.Fatal(err)
	}
	if err := st.RevokeNode(ctx, "id-revoked", time.Now()); err != nil {
		t.Fatal(err)
	}
	for _, r := range []store.Role{
		{Name: "berlin-ops", Nodes: "site=berlin", Logins: []string{"ops"}},
		{Name: "everything", Nodes: "*", Logins: []string{"*"}},
	} {
		if err := st.PutRole(ctx, r); err != nil {
			t.Fatal(err)
		}
	}
	for name, rs := range map[string][]string{"alice": {"berlin-ops"}, "root": {"everything"}, "nobody": nil} {
		k := newKey(t)
		f.keys[name] = k
		if err := st.AddOperator(ctx, store.Operator{Name: name, PublicKey: string(gossh.MarshalAuthorizedKey(k.PublicKey())),
			Fingerprint: gossh.FingerprintSHA256(k.PublicKey()), Roles: rs, CreatedAt: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	f.door, err = New(ctx, Config{Store: st, Conns: nodeconn.NewTable(), UserCAs: userCA.TrustedKeys})
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func TestResolve(t *testing.T) {
	f := newFixture(t)
	for _, tc := range []struct {
		ref     NodeRef
		want    error
		wantMsg string
	}{
		{ByName("ghost"), ErrUnknownNode, `no node named "ghost" is registered`},
		{ByID("id-ghost"), ErrUnknownNode, "node id id-ghost is not registered (the node was removed)"},
		{ByName("revoked-1"), ErrRevoked, `node "revoked-1" was revoked`},
		{ByID("id-revoked"), ErrRevoked, `node "revoked-1" was revoked`},
		{ByName("berlin-1"), ErrOffline, `node "berlin-1" is offline (never connected)`},
		{ByID("id-munich"), ErrOffline, `node "munich-1" is offline (last seen 1m`},
	} {
		n, route, err := f.door.Resolve(context.Background(), tc.ref)
		if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.wantMsg) {
			t.Errorf("Resolve(%s) = %v, want %v containing %q", tc.ref, err, tc.want, tc.wantMsg)
		}
		if route != nil {
			t.Errorf("Resolve(%s) returned a route with an error", tc.ref)
		}
		var off *OfflineError
		if errors.As(err, &off) && n.Name != off.Node {
			t.Errorf("Resolve(%s) offline: node %q returned, error names %q", tc.ref, n.Name, off.Node)
		}
	}
}

func TestAuthorizeJump(t *testing.T) {
	f := newFixture(t)
	berlin := store.Node{Name: "berlin-1", Labels: map[string]string{"site": "berlin"}}
	munich := store.Node{Name: "munich-1", Labels: map[string]string{"site": "munich"}}
	for _, tc := range []struct {
		operator string
		node     store.Node
		ok       bool
	}{
		{"alice", berlin, true},
		{"alice", munich, false},
		{"root", munich, true},
		{"nobody", berlin, false},
		{"mallory", berlin, false}, // not registered
	} {
		err := f.door.AuthorizeJump(tc.operator, tc.node)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrDenied)) {
			t.Errorf("AuthorizeJump(%s, %s) = %v, want ok=%v", tc.operator, tc.node.Name, err, tc.ok)
		}
	}
}

func TestAuthorizeJob(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	if err := f.st.PutRole(ctx, store.Role{
		Name: "deployers", Nodes: "site=munich", Logins: []string{"deploy"},
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	// berlin-1 provisions as root, munich-1 as deploy.
	berlin := store.Node{Name: "berlin-1", Labels: map[string]string{"site": "berlin"}}
	munich := store.Node{Name: "munich-1", Labels: map[string]string{"site": "munich", ProvisionLoginLabel: "deploy"}}
	for _, tc := range []struct {
		caller Caller
		node   store.Node
		ok     bool
	}{
		{Caller{Admin: true}, berlin, true},
		{Caller{Role: "everything"}, berlin, true},
		{Caller{Role: "berlin-ops"}, berlin, false}, // selects, but allows ops, not root
		{Caller{Role: "deployers"}, munich, true},
		{Caller{Role: "deployers"}, berlin, false},
		{Caller{Role: "gone"}, berlin, false},
	} {
		err := f.door.AuthorizeJob(tc.caller, tc.node)
		if (err == nil) != tc.ok || (err != nil && !errors.Is(err, ErrDenied)) {
			t.Errorf("AuthorizeJob(%+v, %s) = %v, want ok=%v", tc.caller, tc.node.Name, err, tc.ok)
		}
	}
}

func TestAuthorizeLoginAndCert(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	alice := f.keys["alice"].PublicKey()
	cert := func(keyID string, key gossh.PublicKey, ttl time.Duration) *gossh.Certificate {
		c, err := f.userCA.SignUser(key, keyID, []string{CertPrincipal("berlin-ops", "ops")}, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	otherCA, err := ca.LoadOrCreateSSH(t.TempDir(), ca.SSHUserCAFile)
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := otherCA.SignUser(alice, UserCertKeyIDPrefix+"alice", []string{"x"}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	expired := cert(UserCertKeyIDPrefix+"alice", alice, time.Hour)
	expired.ValidBefore = uint64(time.Now().Add(-time.Minute).Unix())
	for _, tc := range []struct {
		name     string
		operator string
		key      gossh.PublicKey
		ok       bool
	}{
		{"registered key", "alice", alice, true},
		{"another operator's key", "alice", f.keys["root"].PublicKey(), false},
		{"unknown operator", "mallory", alice, false},
		{"certificate from login", "alice", cert(UserCertKeyIDPrefix+"alice", alice, time.Hour), true},
		{"certificate issued to someone else", "alice", cert(UserCertKeyIDPrefix+"root", alice, time.Hour), false},
		{"certificate over another key", "alice",
			cert(UserCertKeyIDPrefix+"alice", f.keys["root"].PublicKey(), time.Hour), false},
		{"certificate from another CA", "alice", foreign, false},
		{"expired (signature no longer matches either)", "alice", expired, false},
	} {
		if err := f.door.AuthorizeLogin(tc.operator, tc.key); (err == nil) != tc.ok {
			t.Errorf("%s: AuthorizeLogin = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	// Removing the operator ends certificate logins at the next reload.
	good := cert(UserCertKeyIDPrefix+"alice", alice, time.Hour)
	if err := f.st.RemoveOperator(ctx, "alice"); err != nil {
		t.Fatal(err)
	}
	if err := f.door.AuthorizeLogin("alice", good); err != nil {
		t.Fatalf("before reload the old snapshot decides: %v", err)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.door.AuthorizeLogin("alice", good); !errors.Is(err, ErrDenied) {
		t.Errorf("removed operator's certificate: %v, want denied", err)
	}
}

func TestKeysAndPrincipalsFor(t *testing.T) {
	f := newFixture(t)
	snap := f.door.Snapshot()
	berlin := map[string]string{"site": "berlin"}
	keys := snap.KeysFor(berlin)
	if len(keys) != 2 || !strings.HasPrefix(keys[0], `tether-logins="ops" ssh-ed25519 `) ||
		!strings.HasSuffix(keys[0], " alice") ||
		strings.HasPrefix(keys[1], "tether-logins") || !strings.HasSuffix(keys[1], " root") {
		t.Errorf("KeysFor(berlin) = %q, want alice for ops, root for any login", keys)
	}
	if keys := snap.KeysFor(map[string]string{"site": "munich"}); len(keys) != 1 || !strings.HasSuffix(keys[0], " root") {
		t.Errorf("KeysFor(munich) = %q, want root only", keys)
	}
	per, anyLogin := snap.PrincipalsFor(berlin)
	if !slices.Equal(per["ops"], []string{"tether:berlin-ops:ops"}) ||
		!slices.Equal(per["root"], []string{ProvisionPrincipal}) ||
		// "admin" and "all" are built in.
		!slices.Equal(anyLogin, []string{"tether:admin:*", "tether:all:*", "tether:everything:*"}) {
		t.Errorf("PrincipalsFor(berlin) = %v, any %v", per, anyLogin)
	}
	per, _ = snap.PrincipalsFor(map[string]string{"site": "munich", ProvisionLoginLabel: "deploy"})
	if !slices.Equal(per["deploy"], []string{ProvisionPrincipal}) || len(per["root"]) != 0 {
		t.Errorf("PrincipalsFor(munich, provision-login=deploy) = %v: the provisioning principal belongs to deploy only", per)
	}
}

func TestLoginGrant(t *testing.T) {
	f := newFixture(t)
	if _, p, err := f.door.LoginGrant("alice"); err != nil || !slices.Equal(p, []string{"tether:berlin-ops:ops"}) {
		t.Errorf("LoginGrant(alice) = %q, %v", p, err)
	}
	if _, _, err := f.door.LoginGrant("nobody"); !errors.Is(err, ErrDenied) {
		t.Errorf("LoginGrant(nobody) = %v, want denied: no roles, nothing to certify", err)
	}
}

func TestReloadKeepsNewest(t *testing.T) {
	f := newFixture(t)
	before := f.door.Snapshot().Generation
	s, err := f.door.Reload(context.Background())
	if err != nil || s.Generation <= before || f.door.Snapshot() != s {
		t.Fatalf("Reload: gen %d -> %v, %v", before, s, err)
	}
}

// An operator with several keys logs in with any of them, a certificate
// over any of them works, and each key is pushed to the nodes; a removed
// key stops all of that at the next reload.
func TestSeveralKeys(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	first, second := f.keys["alice"].PublicKey(), newKey(t).PublicKey()
	if err := f.st.AddOperatorKey(ctx, "alice", store.OperatorKey{PublicKey: string(gossh.MarshalAuthorizedKey(second)),
		Fingerprint: gossh.FingerprintSHA256(second), AddedAt: time.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	certOver := func(k gossh.PublicKey) *gossh.Certificate {
		c, err := f.userCA.SignUser(k, UserCertKeyIDPrefix+"alice", []string{CertPrincipal("berlin-ops", "ops")}, time.Hour)
		if err != nil {
			t.Fatal(err)
		}
		return c
	}
	for _, k := range []gossh.PublicKey{first, second, certOver(first), certOver(second)} {
		if err := f.door.AuthorizeLogin("alice", k); err != nil {
			t.Errorf("AuthorizeLogin(alice, %s) = %v", k.Type(), err)
		}
	}
	keys := f.door.Snapshot().KeysFor(map[string]string{"site": "berlin"})
	if n := len(slices.DeleteFunc(keys, func(l string) bool { return !strings.HasSuffix(l, " alice") })); n != 2 {
		t.Errorf("KeysFor(berlin) has %d lines for alice, want 2: %q", n, keys)
	}
	if err := f.st.RemoveOperatorKey(ctx, "alice", gossh.FingerprintSHA256(first)); err != nil {
		t.Fatal(err)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.door.AuthorizeLogin("alice", first); !errors.Is(err, ErrDenied) {
		t.Errorf("removed key: %v, want denied", err)
	}
	if err := f.door.AuthorizeLogin("alice", certOver(first)); !errors.Is(err, ErrDenied) {
		t.Errorf("certificate over the removed key: %v, want denied", err)
	}
	if err := f.door.AuthorizeLogin("alice", second); err != nil {
		t.Errorf("remaining key: %v", err)
	}
}

// A live jump goes on while the operator, the key it was opened with and a
// role selecting the node remain, whatever the certificate's validity.
func TestAuthorizeLiveJump(t *testing.T) {
	f := newFixture(t)
	alice := f.keys["alice"].PublicKey()
	expired, err := f.userCA.SignUser(alice, UserCertKeyIDPrefix+"alice",
		[]string{CertPrincipal("berlin-ops", "ops")}, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	expired.ValidBefore = uint64(time.Now().Add(-time.Minute).Unix())
	berlin := store.Node{Name: "berlin-1", Labels: map[string]string{"site": "berlin"}}
	munich := store.Node{Name: "munich-1", Labels: map[string]string{"site": "munich"}}
	for _, tc := range []struct {
		name     string
		operator string
		key      gossh.PublicKey
		node     store.Node
		wantMsg  string // "" allowed
	}{
		{"still allowed", "alice", alice, berlin, ""},
		{"certificate expired since", "alice", expired, berlin, ""},
		{"role does not select the node", "alice", alice, munich, `do not select node "munich-1"`},
		{"key of another operator", "alice", f.keys["root"].PublicKey(), berlin, "was revoked"},
		{"no key", "alice", nil, berlin, "was revoked"},
		{"operator gone", "mallory", alice, berlin, `operator "mallory" was removed`},
	} {
		err := f.door.AuthorizeLiveJump(tc.operator, tc.key, tc.node)
		if tc.wantMsg == "" && err != nil || tc.wantMsg != "" &&
			(!errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), tc.wantMsg)) {
			t.Errorf("%s: AuthorizeLiveJump = %v, want %q", tc.name, err, tc.wantMsg)
		}
	}
}

// TestAuthorizeTerminal: a browser terminal needs a role that selects the
// node and allows the login there; the principals name each such role,
// and what takes the login away (a role removed) refuses it, as the
// terminal's re-check asks.
func TestAuthorizeTerminal(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	berlin := store.Node{Name: "berlin-1", Labels: map[string]string{"site": "berlin"}}
	munich := store.Node{Name: "munich-1", Labels: map[string]string{"site": "munich"}}
	for _, tc := range []struct {
		operator, login string
		node            store.Node
		principals      []string
		wantMsg         string
	}{
		{"alice", "ops", berlin, []string{"tether:berlin-ops:ops"}, ""},
		{"alice", "root", berlin, nil, `may not log in as "root" on node "berlin-1"; their roles allow: ops`},
		{"alice", "ops", munich, nil, `do not select node "munich-1"`},
		{"root", "anyone", munich, []string{"tether:everything:*"}, ""},
		{"nobody", "ops", berlin, nil, "do not select"},
		{"mallory", "ops", berlin, nil, `operator "mallory" is no longer registered`},
	} {
		p, err := f.door.AuthorizeTerminal(tc.operator, tc.login, tc.node)
		if tc.wantMsg == "" && (err != nil || !slices.Equal(p, tc.principals)) ||
			tc.wantMsg != "" && (!errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), tc.wantMsg) || p != nil) {
			t.Errorf("AuthorizeTerminal(%s, %s, %s) = %v, %v; want %v, %q",
				tc.operator, tc.login, tc.node.Name, p, err, tc.principals, tc.wantMsg)
		}
	}
	// alice also holds a role that selects berlin-1 with another login:
	// when berlin-ops goes, the node is still selected, "ops" no longer
	// allowed.
	view := store.Role{Name: "berlin-view", Nodes: "site=berlin", Logins: []string{"viewer"}}
	if err := f.st.PutRole(ctx, view); err != nil {
		t.Fatal(err)
	}
	if err := f.st.SetOperatorRoles(ctx, "alice", []string{"berlin-ops", "berlin-view"}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := f.door.AuthorizeTerminal("alice", "ops", berlin); err != nil {
		t.Fatalf("with both roles: %v", err)
	}
	if err := f.st.DeleteRole(ctx, "berlin-ops"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.door.AuthorizeJump("alice", berlin); err != nil {
		t.Fatalf("berlin-view still selects berlin-1: %v", err)
	}
	_, err := f.door.AuthorizeTerminal("alice", "ops", berlin)
	if !errors.Is(err, ErrDenied) || !strings.Contains(err.Error(), "allow: viewer") {
		t.Fatalf("after berlin-ops was removed: %v, want ops refused", err)
	}
}

// Same tells a re-read that found nothing changed from one that found a
// change, for every kind of row a snapshot is built from: that is what lets
// the hub's periodic re-read skip a push round over the fleet.
func TestSnapshotSame(t *testing.T) {
	ctx := context.Background()
	for _, tc := range []struct {
		name   string
		change func(t *testing.T, f *fixture) error
	}{
		{"a role", func(t *testing.T, f *fixture) error {
			return f.st.PutRole(ctx, store.Role{Name: "munich-ops", Nodes: "site=munich", Logins: []string{"ops"}})
		}},
		{"a role's logins", func(t *testing.T, f *fixture) error {
			return f.st.PutRole(ctx, store.Role{Name: "berlin-ops", Nodes: "site=berlin", Logins: []string{"ops", "deploy"}})
		}},
		{"an operator's roles", func(t *testing.T, f *fixture) error {
			return f.st.SetOperatorRoles(ctx, "nobody", []string{"berlin-ops"})
		}},
		{"an operator's keys", func(t *testing.T, f *fixture) error {
			k := newKey(t).PublicKey()
			return f.st.AddOperatorKey(ctx, "alice", store.OperatorKey{
				PublicKey: string(gossh.MarshalAuthorizedKey(k)), Fingerprint: gossh.FingerprintSHA256(k), AddedAt: time.Now(),
			})
		}},
		{"a removed operator (its keys revoked)", func(t *testing.T, f *fixture) error {
			return f.st.RemoveOperator(ctx, "nobody")
		}},
		{"a KubeOne cluster", func(t *testing.T, f *fixture) error {
			k := newKey(t).PublicKey()
			return f.st.CreateKubeOneCluster(ctx, store.KubeOneCluster{
				Name: "a", ID: "c1", Login: "root", Kubernetes: "1.30.5", CNI: "canal",
				PublicKey: string(gossh.MarshalAuthorizedKey(k)), Status: "created", CreatedAt: time.Now(),
				Members: []store.KubeOneMember{{NodeID: "id-berlin", Role: "control-plane"}},
			})
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			first := f.door.Snapshot()
			again, err := f.door.Reload(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if !again.Same(first) || again.Generation == first.Generation {
				t.Fatalf("a re-read of unchanged rows: Same = %v (generations %d, %d), "+
					"want a new generation that is the same", again.Same(first), first.Generation, again.Generation)
			}
			if err := tc.change(t, f); err != nil {
				t.Fatal(err)
			}
			changed, err := f.door.Reload(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if changed.Same(again) {
				t.Errorf("after %s changed, the re-read snapshot is the Same as before", tc.name)
			}
		})
	}
	var none *Snapshot
	if none.Same(none) {
		t.Error("nil snapshots are the Same")
	}
}
