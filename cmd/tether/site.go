package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func newSiteCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "site", Short: "Site hubs below this hub: join tokens for them"}
	token := &cobra.Command{Use: "token", Short: "Join tokens for site hubs"}
	token.AddCommand(newSiteTokenCreateCmd())
	cmd.AddCommand(token)
	return cmd
}

func newSiteTokenCreateCmd() *cobra.Command {
	var cf clientFlags
	var ttl time.Duration
	var uses int
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a site join token and print its join string (only the join string)",
		Long: `Create a join token for a site hub: a hub that joins this one as a site
('tether hub --parent JOIN_STRING --site NAME' on the site's machine). Prints
only the join string, so it can be captured:

  SITE_JOIN=$(tether site token create --ttl 1h)

A site token registers only site hubs, and a node token ('tether token create')
only nodes. The site's certificate is trusted for names under the site
(NODE.NAME) and nothing else. The token is stored hashed, expires after --ttl
and is used up after --uses joins; 'tether token list -o json' shows it (kind site) and
'tether token rm ID' revokes it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			resp, err := c.CreateToken(cmd.Context(), apitype.TokenCreateRequest{
				TTLSeconds: int64(ttl / time.Second), Uses: uses, Kind: "site",
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
	cmd.Flags().IntVar(&uses, "uses", 1, "how many site hubs may join with it")
	return cmd
}

func newSitesCmd() *cobra.Command {
	var cf clientFlags
	var output string
	cmd := &cobra.Command{
		Use:   "sites",
		Short: "List the site hubs below this hub: the sub-tree, health, last heartbeat, node and mission counts",
		Long: `List the site hubs below this hub, nested: each site's own sites are shown
under it, as that site last reported them.

HEALTH is healthy, degraded (a node offline, or a sub-site stale) or stale: no
status arrived within 3 status intervals ('tether hub --site-status-interval'
of this hub), shown with for how long. A stale site may be down or only cut
off; it is never called failed. NODES is online/total, MISSIONS
received/active.

-o json prints the nested tree: name, path, health, connected, last_heartbeat,
age_seconds, stale, stale_seconds, unreachable_since, nodes_online,
nodes_total, received_missions, active_missions, queued_since, sites.`,
		Example: `  tether sites
  tether sites -o json | jq '.[] | select(.stale)'`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return fmt.Errorf("--output %q: want table or json", output)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			sites, err := c.Sites(cmd.Context())
			if err != nil {
				return err
			}
			if output == "json" {
				return printJSON(os.Stdout, sites)
			}
			tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "SITE\tHEALTH\tLAST HEARTBEAT\tNODES\tMISSIONS")
			printSites(tw, sites, 0)
			return tw.Flush()
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

// printSites writes one row per site, sub-sites indented under their site.
func printSites(tw *tabwriter.Writer, sites []apitype.Site, depth int) {
	for _, s := range sites {
		fmt.Fprintf(tw, "%s%s\t%s\t%s\t%d/%d\t%d/%d\n", strings.Repeat("  ", depth), s.Path, siteHealthText(s),
			heartbeatText(s), s.NodesOnline, s.NodesTotal, s.ReceivedMissions, s.ActiveMissions)
		printSites(tw, s.Sites, depth+1)
	}
}

// siteHealthText is the HEALTH column: a stale site with for how long, and
// since when it has been unreachable if its uplink is down.
func siteHealthText(s apitype.Site) string {
	if !s.Stale {
		return s.Health
	}
	t := "stale"
	if s.StaleSeconds > 0 {
		t += " for " + strings.TrimSuffix(ago(time.Duration(s.StaleSeconds)*time.Second), " ago")
	}
	if !s.UnreachableSince.IsZero() {
		t += ", unreachable since " + s.UnreachableSince.Local().Format(time.RFC3339)
	}
	return t
}

// heartbeatText is the LAST HEARTBEAT column, aged by the hub's clock.
func heartbeatText(s apitype.Site) string {
	if s.LastHeartbeat.IsZero() {
		return "never"
	}
	return ago(time.Duration(s.AgeSeconds) * time.Second)
}
