package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"time"

	"github.com/spf13/cobra"
)

func newUICmd() *cobra.Command {
	var cf clientFlags
	var noBrowser bool
	cmd := &cobra.Command{
		Use:   "ui",
		Short: "Print a one-time sign-in link for the hub's web console, and open it",
		Long: `Ask the hub for a one-time sign-in code of its web console and print the link
(https://HUB/ui/signin?code=…); unless --no-browser, open it with xdg-open too.

The link signs in once, within a minute. The console session it starts lasts
8 hours in an HttpOnly, Secure, SameSite=Strict cookie and may do what your
identity may do through the API: run it after 'tether login' (with --hub
ADDR) as an operator, whose roles decide which nodes the console shows and
which logins its terminal may use; or on the hub machine (--data-dir) as the
local admin, who sees everything but has no terminal (no roles, no logins).
Removing the operator, revoking their key or 'tether ca revoke-admin' ends
the session at its next request.

The hub's TLS certificate is signed by the hub's own CA: import
DATA_DIR/admin/ca.crt (or the ca.crt 'tether login' wrote) into the browser,
or accept the certificate once for this hub.`,
		Example: `  tether ui --hub hub.example.com:7443          # as an operator, after tether login
  tether ui --no-browser                          # on the hub machine: print the link only`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx, cancel := context.WithTimeout(cmd.Context(), 30*time.Second)
			defer cancel()
			code, err := c.ConsoleCode(ctx)
			if err != nil {
				return fmt.Errorf("ask the hub for a console sign-in code: %w", err)
			}
			fmt.Fprintln(cmd.OutOrStdout(), code.URL)
			who := code.Operator
			if who == "" {
				who = "the local admin"
			}
			fmt.Fprintf(os.Stderr, "one-time sign-in link for %s, valid until %s\n", who,
				code.ExpiresAt.Local().Format(time.TimeOnly))
			if noBrowser {
				return nil
			}
			if opener, err := exec.LookPath("xdg-open"); err == nil {
				if err := exec.Command(opener, code.URL).Start(); err == nil {
					fmt.Fprintln(os.Stderr, "opened in your browser")
					return nil
				}
			}
			fmt.Fprintln(os.Stderr, "no browser to open here (xdg-open): open the link yourself")
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().BoolVar(&noBrowser, "no-browser", false, "print the link only; do not open a browser")
	return cmd
}
