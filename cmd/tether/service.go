package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func newServiceCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "service",
		Short: "Service tunnels: publish a node's TCP port under a name, and reach it from other nodes",
		Long: `Service tunnels carry TCP connections from one node to another node's port,
through the hubs, without opening either node to the network.

  tether service expose NODE:PORT --name NAME
      publishes PORT of NODE under NAME. The node's agent must allow the port
      (tether-edge --allow-port PORT): the hub cannot know that, and the agent
      refuses every connection to a port it does not allow.
  tether service connect NAME --from NODE --local-port P
      makes NODE a consumer: its agent listens on 127.0.0.1:P, and every
      connection there is carried to the service's port.

A consumer reaches exactly the service's node and port, nothing else. With
site hubs, NODE may be below a site (n3.berlin); services go down to every
site, and the bytes turn at the nearest hub above both nodes: two sites
under one region hub never send them through the root.

Who may: the admin, or a role with --services expose (on the target) or
--services connect (on the consumer and on the target); see 'tether role
create --help'. Every change and every connection is audited at every hub
it passes.`,
	}
	cmd.AddCommand(newServiceExposeCmd(), newServiceConnectCmd(), newServiceListCmd(), newServiceDeleteCmd(),
		newServiceDisconnectCmd())
	return cmd
}

func newServiceExposeCmd() *cobra.Command {
	var cf clientFlags
	var name string
	cmd := &cobra.Command{
		Use:   "expose NODE:PORT --name NAME",
		Short: "Publish a node's allow-listed TCP port under a name",
		Example: `  tether service expose n3:5432 --name db
  tether service expose n3.berlin:5432 --name berlin-db`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			node, portText, err := net.SplitHostPort(args[0])
			if err != nil || node == "" {
				return fmt.Errorf("%q: want NODE:PORT (n3:5432)", args[0])
			}
			port, err := strconv.ParseUint(portText, 10, 16)
			if err != nil || port == 0 {
				return fmt.Errorf("%q: port %q: want 1..65535", args[0], portText)
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			sv, err := c.ExposeService(cmd.Context(), apitype.ServiceExposeRequest{Name: name, Target: node, Port: uint16(port)})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "service %s → %s:%d (the node's agent must allow the port: tether-edge --allow-port %d)\n",
				sv.Name, sv.Target, sv.Port, sv.Port)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&name, "name", "", "the service's name (a DNS label; required)")
	_ = cmd.MarkFlagRequired("name")
	return cmd
}

func newServiceConnectCmd() *cobra.Command {
	var cf clientFlags
	var from string
	var localPort uint16
	cmd := &cobra.Command{
		Use:     "connect NAME --from NODE --local-port P",
		Short:   "Make a node a consumer of a service: its agent listens on 127.0.0.1:P",
		Example: `  tether service connect berlin-db --from m2.munich --local-port 15432`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if localPort == 0 {
				return fmt.Errorf("--local-port: want 1..65535")
			}
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			sv, err := c.ConnectService(cmd.Context(), args[0], apitype.ServiceConnectRequest{
				Consumer: from, LocalPort: localPort,
			})
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "%s: 127.0.0.1:%d → service %s (%s:%d)\n", from, localPort, sv.Name, sv.Target, sv.Port)
			return nil
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&from, "from", "", "the consumer node (required)")
	cmd.Flags().Uint16Var(&localPort, "local-port", 0, "the loopback port the consumer's agent listens on (required)")
	_ = cmd.MarkFlagRequired("from")
	_ = cmd.RegisterFlagCompletionFunc("from", completeNodeFlag(&cf))
	_ = cmd.MarkFlagRequired("local-port")
	return cmd
}

func newServiceDisconnectCmd() *cobra.Command {
	var cf clientFlags
	var from string
	cmd := &cobra.Command{
		Use:   "disconnect NAME --from NODE",
		Short: "Remove a consumer of a service (its listener closes)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.DisconnectService(cmd.Context(), args[0], from)
			return err
		},
	}
	cf.register(cmd)
	cmd.Flags().StringVar(&from, "from", "", "the consumer node (required)")
	_ = cmd.MarkFlagRequired("from")
	_ = cmd.RegisterFlagCompletionFunc("from", completeNodeFlag(&cf))
	return cmd
}

func newServiceDeleteCmd() *cobra.Command {
	return argCommand(&cobra.Command{Use: "delete NAME", Short: "Delete a service and all its consumers' listeners"},
		func(c *apiclient.Client, ctx context.Context, name string) error {
			_, err := c.DeleteService(ctx, name)
			return err
		})
}

func newServiceListCmd() *cobra.Command {
	return listCommand(&cobra.Command{
		Use:   "list",
		Short: "List services and their consumers",
		Long: `List the service tunnels this hub holds: those created here, and those sent
down from hubs above (ORIGIN "above"; their names are the origin's).

-o json prints an array of objects with name, target, port, origin, local,
generation, bindings ([{consumer, local_port, created_by, created_at}]),
created_by, created_at and updated_at.`,
	}, (*apiclient.Client).ListServices, "NAME\tTARGET\tORIGIN\tCONSUMERS", func(sv apitype.Service) string {
		origin := "here"
		if !sv.Local {
			origin = "above"
		}
		var cons []string
		for _, b := range sv.Bindings {
			cons = append(cons, fmt.Sprintf("%s:%d", b.Consumer, b.LocalPort))
		}
		return fmt.Sprintf("%s\t%s:%d\t%s\t%s", sv.Name, sv.Target, sv.Port, origin, orDash(strings.Join(cons, ",")))
	})
}
