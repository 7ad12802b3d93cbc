package main

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/access"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func newOnboardingCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "onboarding",
		Short: "Create, list and revoke onboarding credentials (for machines already in the field)",
	}
	cmd.AddCommand(newOnboardingCreateCmd(), newOnboardingListCmd(), newOnboardingRevokeCmd())
	return cmd
}

func newOnboardingCreateCmd() *cobra.Command {
	var cf clientFlags
	var role string
	var uses int
	ttl := dayDuration(7 * 24 * time.Hour)
	var labels []string
	var output string
	cmd := &cobra.Command{
		Use:   "create NAME",
		Short: "Create an onboarding credential and print it (only the credential)",
		Long: `Create an onboarding credential for the person who onboards machines on site
(` + "`tether-edge onboard`" + `). Prints only the credential (ID.SECRET), once: the hub
keeps its hash. Hand it over with the hub CA fingerprint (-o json shows it as
ca_pin), which the on-site person checks.

  CRED=$(tether onboarding create berlin-shop --role onboarder --uses 50 --ttl 7d --label site=berlin)

It carries the onboarder permission: it creates one node per machine (keyed by
the machine's UUID and key) through the onboarding endpoint, and nothing else.
Each node it creates gets its labels. Revoke it with ` + "`tether onboarding revoke NAME`" + `.`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output != "text" && output != "json" {
				return fmt.Errorf("--output %q: want text or json", output)
			}
			l, err := apitype.ParseLabels(labels)
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			resp, err := c.CreateOnboarding(cmd.Context(), apitype.OnboardingCreateRequest{Name: args[0], Role: role, Uses: uses,
				TTLSeconds: int64(time.Duration(ttl) / time.Second), Labels: l})
			if err != nil {
				return err
			}
			if output == "json" {
				return printJSON(os.Stdout, resp)
			}
			fmt.Println(resp.Credential)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&role, "role", access.RoleOnboarder,
		"the credential's permission (only "+access.RoleOnboarder+")")
	cmd.Flags().IntVar(&uses, "uses", 1, "how many machines it may onboard")
	cmd.Flags().Var(&ttl, "ttl", "how long it is valid (e.g. 12h, 7d)")
	cmd.Flags().StringArrayVarP(&labels, "label", "l", nil,
		"KEY=VALUE label for every node it creates (repeatable; wins over labels asked for on site)")
	cmd.Flags().StringVarP(&output, "output", "o", "text",
		"output: text (the credential only) or json (with ID, expiry and the CA pin)")
	return cmd
}

func newOnboardingListCmd() *cobra.Command {
	return listCommand(&cobra.Command{Use: "list", Short: "List onboarding credentials (secrets are never stored)"},
		(*apiclient.Client).ListOnboarding, "NAME\tID\tSTATE\tUSES LEFT\tEXPIRES\tLABELS",
		func(c apitype.OnboardingCredential) string {
			return fmt.Sprintf("%s\t%s\t%s\t%d/%d\t%s\t%s", c.Name, c.ID, c.State, c.UsesLeft, c.Uses,
				c.ExpiresAt.Local().Format(time.RFC3339), apitype.FormatLabels(c.Labels))
		})
}

func newOnboardingRevokeCmd() *cobra.Command {
	return argCommand(&cobra.Command{Use: "revoke NAME", Short: "Revoke an onboarding credential (nodes it created stay)"},
		func(c *apiclient.Client, ctx context.Context, name string) error {
			_, err := c.RevokeOnboarding(ctx, name)
			return err
		})
}

// dayDuration is a time.Duration flag that also takes whole days ("7d").
type dayDuration time.Duration

func (d *dayDuration) String() string { return time.Duration(*d).String() }
func (d *dayDuration) Type() string   { return "duration" }

func (d *dayDuration) Set(s string) error {
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 1 || n > 3660 {
			return fmt.Errorf("%q: want whole days such as 7d, or a duration such as 12h", s)
		}
		*d = dayDuration(time.Duration(n) * 24 * time.Hour)
		return nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("%q: want a duration such as 12h, or whole days such as 7d", s)
	}
	*d = dayDuration(v)
	return nil
}
