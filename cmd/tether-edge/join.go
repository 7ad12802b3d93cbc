package main

import (
	"context"
	"fmt"
	"os"

	"github.com/tether-dev/tether/cmd/internal/edgecli"
	"github.com/tether-dev/tether/edge"
)

func newJoinCmd() *edgecli.Command {
	var o edge.JoinOptions
	cmd := &edgecli.Command{
		Use:   "join [JOIN_STRING]",
		Short: "Join a hub: make a key, get a node certificate, store them in --state-dir",
		Long: `Join a hub with a join string from 'tether token create'. The key is made
here and never leaves the machine; the hub must prove the CA pinned in the join
string. Exits non-zero with the hub's reason when the token is unknown, used up
or expired, or the name is taken. The join string may come from the
environment variable TETHER_JOIN instead of the command line, which keeps
the secret out of the process list.`,
		Args: edgecli.MaximumArgs(1),
		Run: func(ctx context.Context, cmd *edgecli.Command, args []string) error {
			o.JoinString = os.Getenv("TETHER_JOIN")
			if len(args) == 1 {
				o.JoinString = args[0]
			}
			if o.JoinString == "" {
				return fmt.Errorf("no join string: pass it as an argument or in TETHER_JOIN")
			}
			id, err := edge.Join(ctx, o)
			if err != nil {
				return err
			}
			fmt.Fprintf(os.Stderr, "joined as %s (node id %s); certificate valid until %s\n",
				id.Config.Name, id.Config.NodeID, id.Cert.Leaf.NotAfter.Format("2006-01-02 15:04 MST"))
			return nil
		},
	}
	cmd.Flags.StringVar(&o.StateDir, "state-dir", defaultStateDir(),
		"where the node key, certificate and config are stored (env TETHER_STATE_DIR)")
	cmd.Flags.StringVar(&o.Name, "name", "", "node name (a DNS label; default: derived from the hostname)")
	return cmd
}
