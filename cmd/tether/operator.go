package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/api"
)

func newOperatorCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "operator", Short: "Manage operators allowed to jump through the bastion"}
	cmd.AddCommand(newOperatorAddCmd(), newOperatorListCmd(), newOperatorRmCmd())
	return cmd
}

func newOperatorAddCmd() *cobra.Command {
	var cf clientFlags
	var keyPath string
	var roleNames []string
	cmd := &cobra.Command{
		Use:   "add NAME --key PUBKEY_FILE [--role ROLE]...",
		Short: "Register an operator's SSH public key",
		Long: `Register an operator. NAME is the user name they give the bastion
(ssh -J NAME@hub:2222 ...); the key is one OpenSSH public key (use - for stdin).
Their key is pushed at once to the embedded SSH server of every node their
roles select, limited to the roles' logins. Without --role the operator gets
the built-in role "all" (every node, any login). The built-in role "admin"
also makes them a hub admin: 'tether login' then gives them a short-lived
admin certificate for the API, which 'tether operator rm' ends.`,
		Example: `  tether operator add alice --data-dir ./hub --key ~/.ssh/id_ed25519.pub`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if keyPath == "" {
				return fmt.Errorf("--key is required (a public key file such as ~/.ssh/id_ed25519.pub, or - for stdin)")
			}
			var b []byte
			var err error
			if keyPath == "-" {
				b, err = io.ReadAll(io.LimitReader(os.Stdin, 64<<10))
			} else {
				b, err = os.ReadFile(keyPath)
			}
			if err != nil {
				return fmt.Errorf("read --key: %w", err)
			}
			if _, err := api.ParseAuthorizedKey(string(b)); err != nil {
				return fmt.Errorf("%s: %w", keyPath, err)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			o, err := c.AddOperator(cmd.Context(), api.OperatorAddRequest{Name: args[0], PublicKey: string(b), Roles: roleNames})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "operator %s added (%s)\n", o.Name, o.Fingerprint)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&keyPath, "key", "", "OpenSSH public key file, or - for stdin")
	cmd.Flags().StringArrayVar(&roleNames, "role", nil, "role to grant (repeatable; default: all)")
	return cmd
}

func newOperatorListCmd() *cobra.Command {
	return listCommand(&cobra.Command{Use: "list", Short: "List operators"},
		(*api.Client).ListOperators, "NAME\tROLES\tKEY FINGERPRINT\tADDED",
		func(o api.Operator) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s", o.Name, strings.Join(o.Roles, ","), o.Fingerprint, o.CreatedAt.Local().Format("2006-01-02 15:04"))
		})
}

func newOperatorRmCmd() *cobra.Command {
	return argCommand(&cobra.Command{Use: "rm NAME", Short: "Remove an operator (new jumps refused at once; the key is revoked on nodes)"}, (*api.Client).RemoveOperator)
}
