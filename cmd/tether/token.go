package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func newTokenCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "token", Short: "Create, list and revoke join tokens"}
	cmd.AddCommand(newTokenCreateCmd(), newTokenListCmd(), newTokenRmCmd())
	return cmd
}

func newTokenCreateCmd() *cobra.Command {
	var cf clientFlags
	var ttl time.Duration
	var uses int
	var labels []string
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a join token and print its join string (only the join string)",
		Long: `Create a join token. Prints only the join string, so it can be captured:

  JOIN=$(tether token create --data-dir ./hub --ttl 1h --uses 3 --label site=lab)
  tether-edge run --join "$JOIN" --state-dir /var/lib/tether-edge

The join string carries the hub address(es), the token secret and the hub CA's
SHA-256 pin; treat it as a secret until it expires or is used up. On a hub
replica it names every live replica (this one first), so its nodes fail over
to any of them. Labels are applied to every node that joins with it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := apitype.ParseLabels(labels)
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			resp, err := c.CreateToken(cmd.Context(), apitype.TokenCreateRequest{
				TTLSeconds: int64(ttl / time.Second), Uses: uses, Labels: l,
			})
			if err != nil {
				return err
			}
			fmt.Println(resp.JoinString)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().DurationVar(&ttl, "ttl", time.Hour, "how long the token is valid")
	cmd.Flags().IntVar(&uses, "uses", 1, "how many nodes may join with it")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil, "KEY=VALUE label for joining nodes (repeatable)")
	return cmd
}

func newTokenListCmd() *cobra.Command {
	return listCommand(&cobra.Command{Use: "list", Short: "List join tokens (ids only; secrets are never stored)"},
		(*apiclient.Client).ListTokens, "ID\tUSES LEFT\tEXPIRES\tLABELS",
		func(t apitype.Token) string {
			exp := t.ExpiresAt.Local().Format(time.RFC3339)
			if time.Now().After(t.ExpiresAt) {
				exp += " (expired)"
			}
			return fmt.Sprintf("%s\t%d\t%s\t%s", t.ID, t.UsesLeft, exp, apitype.FormatLabels(t.Labels))
		})
}

func newTokenRmCmd() *cobra.Command {
	return argCommand(&cobra.Command{Use: "rm ID", Short: "Revoke a join token"}, (*apiclient.Client).DeleteToken)
}
