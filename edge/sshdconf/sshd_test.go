package sshdconf

// End-to-end tests against the real OpenSSH 9.2 sshd and ssh, on 127.0.0.1.

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
)

// on returns e bound to the subtest t, so helpers fail the right test.
func (e *sshdEnv) on(t *testing.T) *sshdEnv {
	c := *e
	c.t = t
	return &c
}

// Refusals as the ssh client prints them.
const (
	userRefused = "Permission denied (publickey)"
	hostRefused = "Host key verification failed"
)

func TestSSHDTrustsTetherPKI(t *testing.T) {
	e := newSSHDEnv(t)
	if !e.apply(e.files()) {
		t.Fatal("first Apply reported no change")
	}
	e.start()
	if err := CheckIncluded(e.cfg, e.paths.DropIn); err != nil {
		t.Fatalf("CheckIncluded on the test sshd_config: %v", err)
	}
	op := e.newClient("op", e.userCA, testenv.CertOpts{})

	t.Run("user certificate logs in", func(t *testing.T) {
		e := e.on(t)
		e.mustLogin(op)
		if !strings.Contains(e.sshd.Log(), "Accepted certificate ID") {
			t.Errorf("sshd did not log a certificate login:\n%s", e.sshd.Log())
		}
	})

	t.Run("certificate from another CA is refused", func(t *testing.T) {
		e := e.on(t)
		e.mustFail(e.newClient("stranger", testenv.NewKey(t), testenv.CertOpts{}), userRefused)
	})

	t.Run("expired certificate is refused", func(t *testing.T) {
		e := e.on(t)
		now := time.Now()
		expired := e.newClient("expired", e.userCA, testenv.CertOpts{
			ValidAfter:  now.Add(-2 * time.Hour),
			ValidBefore: now.Add(-time.Hour),
		})
		e.mustFail(expired, userRefused)
		if !strings.Contains(e.sshd.Log(), "Certificate invalid: expired") {
			t.Errorf("sshd did not log an expired certificate:\n%s", e.sshd.Log())
		}
	})

	t.Run("revoked key is refused after reload", func(t *testing.T) {
		e := e.on(t)
		if !e.apply(e.files(op.key.Pub())) {
			t.Fatal("Apply with a new revoked key reported no change")
		}
		e.reload()
		// The listener is back; poll until a connection sees the new state.
		deadline := time.Now().Add(10 * time.Second)
		for {
			out, err := e.ssh(op)
			if err != nil && strings.Contains(out, userRefused) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("revoked key still accepted (err %v):\n%s", err, out)
			}
			time.Sleep(100 * time.Millisecond)
		}
		if !strings.Contains(e.sshd.Log(), "revoked by file "+e.paths.RevokedKeysPath()) {
			t.Errorf("sshd did not log the revocation:\n%s", e.sshd.Log())
		}
		// Revocation is per key: another key with a certificate from the
		// same CA still logs in.
		e.mustLogin(e.newClient("colleague", e.userCA, testenv.CertOpts{}))
	})
}

func TestSSHDHostCertFromOtherCA(t *testing.T) {
	e := newSSHDEnv(t)
	rogue := testenv.NewKey(t)
	f := e.files()
	f.HostCert = testenv.SignCert(
		t, rogue, e.hostKey.Pub(), ssh.HostCert, testenv.CertOpts{Principals: []string{hostPrincipal}},
	)
	e.apply(f)
	e.start()

	op := e.newClient("op", e.userCA, testenv.CertOpts{})
	e.mustFail(op, hostRefused)

	// The certificate is served: a client trusting the rogue CA accepts it,
	// so the refusal above is the client checking the CA.
	op.knownHosts = e.knownHosts("rogue", rogue)
	e.mustLogin(op)
}

