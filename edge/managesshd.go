package edge

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/edge/sshdconf"
)

// SSHDManager keeps the local OpenSSH server configured for Tether: host
// certificate, trusted user CAs and revoked keys, in the files sshdconf
// writes, with a reload when they change.
type SSHDManager struct {
	Paths      sshdconf.Paths
	SSHDConfig string            // main sshd_config, checked to Include the drop-in
	Reload     sshdconf.Reloader // default sshdconf.SystemdReloader()
}

// Check verifies the setup once at start, so a drop-in sshd would never
// read fails loudly instead of silently.
func (m *SSHDManager) Check() error {
	if m.Paths.PrincipalsCommandUser == "" {
		m.Paths.PrincipalsCommandUser = principalsCommandUser()
	}
	if err := m.Paths.Check(); err != nil {
		return err
	}
	if m.SSHDConfig == "" {
		m.SSHDConfig = "/etc/ssh/sshd_config"
	}
	if m.Reload == nil {
		m.Reload = sshdconf.SystemdReloader()
	}
	if err := sshdconf.CheckIncluded(m.SSHDConfig, m.Paths.DropIn); err != nil {
		return fmt.Errorf("--manage-sshd: %w", err)
	}
	if _, err := sshdconf.ReadHostPublicKey(m.Paths); err != nil {
		return fmt.Errorf("--manage-sshd: %w", err)
	}
	return nil
}

// CheckForwarding reports whether the sshd refuses local port forwarding
// for everyone (sshdconf.ErrNoLocalForwarding): KubeOne, run by the hub for
// a cluster this node is a member of, reaches the node's kube-apiserver and
// etcd on the node's loopback through its SSH connection, and fails there.
// The agent logs it as a warning at start: nodes outside KubeOne clusters
// do not need forwarding.
func (m *SSHDManager) CheckForwarding(ctx context.Context) error {
	return sshdconf.CheckLocalForwarding(ctx, m.SSHDConfig, "")
}

// principalsCommandUser is who sshd runs the any-login principals command
// as: "nobody" for the usual root sshd; an sshd that is not root (so the
// agent managing it is not either) can only run it as itself.
func principalsCommandUser() string {
	if os.Geteuid() == 0 {
		return sshdconf.DefaultPrincipalsCommandUser
	}
	if u, err := user.Current(); err == nil {
		return u.Username
	}
	return sshdconf.DefaultPrincipalsCommandUser
}

// apply installs the hub's SSH trust. anyLogin are the principals of roles
// that allow every login on this node ("*", as the built-in role "all"):
// sshd accepts them for every account it lets log in, so such a role
// reaches the same accounts as on the embedded server.
func (m *SSHDManager) apply(cert *gossh.Certificate, userCAs, revoked []gossh.PublicKey,
	principals map[string][]string, anyLogin []string, scoped []sshdconf.ScopedCA, log *slog.Logger) error {
	if len(userCAs) == 0 {
		return errors.New("hub sent no user CA")
	}
	changed, err := sshdconf.Apply(m.Paths, sshdconf.Files{
		HostCert: cert, UserCAs: userCAs, RevokedKeys: revoked, Principals: nonNil(principals),
		AnyLogin: anyLogin, ScopedCAs: scoped,
	})
	if errors.Is(err, sshdconf.ErrSkipped) {
		// Everything else, revocations above all, was written: reload.
		log.Error("some logins accept no certificate on this node", "err", err)
	} else if err != nil {
		return err
	}
	if !changed {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := sshdconf.CheckConfig(ctx, m.SSHDConfig); err != nil {
		return fmt.Errorf("sshd -t refuses the new configuration, not reloading: %w", err)
	}
	if err := m.Reload(ctx); err != nil {
		return fmt.Errorf("reload sshd: %w", err)
	}
	log.Info("local sshd configured from hub", "host_cert", cert != nil, "user_cas", len(userCAs),
		"revoked_keys", len(revoked), "logins", len(principals), "any_login_principals", len(anyLogin))
	return nil
}

// nonNil makes "no login allowed" explicit: with Tether's role-scoped
// certificates sshd must consult the principals files even when empty.
func nonNil(m map[string][]string) map[string][]string {
	if m == nil {
		return map[string][]string{}
	}
	return m
}
