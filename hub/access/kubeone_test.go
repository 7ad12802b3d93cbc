package access

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/store"
	"github.com/tether-dev/tether/internal/testenv"
)

// TestKubeOneIdentity: a KubeOne cluster's key (or its certificate) logs
// in to the bastion as the cluster's user only, jumps to its members only,
// and is pushed to its members only, for its login; operators are not
// affected; a member that leaves ends its live jumps.
func TestKubeOneIdentity(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	ka := newKey(t)
	c := store.KubeOneCluster{
		Name:       "a",
		ID:         "c1",
		Kubernetes: "1.30.5",
		Login:      "root",
		CNI:        "canal",
		Status:     "created",
		CreatedAt:  time.Now(),
		PublicKey:  strings.TrimSpace(string(gossh.MarshalAuthorizedKey(ka.PublicKey()))),
		Members:    []store.KubeOneMember{{NodeID: "id-berlin", Role: store.KubeOneControlPlane}},
	}
	if err := f.st.CreateKubeOneCluster(ctx, c); err != nil {
		t.Fatal(err)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	user := KubeOneBastionUser("a")
	cert := func(keyID string, principals []string, key gossh.PublicKey, ttl time.Duration) *gossh.Certificate {
		cc, err := f.userCA.SignUser(key, keyID, principals, ttl)
		if err != nil {
			t.Fatal(err)
		}
		return cc
	}
	good := cert(KubeOneCertKeyIDPrefix+"c1", []string{KubeOnePrincipal("c1", "root")}, ka.PublicKey(), time.Hour)
	other := testenv.NewKey(t)
	foreign := testenv.SignCert(
		t, other, ka.PublicKey(), gossh.UserCert,
		testenv.CertOpts{KeyID: KubeOneCertKeyIDPrefix + "c1", Principals: []string{KubeOnePrincipal("c1", "root")}},
	)
	expired := cert(KubeOneCertKeyIDPrefix+"c1", []string{KubeOnePrincipal("c1", "root")}, ka.PublicKey(), time.Hour)
	expired.ValidBefore = uint64(time.Now().Add(-time.Minute).Unix())
	for _, tc := range []struct {
		name string
		user string
		key  gossh.PublicKey
		ok   bool
	}{
		{"cluster key as the cluster's user", user, ka.PublicKey(), true},
		{"cluster certificate", user, good, true},
		{"cluster key as an operator", "alice", ka.PublicKey(), false},
		{"cluster key as another cluster's user", KubeOneBastionUser("b"), ka.PublicKey(), false},
		{"an operator's key as the cluster's user", user, f.keys["root"].PublicKey(), false},
		{"certificate of a former cluster of the name", user,
			cert(KubeOneCertKeyIDPrefix+"c0", []string{KubeOnePrincipal("c0", "root")}, ka.PublicKey(), time.Hour), false},
		{"certificate for another login", user,
			cert(KubeOneCertKeyIDPrefix+"c1", []string{KubeOnePrincipal("c1", "ops")}, ka.PublicKey(), time.Hour), false},
		{"certificate from another CA", user, foreign, false},
		{"expired certificate", user, expired, false},
		{"operator unaffected", "alice", f.keys["alice"].PublicKey(), true},
	} {
		if err := f.door.AuthorizeLogin(tc.user, tc.key); (err == nil) != tc.ok {
			t.Errorf("%s: AuthorizeLogin = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}

	berlin, _, _ := f.door.Resolve(ctx, ByID("id-berlin"))
	munich, _, _ := f.door.Resolve(ctx, ByID("id-munich"))
	for _, tc := range []struct {
		name string
		user string
		key  gossh.PublicKey
		node store.Node
		ok   bool
	}{
		{"member", user, ka.PublicKey(), berlin, true},
		{"member with the certificate", user, good, berlin, true},
		{"non-member", user, ka.PublicKey(), munich, false},
		{"operator selecting every node", "root", f.keys["root"].PublicKey(), munich, true},
		{"operator whose role does not select", "alice", f.keys["alice"].PublicKey(), munich, false},
	} {
		if err := f.door.AuthorizeJumpAs(tc.user, tc.key, tc.node); (err == nil) != tc.ok {
			t.Errorf("%s: AuthorizeJumpAs = %v, want ok=%v", tc.name, err, tc.ok)
		}
	}
	if err := f.door.AuthorizeJumpAs(user, ka.PublicKey(), munich); err == nil ||
		!strings.Contains(err.Error(), `node "munich-1" is not a member of KubeOne cluster "a"`) {
		t.Errorf("refusal reads %v", err)
	}

	snap := f.door.Snapshot()
	keys := snap.KubeOneKeysFor("id-berlin")
	if len(keys) != 1 || !strings.HasPrefix(keys[0], `tether-logins="root" ssh-ed25519 `) ||
		!strings.HasSuffix(keys[0], " kubeone-a") {
		t.Errorf("member keys %q", keys)
	}
	if login, p, ok := snap.KubeOnePrincipalFor("id-berlin"); !ok || login != "root" || p != "tether:kubeone:c1:root" {
		t.Errorf("member principal %q %q %v", login, p, ok)
	}
	if k := snap.KubeOneKeysFor("id-munich"); k != nil {
		t.Errorf("non-member is sent %q", k)
	}
	if _, _, ok := snap.KubeOnePrincipalFor("id-munich"); ok {
		t.Error("non-member is sent the principal")
	}

	// berlin leaves: its live jump ends at the next reload.
	if err := f.door.AuthorizeLiveJump(user, ka.PublicKey(), berlin); err != nil {
		t.Fatalf("live jump of a member: %v", err)
	}
	if err := f.st.SetKubeOneMembers(ctx, "a",
		[]store.KubeOneMember{{NodeID: "id-munich", Role: store.KubeOneControlPlane}}, time.Now()); err != nil {
		t.Fatal(err)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.door.AuthorizeLiveJump(user, ka.PublicKey(), berlin); !errors.Is(err, ErrDenied) {
		t.Errorf("live jump of a member that left: %v, want denied", err)
	}
	if err := f.st.DeleteKubeOneCluster(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := f.door.Reload(ctx); err != nil {
		t.Fatal(err)
	}
	if err := f.door.AuthorizeLogin(user, ka.PublicKey()); !errors.Is(err, ErrDenied) {
		t.Errorf("login of a deleted cluster: %v, want denied", err)
	}
	if err := f.door.AuthorizeLiveJump(user, ka.PublicKey(), munich); !errors.Is(err, ErrDenied) {
		t.Errorf("live jump of a deleted cluster: %v, want denied", err)
	}
}
