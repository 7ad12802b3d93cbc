package main

import (
	"crypto"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	gossh "golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"

	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	hubop "github.com/tether-dev/tether/hub/operator"
	"github.com/tether-dev/tether/pki"
)

func newLoginCmd() *cobra.Command {
	var dataDir, hubAddr, pin, operator, keyPath, outDir string
	var profile sshProfile
	cmd := &cobra.Command{
		Use:   "login",
		Short: "Get a short-lived SSH user certificate by proving your registered key",
		Long: `Sign a one-time challenge from the hub with your registered SSH key and receive
a short-lived user certificate (default 8 h) whose principals name your roles
and their logins (tether:ROLE:LOGIN); a node accepts it only for the roles
that select that node. It is written to OUT_DIR/USER-cert.pub and, if an ssh-agent is running
and the key file is readable, added to the agent with the certificate's lifetime.

It also writes this hub's ssh profile, OUT_DIR/ssh_config and OUT_DIR/known_hosts
(the hub's host CA), so 'ssh -F ~/.tether/ssh_config root@NODE.tether' verifies
the hub and the node by certificate, with no prompt.

Operators holding the admin role also get a short-lived admin client certificate
for the HTTP API (as long as the SSH one, at most 24 h) in OUT_DIR/admin/, with
the hub's address: later commands given neither --data-dir (nor TETHER_DATA_DIR)
nor --hub, and finding no hub in the default data dir, use this hub and that
certificate (--identity names another directory). Every other
operator gets an API certificate there instead, which lists only the nodes their
roles select ('tether nodes', 'tether ls', 'tether inventory') and
nothing else. It stops
working when the operator is removed or loses the admin role, and after
'tether ca revoke-admin'.

Nodes whose sshd is managed by tether-edge (--manage-sshd) and the embedded SSH
server accept it; the bastion accepts it in place of your plain key.

The hub is verified by its CA: with --data-dir from the data dir, otherwise by
--ca-pin (what 'tether ca pin' prints on the hub's machine; also in join strings
and the 'tether hub' log). Trust on first use is never offered.`,
		Example: `  tether ca pin                       # on the hub's machine: sha256:9f2c…
  tether login --hub hub.example.com:7443 --ca-pin sha256:9f2c… --user alice
  ssh -F ~/.tether/ssh_config root@n1.tether
  tether nodes                        # the hub logged in to`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var tc *tls.Config
			var hubCA *x509.Certificate // the verified hub CA, stored with an admin certificate
			switch {
			case hubAddr != "":
				p, ok := strings.CutPrefix(pin, "sha256:")
				if !ok {
					return errors.New("--hub needs --ca-pin sha256:<64 hex> (no trust on first use)")
				}
				var err error
				if tc, err = pki.PinnedTLSConfig(p, func(c *x509.Certificate) { hubCA = c }); err != nil {
					return err
				}
			default:
				info, err := apiclient.LocalHub(dataDir)
				if err != nil {
					return fmt.Errorf("%w, or pass --hub ADDR --ca-pin sha256:PIN", err)
				}
				hubAddr = info.API
				caPEM, err := os.ReadFile(filepath.Join(dataDir, "ca", "ca.crt"))
				if err != nil {
					return err
				}
				cas, err := pki.ParseCerts(caPEM)
				if err != nil {
					return err
				}
				pool := x509.NewCertPool()
				pool.AddCert(cas[0])
				hubCA = cas[0]
				tc = &tls.Config{MinVersion: tls.VersionTLS13, ServerName: pki.HubServerName, RootCAs: pool}
			}
			if _, _, err := net.SplitHostPort(hubAddr); err != nil {
				return fmt.Errorf("--hub %q: %w", hubAddr, err)
			}
			if operator == "" {
				u, err := user.Current()
				if err != nil {
					return err
				}
				operator = u.Username
			}
			pubBytes, err := os.ReadFile(keyPath + ".pub")
			if err != nil {
				return fmt.Errorf("read your public key: %w (use --identity-file PATH to the private key; "+
					"PATH.pub must exist)", err)
			}
			pub, _, _, _, err := gossh.ParseAuthorizedKey(pubBytes)
			if err != nil {
				return fmt.Errorf("%s.pub: %w", keyPath, err)
			}
			signer, rawKey, ag, err := loginSigner(keyPath, pub)
			if err != nil {
				return err
			}
			c := apiclient.NewClientTLS(hubAddr, tc)
			defer c.Close()
			ch, err := c.LoginChallenge(cmd.Context(), operator)
			if err != nil {
				return err
			}
			// Every login asks for an admin certificate too; the hub gives
			// one only to operators holding the admin role.
			adminKey, err := pki.GenerateKey()
			if err != nil {
				return err
			}
			csr, err := pki.NewCSR(adminKey, operator)
			if err != nil {
				return err
			}
			sig, err := signer.Sign(rand.Reader, hubop.AdminLoginPayload(operator, ch.Nonce, csr))
			if err != nil {
				return fmt.Errorf("sign the login challenge: %w", err)
			}
			resp, err := c.Login(cmd.Context(), apitype.LoginRequest{
				Operator:        operator,
				Nonce:           ch.Nonce,
				SignatureFormat: sig.Format,
				Signature:       sig.Blob,
				AdminCSR:        csr,
				PublicKey:       string(gossh.MarshalAuthorizedKey(pub)),
			})
			if err != nil {
				return err
			}
			k, _, _, _, err := gossh.ParseAuthorizedKey([]byte(resp.Certificate))
			cert, ok := k.(*gossh.Certificate)
			if err != nil || !ok {
				return fmt.Errorf("hub sent an unreadable certificate: %v", err)
			}
			if err := os.MkdirAll(outDir, 0o700); err != nil {
				return err
			}
			certPath := filepath.Join(outDir, operator+"-cert.pub")
			if err := pki.WriteFileAtomic(certPath, []byte(resp.Certificate), 0o644); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "certificate for %s (principals %s) valid until %s: %s\n", operator,
				strings.Join(resp.Principals, ","), resp.ValidBefore.Local().Format(time.RFC3339), certPath)
			if err := writeLoginProfile(cmd.Context(), c, profile, operator, keyPath, certPath, outDir); err != nil {
				return err
			}
			if resp.AdminCert != "" {
				dir, until, err := writeAdminLogin(outDir, hubAddr, resp.AdminCert, adminKey, hubCA)
				if err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "admin certificate valid until %s: %s (for hub %s)\n",
					until.Local().Format(time.RFC3339), dir, hubAddr)
			}
			if resp.APICert != "" {
				// Not an admin: an API identity that lists the nodes
				// this operator's roles select, kept where --hub finds it.
				dir, until, err := writeAdminLogin(outDir, hubAddr, resp.APICert, adminKey, hubCA)
				if err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "API certificate for hub %s (lists your nodes: tether nodes) valid until %s: %s\n",
					hubAddr, until.Local().Format(time.RFC3339), dir)
			}
			if ag != nil && rawKey != nil {
				life := time.Until(resp.ValidBefore)
				if err := ag.Add(agent.AddedKey{PrivateKey: rawKey, Certificate: cert, LifetimeSecs: uint32(life / time.Second),
					Comment: "tether " + operator}); err != nil {
					fmt.Fprintf(os.Stderr, "could not add the certificate to ssh-agent: %v\n", err)
				} else {
					fmt.Fprintln(os.Stderr, "added to ssh-agent")
				}
			}
			return nil
		},
	}
	home, _ := os.UserHomeDir()
	cmd.Flags().StringVar(&dataDir, "data-dir", defaultDataDir(), "hub data dir (on the hub's machine)")
	cmd.Flags().StringVar(&hubAddr, "hub", "", "hub API address HOST:PORT (needs --ca-pin)")
	cmd.Flags().StringVar(&pin, "ca-pin", "", "sha256:<hex> pin of the hub CA, as in join strings")
	cmd.Flags().StringVar(&operator, "user", "", "your operator name (default: your login name)")
	defaultKey := filepath.Join(home, ".ssh", "id_ed25519")
	cmd.Flags().StringVarP(&keyPath, "identity-file", "i", defaultKey,
		"your registered private key (PATH.pub must be next to it); ssh-agent is used if it holds the key")
	// The flag's first name, kept for scripts; --identity-file is the name
	// the other commands (config ssh, inventory, onboard bulk) use for it.
	cmd.Flags().StringVar(&keyPath, "key", defaultKey, "")
	_ = cmd.Flags().MarkDeprecated("key", "use --identity-file")
	cmd.Flags().StringVar(&outDir, "out-dir", filepath.Join(home, ".tether"),
		"where to write USER-cert.pub, the hub's ssh profile (ssh_config, known_hosts) and admin/ for admins")
	profile.register(cmd)
	return cmd
}

