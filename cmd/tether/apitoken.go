package main

import (
	"fmt"
	"os"
	"time"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func newAPITokenCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "apitoken",
		Short: "Create, list and revoke API tokens for automation",
		Long: `API tokens let automation use the job endpoints of the HTTP API (and
'tether run', 'tether jobs' with TETHER_API_TOKEN) without the admin identity.
A token is bound to one role: it may run jobs only on nodes the role selects,
and only where the role allows the node's provisioning login; it sees only
jobs created under that role. Only a hash of the token is stored.`,
	}
	var cf clientFlags
	var role, desc string
	var ttl time.Duration
	create := &cobra.Command{
		Use:   "create --role ROLE",
		Short: "Create an API token and print it (shown once)",
		Example: `  tether role create automation -l 'site=lab' --logins root
  TOKEN=$(tether apitoken create --role automation)
  curl --cacert DATA_DIR/admin/ca.crt --resolve hub.tether.internal:7443:127.0.0.1 \
       -H "Authorization: Bearer $TOKEN" https://hub.tether.internal:7443/v1/jobs`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			resp, err := c.CreateAPIToken(cmd.Context(), apitype.APITokenCreateRequest{
				Role: role, Description: desc, TTLSeconds: int64(ttl / time.Second),
			})
			if err != nil {
				return err
			}
			fmt.Println(resp.Token)
			fmt.Fprintf(os.Stderr, "API token %s for role %s created; it is shown only now\n", resp.ID, resp.Role)
			return nil
		},
	}
	cf.register(create)
	create.Flags().StringVar(&role, "role", "", "role the token acts as (required)")
	create.Flags().StringVar(&desc, "description", "", "what the token is for")
	create.Flags().DurationVar(&ttl, "ttl", 0, "lifetime (0: no expiry)")
	_ = create.MarkFlagRequired("role")
	list := listCommand(&cobra.Command{
		Use: "list", Short: "List API tokens (without secrets)",
	}, (*apiclient.Client).ListAPITokens,
		"ID\tROLE\tCREATED\tEXPIRES\tDESCRIPTION", func(t apitype.APIToken) string {
			exp := "never"
			if !t.ExpiresAt.IsZero() {
				exp = t.ExpiresAt.Local().Format(time.DateTime)
			}
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s", t.ID, t.Role, t.CreatedAt.Local().Format(time.DateTime), exp, t.Description)
		})
	rm := argCommand(&cobra.Command{Use: "rm ID", Short: "Revoke an API token"}, (*apiclient.Client).DeleteAPIToken)
	cmd.AddCommand(create, list, rm)
	return cmd
}
