package main

import (
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/pki/ca"
)

func newCACmd() *cobra.Command {
	cmd := &cobra.Command{Use: "ca", Short: "Hub CA maintenance (SSH CA rotation, admin certificate revocation)"}
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
	cmd.AddCommand(rotate, newCARevokeAdminCmd())
	return cmd
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
			fmt.Fprintf(os.Stderr, "admin certificates issued before %s are refused from now on; the hub re-minted its local identity (DATA_DIR/admin); admins run 'tether login' again\n",
				resp.ValidFrom.Local().Format(time.RFC3339))
			return nil
		},
	}
	cf.register(cmd)
	return cmd
}