// loginSigner finds a signer for pub: the ssh-agent if it holds the key,
// else the key file (which must not be passphrase-protected). rawKey is
// returned when the file was read, so the certificate can be added to the
// agent together with its key.
func loginSigner(keyPath string, pub gossh.PublicKey) (gossh.Signer, any, agent.ExtendedAgent, error) {
	var ag agent.ExtendedAgent
	if sock := os.Getenv("SSH_AUTH_SOCK"); sock != "" {
		if conn, err := net.Dial("unix", sock); err == nil {
			ag = agent.NewClient(conn)
			if signers, err := ag.Signers(); err == nil {
				for _, s := range signers {
					if string(s.PublicKey().Marshal()) == string(pub.Marshal()) {
						return s, nil, nil, nil
					}
				}
			}
		}
	}
	b, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("read private key: %w", err)
	}
	raw, err := gossh.ParseRawPrivateKey(b)
	var pass *gossh.PassphraseMissingError
	if errors.As(err, &pass) {
		return nil, nil, nil, fmt.Errorf(
			"%s is passphrase-protected: add it to ssh-agent (ssh-add %s) and run tether login again", keyPath, keyPath)
	}
	if err != nil {
		return nil, nil, nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	signer, err := gossh.NewSignerFromKey(raw)
	if err != nil {
		return nil, nil, nil, err
	}
	if string(signer.PublicKey().Marshal()) != string(pub.Marshal()) {
		return nil, nil, nil, fmt.Errorf("%s and %s.pub are not the same key", keyPath, keyPath)
	}
	return signer, raw, ag, nil
}

