package bulkonboard

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"strings"
	"time"

	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/crypto/ssh/knownhosts"
)

// Sentinel errors of one host's SSH connection; a Result's error wraps one
// of them when that step failed.
var (
	// ErrUnknownHost: the host's key is not in known_hosts. There is no
	// trust on first use: check the key and add it, then run again.
	ErrUnknownHost = errors.New("host key not in known_hosts")
	// ErrHostKeyChanged: known_hosts holds another key for the host (a
	// reinstalled machine, or someone in the middle).
	ErrHostKeyChanged = errors.New("host key differs from known_hosts")
	// ErrUnreachable: no TCP connection to the host's SSH port.
	ErrUnreachable = errors.New("SSH port unreachable")
	// ErrAuth: the host refused every key offered.
	ErrAuth = errors.New("SSH authentication refused")
)

// SSHConfig is how the admin's own SSH identity reaches the hosts.
type SSHConfig struct {
	// KnownHosts are known_hosts files (OpenSSH format, hashed or not).
	// At least one must exist; a host whose key is in none of them fails
	// with ErrUnknownHost.
	KnownHosts []string
	// Signers are the private keys to offer (-i). The agent's keys (Agent)
	// are offered after them.
	Signers []ssh.Signer
	// Agent, if set, is an ssh-agent (SSH_AUTH_SOCK) whose keys are
	// offered.
	Agent agent.ExtendedAgent
	// ConnectTimeout bounds the TCP connect plus the SSH handshake.
	ConnectTimeout time.Duration
}

// dialer connects to inventory hosts.
type dialer struct {
	cfg       SSHConfig
	hostKeyCB ssh.HostKeyCallback
	auth      []ssh.AuthMethod
}

func newDialer(cfg SSHConfig) (*dialer, error) {
	var files []string
	for _, f := range cfg.KnownHosts {
		if _, err := os.Stat(f); err == nil {
			files = append(files, f)
		}
	}
	if len(files) == 0 {
		return nil, fmt.Errorf(
			"bulkonboard: no known_hosts file among %s: add the hosts' keys first "+
				"(ssh-keyscan, then check the fingerprints), or pass --known-hosts",
			strings.Join(cfg.KnownHosts, ", "),
		)
	}
	cb, err := knownhosts.New(files...)
	if err != nil {
		return nil, fmt.Errorf("bulkonboard: read known_hosts: %w", err)
	}
	var auth []ssh.AuthMethod
	signers := cfg.Signers
	if cfg.Agent != nil {
		ag := cfg.Agent
		auth = append(auth, ssh.PublicKeysCallback(func() ([]ssh.Signer, error) {
			fromAgent, err := ag.Signers()
			if err != nil {
				return signers, nil // the keys given with -i still count
			}
			return append(append([]ssh.Signer{}, signers...), fromAgent...), nil
		}))
	} else if len(signers) > 0 {
		auth = append(auth, ssh.PublicKeys(signers...))
	}
	if len(auth) == 0 {
		return nil, errors.New("bulkonboard: no SSH key: start ssh-agent with your key (SSH_AUTH_SOCK) or pass -i KEY")
	}
	if cfg.ConnectTimeout <= 0 {
		cfg.ConnectTimeout = 15 * time.Second
	}
	return &dialer{cfg: cfg, hostKeyCB: cb, auth: auth}, nil
}

// hostKeyAlgorithms are the key types known_hosts holds for addr, so that
// the server is asked for a key we can check (a host that also has an RSA
// key must not answer with it when known_hosts lists its ed25519 key).
func (d *dialer) hostKeyAlgorithms(addr string) []string {
	err := d.hostKeyCB(addr, &net.TCPAddr{IP: net.IPv4zero}, probeKey{})
	var ke *knownhosts.KeyError
	if !errors.As(err, &ke) {
		return nil
	}
	var algos []string
	for _, k := range ke.Want {
		switch t := k.Key.Type(); t {
		case ssh.KeyAlgoRSA:
			algos = append(algos, ssh.KeyAlgoRSASHA512, ssh.KeyAlgoRSASHA256, ssh.KeyAlgoRSA)
		default:
			algos = append(algos, t)
		}
	}
	return algos
}

// dial connects and logs in to h as user.
func (d *dialer) dial(ctx context.Context, h Host, user string) (*ssh.Client, error) {
	addr := h.Addr()
	ctx, cancel := context.WithTimeout(ctx, d.cfg.ConnectTimeout)
	defer cancel()
	var nd net.Dialer
	conn, err := nd.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrUnreachable, err)
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	var keyErr error
	sc, chans, reqs, err := ssh.NewClientConn(conn, addr, &ssh.ClientConfig{
		User: user,
		Auth: d.auth,
		HostKeyCallback: func(hostname string, remote net.Addr, key ssh.PublicKey) error {
			keyErr = d.checkHostKey(hostname, remote, key)
			return keyErr
		},
		HostKeyAlgorithms: d.hostKeyAlgorithms(addr),
		ClientVersion:     "SSH-2.0-Tether-bulk-onboard",
	})
	if err != nil {
		conn.Close()
		switch {
		case keyErr != nil:
			return nil, keyErr
		case ctx.Err() != nil:
			return nil, fmt.Errorf(
				"%w: SSH handshake with %s timed out after %s",
				ErrUnreachable,
				addr,
				d.cfg.ConnectTimeout,
			)
		case strings.Contains(err.Error(), "unable to authenticate"):
			return nil, fmt.Errorf(
				"%w for user %q: %w; add your key to the host's authorized_keys or ssh-agent",
				ErrAuth,
				user,
				err,
			)
		}
		return nil, fmt.Errorf("SSH handshake with %s: %w", addr, err)
	}
	return ssh.NewClient(sc, chans, reqs), nil
}

func (d *dialer) checkHostKey(hostname string, remote net.Addr, key ssh.PublicKey) error {
	err := d.hostKeyCB(hostname, remote, key)
	var ke *knownhosts.KeyError
	switch {
	case err == nil:
		return nil
	case errors.As(err, &ke) && len(ke.Want) == 0:
		return fmt.Errorf(
			"%w: %s offers %s %s; check that fingerprint with the machine's owner, then add it "+
				"(ssh-keyscan -p PORT HOST >> ~/.ssh/known_hosts) and run again",
			ErrUnknownHost,
			knownhosts.Normalize(hostname),
			key.Type(),
			ssh.FingerprintSHA256(key),
		)
	case errors.As(err, &ke):
		return fmt.Errorf(
			"%w: %s offers %s %s, known_hosts line %s:%d has another key; "+
				"if the machine was reinstalled, remove that line (ssh-keygen -R %s)",
			ErrHostKeyChanged,
			knownhosts.Normalize(hostname),
			key.Type(),
			ssh.FingerprintSHA256(key),
			ke.Want[0].Filename,
			ke.Want[0].Line,
			knownhosts.Normalize(hostname),
		)
	}
	return fmt.Errorf("host key of %s: %w", hostname, err)
}

// probeKey is a key no known_hosts holds: checking it tells which keys
// known_hosts has for a host.
type probeKey struct{}

func (probeKey) Type() string                        { return "tether-probe" }
func (probeKey) Marshal() []byte                     { return []byte("tether-probe") }
func (probeKey) Verify([]byte, *ssh.Signature) error { return errors.New("probe key") }
