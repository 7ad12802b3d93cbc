package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/pki/ca"
)

func newCACmd() *cobra.Command {
	cmd := &cobra.Command{Use: "ca", Short: "The hub's CA: its pin, SSH CA rotation, admin certificate revocation"}
	var dataDir, kind string
	var finish bool
	rotate := &cobra.Command{
		Use:   "rotate-ssh --kind host|user [--finish]",
		Short: "Rotate an SSH CA with an overlap in which old and new keys are both trusted",
		Long: `Rotate the SSH host or user CA without re-joining nodes:

 1. tether ca rotate-ssh --kind user --data-dir D   (makes a new signing key; the old
    one stays trusted), then restart the hub. Nodes reconnect and receive both
    user CAs; new certificates are signed by the new key. For --kind host, also
    re-run 'tether config ssh' so clients trust both host CAs.
 2. Wait at least one certificate lifetime (--user-cert-ttl, default 8h, or
    --host-cert-ttl, default 7 days), so every certificate in use is new.
 3. tether ca rotate-ssh --kind user --finish --data-dir D, restart the hub,
    and (for host) re-run 'tether config ssh'.

It edits files in DATA_DIR/ca; the hub reads them at start.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			file := map[string]string{"host": ca.SSHHostCAFile, "user": ca.SSHUserCAFile}[kind]
			if file == "" {
				return fmt.Errorf("--kind %q: want host or user", kind)
			}
			dir := filepath.Join(dataDir, "ca")
			if _, err := os.Stat(filepath.Join(dir, file)); err != nil {
				return fmt.Errorf("no SSH %s CA in %s (start the hub once first): %w", kind, dir, err)
			}
			if finish {
				if err := ca.FinishSSHRotation(dir, file); err != nil {
					return err
				}
				fmt.Fprintf(os.Stderr, "SSH %s CA rotation finished: only the new key is trusted. Restart the hub.\n", kind)
				return nil
			}
			if err := ca.RotateSSH(dir, file); err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "new SSH %s CA key made; the old one stays trusted until --finish. Restart the hub.\n", kind)
			return nil
		},
	}
	rotate.Flags().StringVar(&dataDir, "data-dir", defaultDataDir(), "hub data dir")
	rotate.Flags().StringVar(&kind, "kind", "", "host or user")
	rotate.Flags().BoolVar(&finish, "finish", false, "end the overlap: stop trusting previous keys")
	cmd.AddCommand(newCAPinCmd(), rotate, newCARevokeAdminCmd())
	return cmd
}

func newCAPinCmd() *cobra.Command {
	var dataDir string
	cmd := &cobra.Command{
		Use:   "pin",
		Short: "Print the pin (sha256:HEX) of the hub's CA, for 'tether login --hub ADDR --ca-pin PIN'",
		Long: `Print the SHA-256 pin of the hub's root CA certificate: the value join strings
carry, and what 'tether login --hub ADDR --ca-pin PIN' on another machine checks
the hub against (there is no trust on first use).

On the hub's machine it reads DATA_DIR/ca/ca.crt. Given no --data-dir (nor
TETHER_DATA_DIR) and finding no CA in the default data dir, it prints the pin
of the hub CA your last 'tether login' verified (~/.tether/admin/ca.crt), to
hand on to others.`,
		Example: `  tether ca pin --data-dir /var/lib/tether
  tether login --hub hub.example.com:7443 --ca-pin sha256:9f2c… --user alice   # on your machine`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			file := filepath.Join(dataDir, "ca", ca.CertFile)
			if _, err := os.Stat(file); err != nil && !dataDirChosen(cmd.Flags()) {
				if login := filepath.Join(defaultAdminIdentity(), apitype.AdminCAFile); fileExists(login) {
					file = login
				}
			}
			pin, err := caPin(file)
			if err != nil {
				return fmt.Errorf("%w (on the hub's machine pass --data-dir DIR, the hub's data dir; "+
					"elsewhere run 'tether login' first)", err)
			}
			fmt.Println(pin)
			return nil
		},
	}
	cmd.Flags().StringVar(&dataDir, "data-dir", defaultDataDir(), "hub data dir (env TETHER_DATA_DIR)")
	return cmd
}

// caPin is the join pin (sha256:HEX) of the first certificate in the PEM
// file path: the hub's root CA.
func caPin(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("read the hub CA certificate: %w", err)
	}
	certs, err := pki.ParseCerts(b)
	if err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	if len(certs) == 0 {
		return "", fmt.Errorf("%s holds no certificate", path)
	}
	return "sha256:" + pki.Fingerprint(certs[0]), nil
}

func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}

func newCARevokeAdminCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "revoke-admin",
		Short: "Refuse every admin client certificate issued until now",
		Long: `Make the hub refuse every admin client certificate issued before now: copies of
DATA_DIR/admin, and the admin certificates operators got from 'tether login'
(this command's own included). The time is stored, so it holds across restarts,
and audited (kind admin_revoke).

The hub re-mints its local identity in DATA_DIR/admin at once with a new key,
so --data-dir keeps working on the hub machine; operators with the admin role
run 'tether login' again. Remove operators who should no longer be admins
first ('tether operator rm NAME'), or they can simply log in again.`,
		Example: `  tether ca revoke-admin --data-dir /var/lib/tether`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			resp, err := c.RevokeAdmin(cmd.Context())
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr,
				"admin certificates issued before %s are refused from now on; the hub re-minted its local identity "+
					"(DATA_DIR/admin); admins run 'tether login' again\n",
				resp.ValidFrom.Local().Format(time.RFC3339))
			return nil
		},
	}
	cf.register(cmd)
	return cmd
}
