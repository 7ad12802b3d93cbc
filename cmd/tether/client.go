package main

import (
	"encoding/json"
	"fmt"
	"io"
	"os"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/api"
)

func defaultDataDir() string {
	if d := os.Getenv("TETHER_DATA_DIR"); d != "" {
		return d
	}
	return "/var/lib/tether"
}

// clientFlags are the flags every admin command shares.
type clientFlags struct {
	dataDir  string
	hub      string
	identity string
}

func (c *clientFlags) register(cmd *cobra.Command) {
	cmd.Flags().StringVar(&c.dataDir, "data-dir", defaultDataDir(), "hub data dir (on the hub's machine; env TETHER_DATA_DIR)")
	cmd.Flags().StringVar(&c.hub, "hub", "", "hub API address HOST:PORT (from another machine; needs --identity)")
	cmd.Flags().StringVar(&c.identity, "identity", "", "directory with admin.crt, admin.key, ca.crt (copied from the hub's DATA_DIR/admin)")
}

func (c *clientFlags) client() (*api.Client, error) {
	if c.hub != "" {
		if c.identity == "" {
			return nil, fmt.Errorf("--hub needs --identity DIR (a copy of the hub's %s/admin directory)", c.dataDir)
		}
		return api.NewClient(c.hub, c.identity)
	}
	return api.NewLocalClient(c.dataDir)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

func checkOutput(o string) error {
	if o != "table" && o != "json" {
		return fmt.Errorf("--output %q: want table or json", o)
	}
	return nil
}
