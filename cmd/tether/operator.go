package main

import (
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/api"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func newOperatorCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "operator", Short: "Manage operators allowed to jump through the bastion"}
	cmd.AddCommand(newOperatorAddCmd(), newOperatorListCmd(), newOperatorRmCmd(), newOperatorEditCmd(),
		newOperatorKeyCmd())
	return cmd
}

// readPublicKey reads one public key file (- for stdin) and checks it
// holds exactly one key.
func readPublicKey(path string) (string, error) {
	var b []byte
	var err error
	if path == "-" {
		b, err = io.ReadAll(io.LimitReader(os.Stdin, 64<<10))
	} else {
		b, err = os.ReadFile(path)
	}
	if err != nil {
		return "", fmt.Errorf("read --key: %w", err)
	}
	if _, err := api.ParseAuthorizedKey(string(b)); err != nil {
		return "", fmt.Errorf("%s: %w", path, err)
	}
	return string(b), nil
}

func newOperatorAddCmd() *cobra.Command {
	var cf clientFlags
	var keyPaths []string
	var roleNames []string
	cmd := &cobra.Command{
		Use:   "add NAME --key PUBKEY_FILE [--key PUBKEY_FILE]... [--role ROLE]...",
		Short: "Register an operator and their SSH public keys",
		Long: `Register an operator. NAME is the user name they give the bastion
(ssh -J NAME@hub:2222 ...); each --key is one OpenSSH public key file (use -
for stdin, once), and any of the keys logs in. More keys can be added and
removed later with 'tether operator key add|rm'.
Their keys are pushed at once to the embedded SSH server of every node their
roles select, limited to the roles' logins. Without --role the operator gets
the built-in role "all" (every node, any login: on nodes with the embedded
server and on nodes whose sshd the agent manages, for every local account
sshd lets log in). The built-in role "admin" also makes them a hub admin:
'tether login' then gives them a short-lived admin certificate for the API,
which 'tether operator rm' ends.`,
		Example: `  tether operator add alice --data-dir ./hub --key ~/.ssh/id_ed25519.pub
  tether operator add bob --key laptop.pub --key desktop.pub --role ops`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(keyPaths) == 0 {
				return fmt.Errorf("--key is required (a public key file such as ~/.ssh/id_ed25519.pub, or - for stdin)")
			}
			var keys []string
			for _, p := range keyPaths {
				k, err := readPublicKey(p)
				if err != nil {
					return err
				}
				keys = append(keys, k)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			o, err := c.AddOperator(cmd.Context(), apitype.OperatorAddRequest{
				Name:       args[0],
				PublicKey:  keys[0],
				PublicKeys: keys[1:],
				Roles:      roleNames,
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "operator %s added (%s), roles %s\n", o.Name, strings.Join(fingerprints(o), ", "),
				strings.Join(o.Roles, ","))
			if len(roleNames) == 0 {
				fmt.Fprintln(os.Stderr,
					`(the built-in role "all": every node, any login; on a managed sshd every account sshd lets log in. Narrow it `+
						`with 'tether operator edit NAME --role ROLE')`)
			}
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringArrayVar(&keyPaths, "key", nil, "OpenSSH public key file, or - for stdin (repeatable)")
	cmd.Flags().StringArrayVar(&roleNames, "role", nil, "role to grant (repeatable; default: all)")
	return cmd
}

func fingerprints(o apitype.Operator) []string {
	out := make([]string, 0, len(o.Keys))
	for _, k := range o.Keys {
		out = append(out, k.Fingerprint)
	}
	return out
}

func newOperatorListCmd() *cobra.Command {
	return listCommand(&cobra.Command{Use: "list", Short: "List operators"},
		(*apiclient.Client).ListOperators, "NAME\tROLES\tKEY FINGERPRINTS\tADDED",
		func(o apitype.Operator) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s", o.Name, strings.Join(o.Roles, ","), strings.Join(fingerprints(o), ","),
				o.CreatedAt.Local().Format("2006-01-02 15:04"))
		})
}

func newOperatorRmCmd() *cobra.Command {
	return argCommand(&cobra.Command{Use: "rm NAME",
		Short: "Remove an operator (new jumps refused and live jumps ended at once; the keys are revoked on nodes)"},
		(*apiclient.Client).RemoveOperator)
}

func newOperatorEditCmd() *cobra.Command {
	var cf clientFlags
	var roleNames []string
	cmd := &cobra.Command{
		Use:   "edit NAME --role ROLE [--role ROLE]...",
		Short: "Replace an operator's roles",
		Long: `Replace an operator's roles with the --role flags given. The change is
pushed to the nodes at once, and the operator's live jumps to nodes the new
roles no longer select end within a second (audited as "ended: access
withdrawn").`,
		Example: `  tether operator edit alice --role ops --role db`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if len(roleNames) == 0 {
				return fmt.Errorf("--role is required (repeatable); to take all access away, use 'tether operator rm %s'", args[0])
			}
			return withClient(&cf, func(c *apiclient.Client) error {
				o, err := c.EditOperator(cmd.Context(), args[0], apitype.OperatorEditRequest{Roles: roleNames})
				if err == nil {
					fmt.Fprintf(os.Stderr, "operator %s now has roles %s\n", o.Name, strings.Join(o.Roles, ","))
				}
				return err
			})
		},
	}
	cf.register(cmd)
	cmd.Flags().StringArrayVar(&roleNames, "role", nil, "role to grant (repeatable); replaces every role the operator had")
	return cmd
}

func newOperatorKeyCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "key", Short: "Add or revoke one of an operator's SSH keys"}
	var addFlags, rmFlags clientFlags
	var keyPath string
	add := &cobra.Command{
		Use:     "add NAME --key PUBKEY_FILE",
		Short:   "Register one more public key for an operator",
		Example: `  tether operator key add alice --key ~/.ssh/id_new.pub`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if keyPath == "" {
				return fmt.Errorf("--key is required (a public key file, or - for stdin)")
			}
			k, err := readPublicKey(keyPath)
			if err != nil {
				return err
			}
			return withClient(&addFlags, func(c *apiclient.Client) error {
				o, err := c.AddOperatorKey(cmd.Context(), args[0], apitype.OperatorKeyAddRequest{PublicKey: k})
				if err == nil {
					fmt.Fprintf(os.Stderr, "operator %s now has keys %s\n", o.Name, strings.Join(fingerprints(o), ", "))
				}
				return err
			})
		},
	}
	addFlags.register(add)
	add.Flags().StringVar(&keyPath, "key", "", "OpenSSH public key file, or - for stdin")
	rm := &cobra.Command{
		Use:   "rm NAME FINGERPRINT",
		Short: "Revoke one of an operator's keys (SHA256:… as 'tether operator list' shows)",
		Long: `Revoke one of an operator's keys: logins with it are refused, nodes refuse
it, and live jumps made with it end within a second. An operator's only key
cannot be removed; remove the operator instead.`,
		Example: `  tether operator key rm alice SHA256:2cZ3...`,
		Args:    cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			return withClient(&rmFlags, func(c *apiclient.Client) error {
				err := c.RemoveOperatorKey(cmd.Context(), args[0], args[1])
				if err == nil {
					fmt.Fprintf(os.Stderr, "key %s of operator %s revoked\n", args[1], args[0])
				}
				return err
			})
		},
	}
	rmFlags.register(rm)
	cmd.AddCommand(add, rm)
	return cmd
}

// withClient runs call with a client from cf, closing it after.
func withClient(cf *clientFlags, call func(*apiclient.Client) error) error {
	c, err := cf.client()
	if err != nil {
		return err
	}
	defer c.Close()
	return call(c)
}
