package testenv

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"golang.org/x/crypto/ssh"
)

func TestPoll(t *testing.T) {
	n := 0
	if err := Poll(
		context.Background(), 5*time.Second, "three calls", func() bool { n++; return n == 3 },
	); err != nil || n != 3 {
		t.Fatalf("Poll: %v after %d calls", err, n)
	}
	err := Poll(context.Background(), 100*time.Millisecond, "the impossible", func() bool { return false })
	if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "the impossible") {
		t.Fatalf("Poll that cannot succeed: %v; want ErrTimeout naming what it waited for", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := Poll(ctx, time.Minute, "a cancelled wait", func() bool { return false }); !errors.Is(err, context.Canceled) {
		t.Fatalf("Poll with a cancelled context: %v", err)
	}
}

func TestPickPort(t *testing.T) {
	port := FreePort(t)
	l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		t.Fatalf("port %d from FreePort is not free: %v", port, err)
	}
	l.Close()
}

// TestPickPorts: no port is returned twice in a process, within one call
// or across calls, and each is free on TCP and UDP. Without the memory of
// ports handed out, 300 single picks here repeated a port 1 to 11 times
// (two picks for one hub's --listen and --ssh-listen once matched in CI),
// so 600 picks fail without it.
func TestPickPorts(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		ports := FreePorts(t, 3)
		for _, p := range ports {
			if seen[p] {
				t.Fatalf("FreePorts(3) = %v: %d was returned before", ports, p)
			}
			seen[p] = true
			u, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", p))
			if err != nil {
				t.Fatalf("port %d from FreePorts is not free on UDP: %v", p, err)
			}
			u.Close()
		}
	}
}

// TestStartSSHD logs in to the real sshd with a user certificate and checks
// its host certificate, as the runner and sshdconf tests do.
func TestStartSSHD(t *testing.T) {
	hostCA, userCA := NewKey(t), NewKey(t)
	dir := t.TempDir()
	hostKey := NewKeyFile(t, dir+"/host_key")
	s := StartSSHD(t, SSHDConfig{Dir: dir, HostKey: hostKey,
		HostCert:       SignCert(t, hostCA, hostKey.Pub(), ssh.HostCert, CertOpts{Principals: []string{"127.0.0.1"}}),
		TrustedUserCAs: []ssh.PublicKey{userCA.Pub()}})

	login := LoginName()
	user := NewKey(t)
	cert := SignCert(t, userCA, user.Pub(), ssh.UserCert, CertOpts{Principals: []string{login}})
	signer, err := ssh.NewCertSigner(cert, user.Signer)
	if err != nil {
		t.Fatal(err)
	}
	checker := &ssh.CertChecker{IsHostAuthority: func(k ssh.PublicKey, _ string) bool {
		return bytes.Equal(k.Marshal(), hostCA.Pub().Marshal())
	}}
	c, err := ssh.Dial("tcp", s.Addr, &ssh.ClientConfig{User: login, Auth: []ssh.AuthMethod{ssh.PublicKeys(signer)},
		HostKeyCallback: checker.CheckHostKey, Timeout: 10 * time.Second})
	if err != nil {
		t.Fatalf("log in to the test sshd with a user certificate: %v", err)
	}
	defer c.Close()
	sess, err := c.NewSession()
	if err != nil {
		t.Fatal(err)
	}
	defer sess.Close()
	out, err := sess.Output("echo ok")
	if err != nil || string(out) != "ok\n" {
		t.Fatalf("command on the test sshd: %q %v", out, err)
	}
	if s.LogCount("Accepted certificate ID") == 0 {
		t.Errorf("sshd did not log the certificate login:\n%s", s.Log())
	}
}
