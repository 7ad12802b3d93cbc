package testenv

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/crypto/ssh"
)

// SSHDPath is Debian's OpenSSH server. It must be absolute: sshd
// re-executes itself from argv[0] for every connection and on SIGHUP.
const SSHDPath = "/usr/sbin/sshd"

// SSHDConfig describes a real sshd on 127.0.0.1.
type SSHDConfig struct {
	// Dir holds sshd_config, the host key, sshd.pid, authorized_keys and
	// the user CA file. StartSSHD makes a temporary one if empty.
	Dir string
	// Include is a glob sshd_config includes first (a drop-in directory's
	// *.conf), so that what it sets wins. "" includes nothing.
	Include string
	// Lines are more configuration lines. They come before the defaults,
	// so they win: sshd keeps the first value it reads of a keyword.
	Lines []string
	// HostKey is the host key; nil makes one at Dir/ssh_host_ed25519_key.
	HostKey *Key
	// HostCert, if set, is presented with the host key.
	HostCert *ssh.Certificate
	// AuthorizedKeys is the authorized_keys file's content for every user;
	// nil sets AuthorizedKeysFile none.
	AuthorizedKeys []byte
	// TrustedUserCAs are trusted for user certificates.
	TrustedUserCAs []ssh.PublicKey
}

// SSHD is a running sshd.
type SSHD struct {
	*Proc
	Port    int
	Addr    string // 127.0.0.1:Port
	Dir     string
	Config  string // sshd_config
	HostKey *Key
	// PidFile holds sshd's pid (written by the harness at start), for
	// whatever reloads it with SIGHUP.
	PidFile string
}

// prepare writes the host key, certificate and key files of cfg.
func (cfg *SSHDConfig) prepare() error {
	if cfg.Dir == "" {
		return errors.New("testenv: SSHDConfig.Dir is empty")
	}
	// sshd reads principals files as the login user, as it would in /etc/ssh.
	if err := os.MkdirAll(cfg.Dir, 0o755); err != nil {
		return fmt.Errorf("testenv: sshd directory: %w", err)
	}
	_ = os.Chmod(cfg.Dir, 0o755)
	if cfg.HostKey == nil {
		k, err := WriteKey(filepath.Join(cfg.Dir, "ssh_host_ed25519_key"))
		if err != nil {
			return err
		}
		cfg.HostKey = k
	}
	if cfg.HostCert != nil {
		if err := os.WriteFile(cfg.HostKey.Path+"-cert.pub", ssh.MarshalAuthorizedKey(cfg.HostCert), 0o644); err != nil {
			return fmt.Errorf("testenv: host certificate: %w", err)
		}
	}
	if cfg.AuthorizedKeys != nil {
		if err := os.WriteFile(filepath.Join(cfg.Dir, "authorized_keys"), cfg.AuthorizedKeys, 0o600); err != nil {
			return fmt.Errorf("testenv: authorized_keys: %w", err)
		}
	}
	if len(cfg.TrustedUserCAs) > 0 {
		var b []byte
		for _, ca := range cfg.TrustedUserCAs {
			b = append(b, ssh.MarshalAuthorizedKey(ca)...)
		}
		if err := os.WriteFile(filepath.Join(cfg.Dir, "user_ca.pub"), b, 0o644); err != nil {
			return fmt.Errorf("testenv: user CA file: %w", err)
		}
	}
	return nil
}

