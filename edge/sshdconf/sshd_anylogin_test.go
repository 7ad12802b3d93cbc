package sshdconf

import (
	"os"
	"strings"
	"testing"

	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/internal/validate"
)

// A role allowing any login ("*", as the built-in role "all") used to reach
// nothing on a managed sshd: only per-login principals files were written,
// and no login has a file for "*". Its principals now reach every account
// sshd lets log in, through the AuthorizedPrincipalsCommand; principals of
// no role, and any-login principals withdrawn by the hub, do not.
func TestSSHDAnyLoginPrincipals(t *testing.T) {
	e := newSSHDEnv(t)
	if err := validate.Login(e.user); err != nil {
		t.Skipf("the test logs in as the current user, which is no valid login here: %v", err)
	}
	// sshd not running as root runs the command as itself.
	e.paths.PrincipalsCommandUser = e.user
	f := e.files()
	f.Principals = map[string][]string{"someone-else": {"tether:ops:someone-else"}}
	f.AnyLogin = []string{"tether:all:*", "tether:everything:*"}
	e.apply(f)
	e.start()

	all := e.newClient("all", e.userCA, testenv.CertOpts{Principals: []string{"tether:all:*"}})
	ops := e.newClient("ops", e.userCA, testenv.CertOpts{Principals: []string{"tether:ops:someone-else"}})
	t.Run("any-login principal logs in as an account without a principals file", func(t *testing.T) {
		e.on(t).mustLogin(all)
	})
	t.Run("another login's principal does not", func(t *testing.T) {
		e.on(t).mustFail(ops, userRefused)
	})
	t.Run("withdrawn any-login principal no longer logs in", func(t *testing.T) {
		e := e.on(t)
		f.AnyLogin = []string{"tether:everything:*"}
		if !e.apply(f) {
			t.Fatal("Apply reported no change")
		}
		e.mustFail(all, userRefused)
	})
	t.Run("no any-login principals: no command", func(t *testing.T) {
		e := e.on(t)
		f.AnyLogin = nil
		e.apply(f)
		if b, _ := os.ReadFile(e.paths.DropIn); strings.Contains(string(b), "AuthorizedPrincipalsCommand") {
			t.Errorf("drop-in runs a principals command with no any-login principal:\n%s", b)
		}
		e.reload()
		e.mustFail(all, userRefused)
	})
}
