package sshdconf

import (
	"errors"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
	"github.com/tether-dev/tether/internal/validate"
)

// A login the principals directory cannot hold a file for — a role login
// ending in '$' — used to make Apply return before it wrote the revoked
// keys: a removed operator kept logging in to a managed sshd. Now the bad
// login is left out and the revocation still reaches sshd.
func TestSSHDRevocationDespiteBadLogin(t *testing.T) {
	e := newSSHDEnv(t)
	if err := validate.Login(e.user); err != nil {
		t.Skipf("the test logs in as the current user, which is no valid login here: %v", err)
	}
	withPrincipals := func(revoked ...ssh.PublicKey) Files {
		f := e.files(revoked...)
		f.Principals = map[string][]string{e.user: {e.user}}
		return f
	}
	e.apply(withPrincipals())
	e.start()
	op := e.newClient("op", e.userCA, testenv.CertOpts{})
	e.mustLogin(op)

	// The operator is removed while a role grants a login sshd cannot
	// have a principals file for.
	f := withPrincipals(op.key.Pub())
	f.Principals["machine$"] = []string{"tether:samba:machine$"}
	f.Principals["first.last"] = []string{"tether:ops:first.last"}
	_, err := Apply(e.paths, f)
	e.reload()

	deadline := time.Now().Add(10 * time.Second)
	for {
		out, sshErr := e.ssh(op)
		if sshErr != nil && strings.Contains(out, userRefused) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the removed operator's key still logs in (Apply: %v; ssh: %v):\n%s", err, sshErr, out)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if !errors.Is(err, ErrSkipped) || !strings.Contains(err.Error(), `"machine$"`) {
		t.Errorf("Apply = %v, want ErrSkipped naming the login machine$", err)
	}
	if errors.Is(err, ErrInvalid) {
		t.Errorf("Apply = %v: a skipped login is not invalid input (nothing would have been written)", err)
	}
	// The valid logins kept their files, the bad one has none.
	if b, err := os.ReadFile(e.paths.PrincipalsDir() + "/first.last"); err != nil ||
		string(b) != "tether:ops:first.last\n" {
		t.Errorf("principals of first.last = %q, %v", b, err)
	}
	if _, err := os.Stat(e.paths.PrincipalsDir() + "/machine$"); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("principals file for machine$: %v, want none", err)
	}
	// Another operator, not revoked, still logs in: the principals of the
	// current user survived.
	e.mustLogin(e.newClient("colleague", e.userCA, testenv.CertOpts{}))
}