// WriteSSHDConfig writes Dir/sshd_config for port (and the files it
// names) and returns its path.
func WriteSSHDConfig(cfg *SSHDConfig, port int) (string, error) {
	if err := cfg.prepare(); err != nil {
		return "", err
	}
	var b strings.Builder
	if cfg.Include != "" {
		fmt.Fprintf(&b, "Include %s\n", cfg.Include)
	}
	for _, l := range cfg.Lines {
		b.WriteString(l + "\n")
	}
	fmt.Fprintf(&b, "Port %d\nListenAddress 127.0.0.1\nHostKey %s\n", port, cfg.HostKey.Path)
	if cfg.HostCert != nil {
		fmt.Fprintf(&b, "HostCertificate %s-cert.pub\n", cfg.HostKey.Path)
	}
	if cfg.AuthorizedKeys != nil {
		fmt.Fprintf(&b, "AuthorizedKeysFile %s\n", filepath.Join(cfg.Dir, "authorized_keys"))
	} else {
		b.WriteString("AuthorizedKeysFile none\n")
	}
	if len(cfg.TrustedUserCAs) > 0 {
		fmt.Fprintf(&b, "TrustedUserCAKeys %s\n", filepath.Join(cfg.Dir, "user_ca.pub"))
	}
	fmt.Fprintf(&b, `PidFile none
UsePAM no
StrictModes no
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
Subsystem sftp internal-sftp
LogLevel VERBOSE
# bash sources ~/.bashrc for sshd sessions; the machine's dotfiles (pyenv
# and the like, slow or waiting on locks on a shared machine) are not what
# these tests measure.
SetEnv HOME=%s
`, cfg.Dir)
	path := filepath.Join(cfg.Dir, "sshd_config")
	if err := os.WriteFile(path, []byte(b.String()), 0o644); err != nil {
		return "", fmt.Errorf("testenv: write sshd_config: %w", err)
	}
	return path, nil
}

// Starter starts a process under a name; LaunchSSHD uses it so that the
// caller keeps track of what runs (a test's cleanup, bench's Env).
type Starter func(name string, cmd *exec.Cmd) (*Proc, error)

// LaunchSSHD starts `sshd -D -e` for cfg on a free port and waits until it
// listens. A port picked free may be taken before sshd binds it; sshd then
// exits and another port is tried.
func LaunchSSHD(cfg SSHDConfig, name string, start Starter) (*SSHD, error) {
	if _, err := os.Stat(SSHDPath); err != nil {
		return nil, fmt.Errorf("testenv: %s not found: install openssh-server: %w", SSHDPath, err)
	}
	if os.Geteuid() == 0 {
		// Privilege separation directory; Debian creates it at boot.
		if err := os.MkdirAll("/run/sshd", 0o755); err != nil {
			return nil, fmt.Errorf("testenv: %w", err)
		}
	}
	var lastErr error
	for range 3 {
		port, err := PickPort()
		if err != nil {
			return nil, err
		}
		path, err := WriteSSHDConfig(&cfg, port)
		if err != nil {
			return nil, err
		}
		p, err := start(name, exec.Command(SSHDPath, "-D", "-e", "-f", path))
		if err != nil {
			return nil, err
		}
		if lastErr = p.WaitLog("Server listening on", 1, 10*time.Second); lastErr != nil {
			p.Stop(syscall.SIGTERM, 5*time.Second)
			continue
		}
		pidFile := filepath.Join(cfg.Dir, "sshd.pid")
		if err := os.WriteFile(pidFile, []byte(fmt.Sprint(p.PID())), 0o644); err != nil {
			return nil, fmt.Errorf("testenv: sshd pid file: %w", err)
		}
		return &SSHD{Proc: p, Port: port, Addr: fmt.Sprintf("127.0.0.1:%d", port), Dir: cfg.Dir,
			Config: path, HostKey: cfg.HostKey, PidFile: pidFile}, nil
	}
	return nil, fmt.Errorf("testenv: sshd did not start: %w", lastErr)
}

// StartSSHD is LaunchSSHD for tests (Dir defaults to a temporary one);
// sshd stops at cleanup and its log is shown if the test failed.
func StartSSHD(t T, cfg SSHDConfig) *SSHD {
	t.Helper()
	if cfg.Dir == "" {
		cfg.Dir = t.TempDir()
	}
	logs := t.TempDir()
	s, err := LaunchSSHD(cfg, "sshd", func(name string, cmd *exec.Cmd) (*Proc, error) {
		p, err := StartProc(name, filepath.Join(logs, name+".log"), cmd)
		if err == nil {
			t.Cleanup(func() {
				p.Stop(syscall.SIGTERM, 5*time.Second)
				if t.Failed() {
					t.Logf("---- sshd log ----\n%s", p.Tail(6000))
				}
			})
		}
		return p, err
	})
	if err != nil {
		t.Fatalf("%v", err)
	}
	return s
}
