package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/tether-dev/tether/hub"
	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
)

func defaultDataDir() string {
	if d := os.Getenv("TETHER_DATA_DIR"); d != "" {
		return d
	}
	return "/var/lib/tether"
}

// clientFlags are the connection flags every command that talks to the
// hub API shares, registered in one place (register) so each command takes
// the same set.
type clientFlags struct {
	dataDir  string
	hub      string
	identity string
	apiToken string
	caFile   string
	wait     time.Duration
	flags    *pflag.FlagSet // the command's, to tell a chosen --data-dir from the default
}

// defaultHubWait is how long a command waits for a hub that is starting
// (the command ran right after `tether hub &`).
const defaultHubWait = 10 * time.Second

func (c *clientFlags) register(cmd *cobra.Command) {
	f := cmd.Flags()
	c.flags = f
	f.StringVar(&c.dataDir, "data-dir", defaultDataDir(), "on the hub's machine: the hub's data dir "+
		"(env TETHER_DATA_DIR; without either, and no hub running in the default one, the hub of your last 'tether login')")
	f.StringVar(&c.hub, "hub", "", "from another machine: hub API address HOST:PORT "+
		"(default after 'tether login': the hub logged in to; or with TETHER_API_TOKEN and --ca)")
	f.StringVar(&c.identity, "identity", "",
		"API identity directory (admin.crt, admin.key, ca.crt) from 'tether login' (default ~/.tether/admin)")
	f.StringVar(&c.caFile, "ca", "",
		"with --hub and TETHER_API_TOKEN: hub CA certificate (PEM) to verify the hub with (DATA_DIR/admin/ca.crt on the "+
			"hub's machine)")
	f.DurationVar(&c.wait, "wait", defaultHubWait,
		"with --data-dir: how long to wait for a hub that is starting (0: do not wait)")
	c.apiToken = os.Getenv("TETHER_API_TOKEN")
}

func (c *clientFlags) client() (*apiclient.Client, error) {
	if c.apiToken != "" && c.identity == "" {
		if c.hub == "" || c.caFile == "" {
			return nil, fmt.Errorf("TETHER_API_TOKEN is set: also pass --hub HOST:PORT and --ca FILE (the hub CA certificate)")
		}
		return apiclient.NewTokenClient(c.hub, c.caFile, c.apiToken)
	}
	if c.hub == "" && c.identity != "" && !dataDirChosen(c.flags) {
		addr, err := loginHub(c.identity)
		if err != nil {
			return nil, fmt.Errorf("--identity %s without --hub: %w", c.identity, err)
		}
		c.hub = addr
	}
	if c.hub == "" && !dataDirChosen(c.flags) && !localHubAt(c.dataDir) {
		// No data dir asked for and no hub in the default one: this is
		// not the hub's machine, so the hub of the last `tether login`.
		id := defaultAdminIdentity()
		if addr, err := loginHub(id); err == nil {
			cl, err := apiclient.NewClient(addr, id)
			if err != nil {
				return nil, fmt.Errorf("the hub of your last 'tether login' (%s): %w; "+
					"log in again, or on the hub's machine pass --data-dir DIR", addr, err)
			}
			return cl, nil
		}
	}
	if c.hub != "" {
		if c.identity == "" {
			c.identity = defaultAdminIdentity()
			if _, err := os.Stat(c.identity); err != nil {
				return nil, fmt.Errorf("--hub: no API identity in %s: run `tether login --hub %s --ca-pin sha256:PIN "+
					"--user NAME` first (every operator may list their nodes; other commands need the admin role), "+
					"or pass --identity DIR", c.identity, c.hub)
			}
		}
		return apiclient.NewClient(c.hub, c.identity)
	}
	return localClient(c.dataDir, c.wait)
}

