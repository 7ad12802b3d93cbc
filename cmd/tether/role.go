package main

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/hub/roles"
)

func newRoleCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "role",
		Short: "Manage roles: which nodes (by label selector) and logins an operator may use",
		Long: `A role is a node label selector plus the logins it allows there. Operators
get roles with 'tether operator add NAME --role ROLE'; without --role they get
the built-in role "all" (every node, any login). Holding the built-in role
"admin" makes an operator a hub admin (see 'tether login'); removing that role
takes admin access from everyone who holds it.

Selector syntax (terms are ANDed): k=v, k!=v, k in (a,b), k notin (a,b),
k (label exists), !k (label absent); "*" selects every node.

Port forwarding on nodes with the embedded SSH server (ssh -L to the node's
loopback, ssh -R listening on it; never to or on other addresses) is allowed
by default, since a login that may run a shell can forward ports anyway;
--forwarding=false refuses it to the role's logins. An operator may forward
on a node if any of their roles that selects it allows forwarding.

--confirm lets the role confirm over-the-air upgrades waiting for a person on
the nodes it selects ('tether upgrade confirm NAME --node N'); no role may by
default, and the admin always may.

--services expose,connect lets the role use service tunnels on the nodes it
selects: expose publishes one of a node's allow-listed ports under a name
('tether service expose NODE:PORT --name N'); connect makes a node a
consumer of a service ('tether service connect N --from NODE --local-port
P'), and is needed on the consumer and on the service's target alike. No
role may by default, and the admin always may.`,
	}
	cmd.AddCommand(newRoleCreateCmd(), newRoleListCmd(), newRoleRmCmd())
	return cmd
}

func newRoleCreateCmd() *cobra.Command {
	var cf clientFlags
	var selector, nodes string
	var logins []string
	var forwarding, confirm bool
	var services []string
	cmd := &cobra.Command{
		Use:   "create NAME -l SELECTOR --logins LOGIN[,LOGIN]",
		Short: "Create or replace a role",
		Long: `Create or replace a role: the nodes it reaches, given as a label selector
with -l/--selector as in 'tether run -l' and 'tether nodes -l', and the logins
it allows there. Roles select nodes by their hub-set labels only, never by
name: to give a role certain nodes, label them ('tether nodes label n1 n2
team=ops') and select the label (-l team=ops).

--nodes is the old name of -l. It is refused when its value holds a bare
name ("--nodes n1"): that is a selector for nodes that carry a label named n1,
almost never what was meant.`,
		Example: `  tether role create fleet-ops -l 'site=lab,env!=prod' --logins root,ubuntu
  tether role create auditors -l '*' --logins audit --forwarding=false
  tether role create berlin-lead -l site=berlin --logins audit --confirm
  tether role create db-links -l role=db --logins audit --services expose,connect`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := roleSelector(selector, nodes, cmd.Flags().Changed("selector"), cmd.Flags().Changed("nodes"))
			if err != nil {
				return err
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			r, err := c.PutRole(cmd.Context(), args[0], apitype.RolePutRequest{
				Nodes: sel, Logins: logins, Forwarding: &forwarding, Confirm: confirm, Services: services,
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "role %s: selector %q, logins %s, forwarding %s, confirm upgrades %s, services %s\n",
				r.Name, r.Nodes, strings.Join(r.Logins, ","), yesNo(r.Forwarding), yesNo(r.Confirm),
				orDash(strings.Join(r.Services, ",")))
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVarP(&selector, "selector", "l", "",
		"label selector of the nodes the role reaches (required; \"*\" for all nodes)")
	cmd.Flags().StringVar(&nodes, "nodes", "", "old name of -l/--selector (a label selector, not node names)")
	_ = cmd.Flags().MarkDeprecated("nodes", "use -l/--selector (the same label selector)")
	cmd.Flags().StringSliceVar(&logins, "logins", nil, "SSH logins allowed on those nodes (required)")
	cmd.Flags().BoolVar(&forwarding, "forwarding", true,
		"allow port forwarding (ssh -L/-R on the nodes' loopback, embedded SSH server)")
	cmd.Flags().BoolVar(&confirm, "confirm", false,
		"allow confirming over-the-air upgrades waiting on those nodes ('tether upgrade confirm')")
	cmd.Flags().StringSliceVar(&services, "services", nil,
		"service-tunnel permissions on those nodes: expose, connect ('tether service')")
	_ = cmd.MarkFlagRequired("logins")
	return cmd
}

// roleSelector is the selector `role create` stores, from -l/--selector or
// its old name --nodes. Both are checked here rather than only by the hub
// so that a mistake is a usage error naming the flag. An empty selector
// is refused although the hub reads it as every node: an unset shell
// variable must not grant the whole fleet; "*" says so on purpose.
func roleSelector(selector, nodes string, selectorSet, nodesSet bool) (string, error) {
	flag, value := "-l/--selector", selector
	switch {
	case selectorSet && nodesSet:
		return "", usageErrorf("give -l/--selector only (--nodes is its old name)")
	case nodesSet:
		flag, value = "--nodes", nodes
	case !selectorSet:
		return "", usageErrorf("no nodes given: -l SELECTOR selects the nodes the role reaches by label " +
			"(\"*\" for every node)")
	}
	if strings.TrimSpace(value) == "" {
		return "", usageErrorf("%s is empty: give a label selector (\"*\" for every node)", flag)
	}
	sel, err := roles.ParseSelector(value)
	if err != nil {
		return "", usageErrorf("%s: %v", flag, err)
	}
	if keys := sel.PresenceKeys(); nodesSet && len(keys) > 0 {
		return "", usageErrorf("--nodes %q: a role selects nodes by label, not by name, so this would select only nodes "+
			"carrying a label named %s; use -l/--selector (-l %s if you mean that label), and to give a role certain nodes, "+
			"label them (tether nodes label %s team=ops) and select the label (-l team=ops)",
			nodes, strings.Join(keys, ", "), strings.Join(keys, ","), strings.Join(keys, " "))
	}
	return value, nil
}

func newRoleListCmd() *cobra.Command {
	return listCommand(&cobra.Command{Use: "list", Short: "List roles"},
		(*apiclient.Client).ListRoles, "NAME\tSELECTOR\tLOGINS\tFORWARDING\tCONFIRM\tSERVICES",
		func(r apitype.Role) string {
			return fmt.Sprintf("%s\t%s\t%s\t%s\t%s\t%s", r.Name, r.Nodes, strings.Join(r.Logins, ","), yesNo(r.Forwarding),
				yesNo(r.Confirm), orDash(strings.Join(r.Services, ",")))
		})
}

func newRoleRmCmd() *cobra.Command {
	return argCommand(&cobra.Command{
		Use:   "rm NAME",
		Short: "Delete a role (operators holding it lose what it granted at once)",
	}, (*apiclient.Client).DeleteRole)
}

func yesNo(b bool) string {
	if b {
		return "yes"
	}
	return "no"
}
