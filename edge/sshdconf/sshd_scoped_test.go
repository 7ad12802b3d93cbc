package sshdconf

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/internal/validate"
)

// TestSSHDScopedUserCAs: the user CA of a hub above the node's site hub is
// accepted by a real sshd only for the principals that hub grants on the
// node (a cert-authority,principals="…" line in the managed
// AuthorizedKeysFile), never through TrustedUserCAKeys: its certificate
// naming a principal the site grants its own operators is refused, which
// trusting the ancestor's CA in TrustedUserCAKeys would accept.
func TestSSHDScopedUserCAs(t *testing.T) {
	e := newSSHDEnv(t)
	if err := validate.Login(e.user); err != nil {
		t.Skipf("the test logs in as the current user, which is no valid login here: %v", err)
	}
	rootCA := testenv.NewKey(t)
	sitePrincipal, rootPrincipal := "tether:site-admin:"+e.user, "tether:pos:"+e.user
	f := e.files()
	f.Principals = map[string][]string{e.user: {sitePrincipal}}
	f.ScopedCAs = []ScopedCA{
		{Keys: []ssh.PublicKey{rootCA.Pub()}, Principals: map[string][]string{e.user: {rootPrincipal}}},
	}
	e.apply(f)
	e.start()

	rootPos := e.newClient("root-pos", rootCA, testenv.CertOpts{Principals: []string{rootPrincipal}})
	rootAdmin := e.newClient("root-admin", rootCA, testenv.CertOpts{Principals: []string{sitePrincipal}})
	siteAdmin := e.newClient("site-admin", e.userCA, testenv.CertOpts{Principals: []string{sitePrincipal}})
	sitePos := e.newClient("site-pos", e.userCA, testenv.CertOpts{Principals: []string{rootPrincipal}})
	t.Run("ancestor CA with the principal it grants here", func(t *testing.T) { e.on(t).mustLogin(rootPos) })
	t.Run("ancestor CA with a principal it did not grant", func(t *testing.T) { e.on(t).mustFail(rootAdmin, userRefused) })
	t.Run("site CA with its own principal", func(t *testing.T) { e.on(t).mustLogin(siteAdmin) })
	t.Run("site CA with the ancestor's principal", func(t *testing.T) { e.on(t).mustFail(sitePos, userRefused) })
	t.Run("ancestor CA not in TrustedUserCAKeys", func(t *testing.T) {
		b, err := os.ReadFile(e.paths.UserCAsPath())
		if err != nil || strings.Contains(string(b), strings.TrimSpace(string(ssh.MarshalAuthorizedKey(rootCA.Pub())))) {
			t.Fatalf("TrustedUserCAKeys holds the ancestor's CA (%v):\n%s", err, b)
		}
	})
	t.Run("ancestor CA with an any-login principal", func(t *testing.T) {
		e := e.on(t)
		e.paths.PrincipalsCommandUser = e.user // sshd not running as root runs the command as itself
		f.ScopedCAs[0].AnyLogin = []string{"tether:all:*"}
		e.apply(f)
		e.reload()
		e.mustLogin(e.newClient("root-all", rootCA, testenv.CertOpts{Principals: []string{"tether:all:*"}}))
		e.mustLogin(rootPos)
	})
	t.Run("withdrawn", func(t *testing.T) {
		e := e.on(t)
		f.ScopedCAs = nil
		if !e.apply(f) {
			t.Fatal("Apply reported no change")
		}
		if _, err := os.Stat(filepath.Join(e.paths.AuthorizedKeysDir(), e.user)); !os.IsNotExist(err) {
			t.Errorf("managed authorized keys of %s still there: %v", e.user, err)
		}
		e.reload()
		e.mustFail(rootPos, userRefused)
		e.mustLogin(siteAdmin)
	})
}

func TestScopedLines(t *testing.T) {
	ca := testenv.NewKey(t)
	key := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(ca.Pub())))
	per, anyLogin, skipped := scopedLines([]ScopedCA{{Keys: []ssh.PublicKey{ca.Pub()},
		Principals:   map[string][]string{"root": {"tether:b:root", "tether:a:root", "bad,one"}, "../x": {"p"}},
		AnyLogin:     []string{"tether:all:*"},
		NoForwarding: []string{"tether:b:root"}}})
	want := `cert-authority,principals="tether:a:root" ` + key + "\n" +
		`cert-authority,principals="tether:b:root",no-port-forwarding ` + key + "\n"
	if string(per["root"]) != want {
		t.Errorf("root:\n%s\nwant\n%s", per["root"], want)
	}
	if _, ok := per["../x"]; ok {
		t.Error("a login that is no file name was written")
	}
	if string(anyLogin) != `cert-authority,principals="tether:all:*" `+key+"\n" {
		t.Errorf("any login: %s", anyLogin)
	}
	if len(skipped) != 2 {
		t.Errorf("skipped %v, want the bad principal and the bad login", skipped)
	}
}
