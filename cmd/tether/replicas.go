package main

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func newReplicasCmd() *cobra.Command {
	return listCommand(&cobra.Command{
		Use:   "replicas",
		Short: "List the hub replicas sharing this hub's store: peers, links, agents held, health",
		Long: `List the hub replicas sharing this hub's store (hubs started with --peer-listen).

HEALTH is ok while a replica heartbeats (its lease runs), expired once it
stopped: a dead replica's agents reconnect to the others, and its presence
is ignored from then on. LINKS are the replicas it has a live peer link to
(dialed on first use). AGENTS are the nodes whose tunnel it holds; a jump
or job entering at any replica reaches them through it. HUBS are the
addresses agents dial for it (its --advertise, or its own listener): join
strings name those of every live replica, and a connected agent learns of
replicas added later, so a replica's death moves its agents to another.

-o json prints an array of objects with id, self, health, peer_addr, api,
ssh, version, started, lease_until, links, agents and hubs. A hub running
alone lists nothing.`,
		Example: `  tether replicas
  tether replicas -o json | jq -r '.[] | select(.health != "ok") | .id'`,
	}, func(c *apiclient.Client, ctx context.Context) ([]apitype.Replica, error) {
		l, err := c.ListReplicas(ctx)
		return l.Replicas, err
	}, "ID\tHEALTH\tPEER\tAPI\tSSH\tHUBS\tLINKS\tAGENTS", func(r apitype.Replica) string {
		id := r.ID
		if r.Self {
			id += " (this)"
		}
		return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s", id, r.Health, r.PeerAddr, r.API, r.SSH,
			orDash(strings.Join(r.Hubs, ",")), orDash(strings.Join(r.Links, ",")), agentsCell(r.Agents))
	})
}

// agentsCell shows up to a few agent names and the count.
func agentsCell(agents []string) string {
	const show = 5
	if len(agents) <= show {
		return strconv.Itoa(len(agents)) + " " + orDash(strings.Join(agents, ","))
	}
	return fmt.Sprintf("%d %s,…", len(agents), strings.Join(agents[:show], ","))
}
