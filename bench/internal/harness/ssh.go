package harness

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/user"
	"strings"
	"time"
)

// SSHDPath is Debian's OpenSSH server.
const SSHDPath = "/usr/sbin/sshd"

// SSHD is a running OpenSSH sshd on loopback.
type SSHD struct {
	*Proc
	Port int
	Addr string
}

// OperatorKey creates (once) an ed25519 key pair for the operator and
// returns the private key path.
func (e *Env) OperatorKey(ctx context.Context) (string, error) {
	p := e.Path("operator")
	if _, err := os.Stat(p); err == nil {
		return p, nil
	}
	_, err := Run(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "bench-operator", "-f", p)
	return p, err
}

// Login is the local user name (the login on the node sshd).
func Login() string {
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return "root"
}

// StartSSHD runs a stock sshd on 127.0.0.1 that trusts the operator key.
// extra lines are appended to its sshd_config.
func (e *Env) StartSSHD(ctx context.Context, name string, extra ...string) (*SSHD, error) {
	key, err := e.OperatorKey(ctx)
	if err != nil {
		return nil, err
	}
	if os.Geteuid() == 0 {
		_ = os.MkdirAll("/run/sshd", 0o755) // privilege separation directory
	}
	dir := e.Path(name)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	if _, err := Run(ctx, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", dir+"/hostkey"); err != nil {
		return nil, err
	}
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		return nil, err
	}
	if err := os.WriteFile(dir+"/authorized_keys", pub, 0o600); err != nil {
		return nil, err
	}
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	conf := fmt.Sprintf(`Port %d
ListenAddress 127.0.0.1
HostKey %s/hostkey
AuthorizedKeysFile %s/authorized_keys
PidFile none
UsePAM no
StrictModes no
PermitRootLogin prohibit-password
PasswordAuthentication no
KbdInteractiveAuthentication no
AllowTcpForwarding yes
MaxStartups 1000:30:2000
MaxSessions 100
%s
`, port, dir, dir, strings.Join(extra, "\n"))
	if err := os.WriteFile(dir+"/sshd_config", []byte(conf), 0o600); err != nil {
		return nil, err
	}
	p, err := e.Start(name, SSHDPath, "-D", "-e", "-f", dir+"/sshd_config")
	if err != nil {
		return nil, err
	}
	s := &SSHD{Proc: p, Port: port, Addr: fmt.Sprintf("127.0.0.1:%d", port)}
	err = WaitFor(ctx, 10*time.Second, name+" to listen", func() bool {
		c, err := net.DialTimeout("tcp", s.Addr, time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	if err != nil {
		return nil, fmt.Errorf("%w: %s", err, p.Tail(1000))
	}
	return s, nil
}

// SSHConfig writes an ssh_config for the operator key (aes128-gcm, no host
// key checks on this throwaway loopback setup) and returns its path.
func (e *Env) SSHConfig(ctx context.Context) (string, error) {
	key, err := e.OperatorKey(ctx)
	if err != nil {
		return "", err
	}
	p := e.Path("ssh_config")
	conf := fmt.Sprintf(`Host *
  IdentityFile %s
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
  Ciphers aes128-gcm@openssh.com
  Compression no
  ControlMaster no
`, key)
	return p, os.WriteFile(p, []byte(conf), 0o600)
}