// writeAdminLogin stores the admin identity a login returned in
// OUT_DIR/admin (0700; key 0600), with the hub's address, where commands
// find it (without --data-dir or --hub, or with --hub).
func writeAdminLogin(outDir, hubAddr, chainPEM string, key crypto.Signer, hubCA *x509.Certificate,
) (string, time.Time, error) {
	certs, err := pki.ParseCerts([]byte(chainPEM))
	if err != nil || len(certs) == 0 || hubCA == nil {
		return "", time.Time{}, fmt.Errorf("hub sent an unreadable admin certificate: %v", err)
	}
	keyPEM, err := pki.EncodeKey(key)
	if err != nil {
		return "", time.Time{}, err
	}
	dir := filepath.Join(outDir, apitype.AdminDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", time.Time{}, err
	}
	for _, f := range []struct {
		name string
		data []byte
		perm os.FileMode
	}{
		{apitype.AdminKeyFile, keyPEM, 0o600},
		{apitype.AdminCertFile, []byte(chainPEM), 0o644},
		{apitype.AdminCAFile, pki.EncodeCerts(hubCA), 0o644},
		{loginHubFile, []byte(hubAddr + "\n"), 0o644},
	} {
		if err := pki.WriteFileAtomic(filepath.Join(dir, f.name), f.data, f.perm); err != nil {
			return "", time.Time{}, err
		}
	}
	return dir, certs[0].NotAfter, nil
}