// localClient connects to the hub of dataDir, waiting up to wait for one
// that is starting: a hub holds the data dir's lock from its first moment
// but writes hub.json only once it serves. Without any hub process on the
// data dir it gives up after hubStartGrace, so a mistyped --data-dir fails
// fast.
func localClient(dataDir string, wait time.Duration) (*apiclient.Client, error) {
	const hubStartGrace = 2 * time.Second
	start := time.Now()
	said := false
	for {
		c, err := apiclient.NewLocalClient(dataDir)
		if err == nil || !errors.Is(err, apiclient.ErrHubNotRunning) {
			return c, err
		}
		waited, starting := time.Since(start), hub.Starting(dataDir)
		if waited >= wait || (waited >= hubStartGrace && !starting) {
			return nil, err
		}
		if starting && !said {
			fmt.Fprintf(os.Stderr, "waiting for hub at %s (up to %s)…\n", dataDir, wait)
			said = true
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// defaultAdminIdentity is where `tether login` leaves an admin's identity.
func defaultAdminIdentity() string {
	home, _ := os.UserHomeDir()
	return filepath.Join(home, ".tether", apitype.AdminDir)
}

// loginHubFile, in an API identity directory from `tether login`, holds the
// API address (HOST:PORT) of the hub that issued it, so that commands find
// that hub without --hub.
const loginHubFile = "hub"

// loginHub reads the hub address a login left in identity dir.
func loginHub(dir string) (string, error) {
	b, err := os.ReadFile(filepath.Join(dir, loginHubFile))
	if err != nil {
		return "", fmt.Errorf("no hub address from 'tether login' in %s: %w (pass --hub HOST:PORT, or log in again)",
			dir, err)
	}
	addr := strings.TrimSpace(string(b))
	if _, _, err := net.SplitHostPort(addr); err != nil {
		return "", fmt.Errorf("%s: hub address %q: %w", filepath.Join(dir, loginHubFile), addr, err)
	}
	return addr, nil
}

// dataDirChosen reports whether the user named a data dir (--data-dir or
// TETHER_DATA_DIR) rather than leaving the default.
func dataDirChosen(f *pflag.FlagSet) bool {
	return os.Getenv("TETHER_DATA_DIR") != "" || (f != nil && f.Changed("data-dir"))
}

// localHubAt reports whether a hub runs, or is starting, on dataDir.
func localHubAt(dataDir string) bool {
	if _, err := os.Stat(filepath.Join(dataDir, apitype.HubInfoFile)); err == nil {
		return true
	}
	return hub.Starting(dataDir)
}

func printJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// listCommand builds a `list`-style command: fetch rows with the admin
// client, print them as JSON (-o json) or as a table with header and one
// tab-separated line per row.
func listCommand[T any](
	cmd *cobra.Command, fetch func(*apiclient.Client, context.Context) ([]T, error), header string, row func(T) string,
) *cobra.Command {
	var cf clientFlags
	var output string
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if output != "table" && output != "json" {
			return usageErrorf("--output %q: want table or json", output)
		}
		c, err := cf.client()
		if err != nil {
			return err
		}
		defer c.Close()
		rows, err := fetch(c, cmd.Context())
		if err != nil {
			return err
		}
		if output == "json" {
			if rows == nil {
				rows = []T{}
			}
			return printJSON(os.Stdout, rows)
		}
		tw := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
		fmt.Fprintln(tw, header)
		for _, r := range rows {
			fmt.Fprintln(tw, row(r))
		}
		return tw.Flush()
	}
	cf.register(cmd)
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

// argCommand builds a command that takes one argument and calls one
// admin-client method with it (the rm commands).
func argCommand(cmd *cobra.Command, call func(*apiclient.Client, context.Context, string) error) *cobra.Command {
	withClientArg(cmd, call)
	return cmd
}

// nodeArgCommand is argCommand for a command whose argument is a node name,
// which the shell completes.
func nodeArgCommand(cmd *cobra.Command, call func(*apiclient.Client, context.Context, string) error) *cobra.Command {
	cmd.ValidArgsFunction = completeNodeArg(withClientArg(cmd, call))
	return cmd
}

// withClientArg makes cmd an argCommand and returns its connection flags.
func withClientArg(cmd *cobra.Command, call func(*apiclient.Client, context.Context, string) error) *clientFlags {
	cf := new(clientFlags)
	cmd.Args = cobra.ExactArgs(1)
	cmd.RunE = func(cmd *cobra.Command, args []string) error {
		c, err := cf.client()
		if err != nil {
			return err
		}
		defer c.Close()
		return call(c, cmd.Context(), args[0])
	}
	cf.register(cmd)
	return cf
}
