package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/edge"
)

func newStatusCmd() *cobra.Command {
	var stateDir, output string
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show this node's identity and connection state",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			id, err := edge.LoadIdentity(stateDir)
			if err != nil {
				return err
			}
			st, err := edge.ReadStatus(stateDir)
			if errors.Is(err, os.ErrNotExist) {
				st = edge.Status{Name: id.Config.Name, NodeID: id.Config.NodeID, State: "not running", CertExpires: id.Cert.Leaf.NotAfter}
			} else if err != nil {
				return fmt.Errorf("read status: %w", err)
			}
			if st.PID != 0 && (st.State == "connected" || st.State == "connecting") && syscall.Kill(st.PID, 0) != nil {
				st.State = "not running (agent exited)"
			}
			switch output {
			case "json":
				enc := json.NewEncoder(os.Stdout)
				enc.SetIndent("", "  ")
				return enc.Encode(st)
			case "text":
			default:
				return fmt.Errorf("--output %q: want text or json", output)
			}
			fmt.Printf("node:         %s (id %s)\n", id.Config.Name, id.Config.NodeID)
			fmt.Printf("hubs:         %v\n", id.Config.Hubs)
			fmt.Printf("state:        %s since %s\n", st.State, st.Since.Local().Format(time.RFC3339))
			if st.Transport != "" {
				fmt.Printf("connected to: %s over %s\n", st.Hub, st.Transport)
			}
			if st.LastError != "" {
				fmt.Printf("last error:   %s\n", st.LastError)
			}
			fmt.Printf("certificate:  valid until %s\n", id.Cert.Leaf.NotAfter.Local().Format(time.RFC3339))
			return nil
		},
	}
	cmd.Flags().StringVar(&stateDir, "state-dir", defaultStateDir(), "node identity directory (env TETHER_STATE_DIR)")
	cmd.Flags().StringVarP(&output, "output", "o", "text", "output format: text or json")
	return cmd
}

func newVersionCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version",
		Args:  cobra.NoArgs,
		Run:   func(*cobra.Command, []string) { fmt.Println("tether-edge", edge.Version) },
	}
}