// TestSSHDReloadSemantics pins down what needs a reload with OpenSSH 9.2:
// sshd reads the files the drop-in names on every connection, but the
// drop-in itself only when it (re)starts.
func TestSSHDReloadSemantics(t *testing.T) {
	e := newSSHDEnv(t)
	f := e.files()
	e.apply(f)
	e.start()
	op := e.newClient("op", e.userCA, testenv.CertOpts{})
	e.mustLogin(op)

	// A CA rotation overlap, written into the same file: in effect for the
	// next connection, without a reload.
	ca2 := testenv.NewKey(t)
	op2 := e.newClient("op2", ca2, testenv.CertOpts{})
	e.mustFail(op2, userRefused)
	f.UserCAs = append(f.UserCAs, ca2.Pub())
	e.apply(f)
	e.mustLogin(op2)
	e.mustLogin(op)

	// The drop-in now points at another directory trusting only ca2: sshd
	// keeps using the old path until it is reloaded.
	old := e.paths
	e.paths.Dir = filepath.Join(e.dir, "tether-next")
	f.UserCAs = []ssh.PublicKey{ca2.Pub()}
	e.apply(f)
	if _, err := os.Stat(old.UserCAsPath()); err != nil {
		t.Fatal(err)
	}
	e.mustLogin(op)

	// A session open across the reload survives it: sshd re-executes only
	// the listener, and each connection is served by its own process.
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	long := exec.CommandContext(ctx, "ssh", append(e.sshArgs(op), "sleep 2; echo survived")...)
	var longOut strings.Builder
	long.Stdout, long.Stderr = &longOut, &longOut
	sessions := e.sshd.LogCount("Starting session: command")
	if err := long.Start(); err != nil {
		t.Fatal(err)
	}
	if err := e.sshd.WaitLog("Starting session: command", sessions+1, 10*time.Second); err != nil {
		t.Fatal(err)
	}

	n := e.sshd.LogCount("Server listening on")
	if err := PidFileReloader(filepath.Join(e.dir, "sshd.pid"))(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := e.sshd.WaitLog("Server listening on", n+1, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(e.sshd.Log(), "Received SIGHUP; restarting.") {
		t.Errorf("sshd did not log the SIGHUP:\n%s", e.sshd.Log())
	}
	e.mustFail(op, userRefused)
	e.mustLogin(op2)

	if err := long.Wait(); err != nil || !strings.Contains(longOut.String(), "survived") {
		t.Errorf("session across the reload: %v\n%s", err, longOut.String())
	}
}

func TestCheckConfig(t *testing.T) {
	needOpenSSH(t)
	if os.Geteuid() == 0 {
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			t.Fatal(err)
		}
	}
	e := newSSHDEnv(t)
	// Blanks in the paths must survive the drop-in's quoting.
	e.paths.Dir = filepath.Join(e.dir, "tether dir #1")
	e.apply(e.files())
	e.writeConfig(testenv.FreePort(t))
	if err := CheckConfig(context.Background(), e.cfg); err != nil {
		t.Fatalf("CheckConfig on a valid config: %v", err)
	}

	out, err := exec.Command(testenv.SSHDPath, "-T", "-f", e.cfg).CombinedOutput()
	if err != nil {
		t.Fatalf("sshd -T: %v\n%s", err, out)
	}
	for _, want := range []string{
		"trustedusercakeys " + e.paths.UserCAsPath(),
		"revokedkeys " + e.paths.RevokedKeysPath(),
		"hostcertificate " + e.paths.HostCertPath(),
	} {
		if !strings.Contains(string(out), want+"\n") {
			t.Errorf("sshd -T lacks %q:\n%s", want, out)
		}
	}

	testenv.WriteFile(t, e.paths.DropIn, []byte("NoSuchOption yes\n"), 0o644)
	err = CheckConfig(context.Background(), e.cfg)
	if err == nil || !strings.Contains(err.Error(), "NoSuchOption") {
		t.Fatalf("CheckConfig on a bad drop-in: %v, want sshd's complaint", err)
	}
}

func TestSignalReloaderRefusesSpecialPids(t *testing.T) {
	for _, pid := range []int{-1, 0, 1} {
		err := SignalReloader(pid)(context.Background())
		errorsIs(t, err, ErrInvalid)
	}
}

func TestPidFileReloaderErrors(t *testing.T) {
	dir := t.TempDir()
	if err := PidFileReloader(filepath.Join(dir, "missing.pid"))(context.Background()); err == nil {
		t.Error("missing pid file: no error")
	}
	bad := filepath.Join(dir, "bad.pid")
	testenv.WriteFile(t, bad, []byte("sshd\n"), 0o644)
	if err := PidFileReloader(bad)(context.Background()); err == nil {
		t.Error("garbage pid file: no error")
	}
	zero := filepath.Join(dir, "zero.pid")
	testenv.WriteFile(t, zero, []byte(fmt.Sprintln(0)), 0o644)
	errorsIs(t, PidFileReloader(zero)(context.Background()), ErrInvalid)
}
