package harness

import (
	"context"
	"fmt"
	"os"
	"os/exec"

	"github.com/tether-dev/tether/internal/testenv"
)

// SSHDPath is Debian's OpenSSH server.
const SSHDPath = testenv.SSHDPath

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
	_, err := testenv.WriteKey(p)
	return p, err
}

// Login is the local user name (the login on the node sshd).
func Login() string { return testenv.LoginName() }

// StartSSHD runs a stock sshd on 127.0.0.1 that trusts the operator key,
// sized for many connections. extra lines are added to its sshd_config
// (and win over the defaults).
func (e *Env) StartSSHD(ctx context.Context, name string, extra ...string) (*SSHD, error) {
	key, err := e.OperatorKey(ctx)
	if err != nil {
		return nil, err
	}
	pub, err := os.ReadFile(key + ".pub")
	if err != nil {
		return nil, err
	}
	var proc *Proc
	lines := append(append([]string{}, extra...), "AllowTcpForwarding yes", "MaxStartups 1000:30:2000",
		"MaxSessions 100", "LogLevel INFO")
	s, err := testenv.LaunchSSHD(testenv.SSHDConfig{Dir: e.Path(name), Lines: lines, AuthorizedKeys: pub}, name,
		func(name string, cmd *exec.Cmd) (*testenv.Proc, error) {
			p, err := e.StartCmd(name, cmd)
			if err != nil {
				return nil, err
			}
			proc = p
			return p.Proc, nil
		})
	if err != nil {
		return nil, fmt.Errorf("harness: %w", err)
	}
	return &SSHD{Proc: proc, Port: s.Port, Addr: s.Addr}, nil
}

// SSHConfig writes an ssh_config for the operator key (aes128-gcm, no host
// key checks on this throwaway loopback setup) and returns its path. The
// cipher is pinned so that figures compare across runs and machines.
func (e *Env) SSHConfig(ctx context.Context) (string, error) {
	return e.sshConfig(ctx, "ssh_config", "  Ciphers aes128-gcm@openssh.com\n")
}

// StockSSHConfig is SSHConfig without the cipher pin: each hop negotiates
// from OpenSSH's own preference (chacha20-poly1305 first), as an
// operator's unconfigured ssh does.
func (e *Env) StockSSHConfig(ctx context.Context) (string, error) {
	return e.sshConfig(ctx, "ssh_config_stock", "")
}

func (e *Env) sshConfig(ctx context.Context, name, ciphers string) (string, error) {
	key, err := e.OperatorKey(ctx)
	if err != nil {
		return "", err
	}
	p := e.Path(name)
	conf := fmt.Sprintf(`Host *
  IdentityFile %s
  IdentitiesOnly yes
  StrictHostKeyChecking no
  UserKnownHostsFile /dev/null
  LogLevel ERROR
  BatchMode yes
%s  Compression no
  ControlMaster no
`, key, ciphers)
	return p, os.WriteFile(p, []byte(conf), 0o600)
}
