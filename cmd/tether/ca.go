package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/pki/ca"
)

func newCACmd() *cobra.Command {
	cmd := &cobra.Command{Use: "ca", Short: "Hub CA maintenance (SSH CA rotation)"}
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
	cmd.AddCommand(rotate)
	return cmd
}
