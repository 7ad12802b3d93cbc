package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/api"
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
SHA-256 pin; treat it as a secret until it expires or is used up. Labels are
applied to every node that joins with it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			l, err := api.ParseLabels(labels)
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			resp, err := c.CreateToken(cmd.Context(), api.TokenCreateRequest{TTLSeconds: int64(ttl / time.Second), Uses: uses, Labels: l})
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
	var cf clientFlags
	var output string
	cmd := &cobra.Command{
		Use:   "list",
		Short: "List join tokens (ids only; secrets are never stored)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ts, err := c.ListTokens(cmd.Context())
			if err != nil {
				return err
			}
			if output == "json" {
				return printJSON(os.Stdout, ts)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tUSES LEFT\tEXPIRES\tLABELS")
			for _, t := range ts {
				exp := t.ExpiresAt.Local().Format(time.RFC3339)
				if time.Now().After(t.ExpiresAt) {
					exp += " (expired)"
				}
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s\n", t.ID, t.UsesLeft, exp, formatLabels(t.Labels))
			}
			return tw.Flush()
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newTokenRmCmd() *cobra.Command {
	var cf clientFlags
	cmd := &cobra.Command{
		Use:   "rm ID",
		Short: "Revoke a join token",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			return c.DeleteToken(cmd.Context(), args[0])
		},
	}
	cf.register(cmd)
	return cmd
}

func formatLabels(l map[string]string) string {
	parts := make([]string, 0, len(l))
	for k, v := range l {
		parts = append(parts, k+"="+v)
	}
	sortStrings(parts)
	return strings.Join(parts, ",")
}
