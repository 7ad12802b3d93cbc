package sshdconf

import (
	"testing"
	"os"
	"os/exec"
	"golang.org/x/crypto/ssh"
)

func TestExplore(t *testing.T) {
	e := newSSHDEnv(t)
	e.apply(e.files())
	other := newKey(t)
	c := signCert(t, e.hostCA, other.pub(), ssh.HostCert, []string{"n1"}, certOpts{})
	os.WriteFile(e.paths.HostCertPath(), ssh.MarshalAuthorizedKey(c), 0644)
	e.start()
	out, err := exec.Command(sshdPath, "-t", "-d", "-f", e.cfg).CombinedOutput()
	t.Logf("%v %s", err, out)
	op := e.newClient("op", e.userCA, certOpts{})
	o, err := e.ssh(op)
	t.Logf("login: %v %s\n%s", err, o, e.logs)
}
