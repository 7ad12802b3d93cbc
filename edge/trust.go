// The SSH trust the hub pushes over the control stream: the host key the
// hub certifies, user CAs, revoked keys, principals and authorized keys,
// handed to the embedded SSH server or the managed local sshd.

package edge

import (
	"log/slog"
	"os"
	"strings"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/edge/sshdconf"
	"github.com/tether-dev/tether/edge/sshserver"
	"github.com/tether-dev/tether/tunnel/control"
)

// hostKeyLine is the SSH host public key the hub should certify: the
// embedded server's, or the local sshd's read from SSHDHostKey.pub.
func (a *Agent) hostKeyLine(log *slog.Logger) string {
	if a.sshd != nil {
		return string(gossh.MarshalAuthorizedKey(a.sshd.HostSigner().PublicKey()))
	}
	path := a.cfg.SSHDHostKey
	if a.cfg.ManageSSHD != nil {
		path = a.cfg.ManageSSHD.Paths.HostKey
	}
	b, err := os.ReadFile(path + ".pub")
	if err != nil {
		log.Info("no local sshd host key to certify; operators must verify it themselves", "err", err)
		return ""
	}
	if _, _, _, _, err := gossh.ParseAuthorizedKey(b); err != nil {
		log.Warn("unreadable sshd host public key", "path", path+".pub", "err", err)
		return ""
	}
	return string(b)
}

// applySSHTrust installs the host certificate and user CAs the hub sent.
func (a *Agent) applySSHTrust(t *control.SSHTrust, log *slog.Logger) {
	cas := make([]gossh.PublicKey, 0, len(t.UserCAs))
	for _, l := range t.UserCAs {
		k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(l))
		if err != nil {
			log.Warn("ignoring unreadable user CA from hub", "err", err)
			continue
		}
		cas = append(cas, k)
	}
	var cert *gossh.Certificate
	if t.HostCert != "" {
		k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(t.HostCert))
		c, ok := k.(*gossh.Certificate)
		if err != nil || !ok {
			log.Warn("ignoring unreadable host certificate from hub", "err", err)
		} else {
			cert = c
		}
	}
	if a.sshd != nil {
		a.sshd.SetTrustedUserCAs(cas)
		a.sshd.SetRevokedKeys(parseKeys(t.RevokedKeys, log))
		// Always role-scoped: an empty map means no certificate logs in.
		a.sshd.SetCertPrincipals(nonNil(t.Principals), t.AnyLogin)
		a.sshd.SetNoForwardingPrincipals(t.NoForwarding)
		a.sshd.SetScopedUserCAs(scopedCAs(t.ScopedUserCAs, log))
		if cert != nil {
			if err := a.sshd.AddHostCertificate(cert); err != nil {
				log.Warn("host certificate from hub not usable", "err", err)
				return
			}
			log.Info("SSH host certificate installed", "principals", cert.ValidPrincipals,
				"valid_until", time.Unix(int64(cert.ValidBefore), 0).UTC().Format(time.RFC3339))
		}
		return
	}
	if a.cfg.ManageSSHD != nil {
		if err := a.cfg.ManageSSHD.apply(
			cert, cas, parseKeys(t.RevokedKeys, log), t.Principals, t.AnyLogin,
			sshdScopedCAs(scopedCAs(t.ScopedUserCAs, log)), log,
		); err != nil {
			log.Error("configure local sshd", "err", err)
		}
		return
	}
	if cert != nil {
		log.Info("received an SSH host certificate for the local sshd; run with --manage-sshd to install it")
	}
}

// scopedCAs are the user CAs of hubs above this node's site hub, each with
// the principals its roles grant here. A CA none of whose keys parse is
// dropped: it grants nothing.
func scopedCAs(in []control.ScopedUserCA, log *slog.Logger) []sshserver.ScopedCA {
	out := make([]sshserver.ScopedCA, 0, len(in))
	for _, c := range in {
		keys := parseKeys(c.Keys, log)
		if len(keys) == 0 {
			continue
		}
		out = append(out, sshserver.ScopedCA{Keys: keys, PerLogin: nonNil(c.Principals), AnyLogin: c.AnyLogin,
			NoForwarding: c.NoForwarding})
	}
	return out
}

// sshdScopedCAs are scoped CAs as the managed sshd's files take them.
func sshdScopedCAs(in []sshserver.ScopedCA) []sshdconf.ScopedCA {
	out := make([]sshdconf.ScopedCA, 0, len(in))
	for _, c := range in {
		out = append(out, sshdconf.ScopedCA{Keys: c.Keys, Principals: c.PerLogin, AnyLogin: c.AnyLogin,
			NoForwarding: c.NoForwarding})
	}
	return out
}

func parseKeys(lines []string, log *slog.Logger) []gossh.PublicKey {
	out := make([]gossh.PublicKey, 0, len(lines))
	for _, l := range lines {
		k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(l))
		if err != nil {
			log.Warn("ignoring unreadable key from hub", "err", err)
			continue
		}
		out = append(out, k)
	}
	return out
}

func (a *Agent) setAuthorizedKeys(lines []string, log *slog.Logger) {
	if a.sshd == nil {
		return
	}
	keys := make([]sshserver.AuthorizedKey, 0, len(lines))
	for _, l := range lines {
		ak, err := parseAuthorizedKey(l)
		if err != nil {
			log.Warn("ignoring unreadable authorized key from hub", "err", err)
			continue
		}
		keys = append(keys, ak)
	}
	a.sshd.SetAuthorizedKeyLogins(keys)
	log.Debug("authorized keys updated", "count", len(keys))
}

// parseAuthorizedKey reads one line of the hub's authorized keys
// (access.KeysFor): the comment is the operator's name; options say what
// the key may do on this node.
func parseAuthorizedKey(line string) (sshserver.AuthorizedKey, error) {
	k, comment, options, _, err := gossh.ParseAuthorizedKey([]byte(line))
	if err != nil {
		return sshserver.AuthorizedKey{}, err
	}
	ak := sshserver.AuthorizedKey{Key: k, Name: comment}
	for _, o := range options {
		// tether-logins="root,ubuntu": the logins the operator's roles
		// allow on this node; absent means any login.
		if v, ok := strings.CutPrefix(o, "tether-logins="); ok {
			ak.Logins = strings.Split(strings.Trim(v, `"`), ",")
		}
		// OpenSSH's option: none of the operator's roles selecting this
		// node allows forwarding; absent (also from older hubs) allows it.
		if o == "no-port-forwarding" {
			ak.NoForwarding = true
		}
	}
	return ak, nil
}
