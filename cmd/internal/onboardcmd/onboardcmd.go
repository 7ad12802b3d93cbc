// Package onboardcmd is the `tether-edge onboard` command, shared by the
// agent (tether-edge, which runs the interactive form from its sibling
// executable) and that sibling (tether-edge-onboard, which has the form).
package onboardcmd

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"

	"golang.org/x/term"

	"github.com/tether-dev/tether/cmd/internal/edgecli"
	"github.com/tether-dev/tether/edge/onboard"
)

// Interactive sets up the interactive onboarding of c, after the flags were
// checked and a terminal was found: it sets c.Prompter, or runs the
// onboarding elsewhere (it then does not return).
type Interactive func(ctx context.Context, c *onboard.Config, accessible bool) error

// Form is the Interactive of an executable built with the form.
func Form(ctx context.Context, c *onboard.Config, accessible bool) error {
	c.Prompter = &onboard.Form{Ctx: ctx, Out: os.Stderr, Accessible: accessible || os.Getenv("TERM") == "dumb"}
	return nil
}

// EnvAgentExe names, in the sibling's environment, the agent executable
// that ran it: onboarding installs and starts that one.
const EnvAgentExe = "TETHER_EDGE_EXE"

// New is the onboard command; interactive runs when --non-interactive is
// not given.
func New(interactive Interactive) *edgecli.Command {
	var (
		c                        onboard.Config
		cred, labels, output     string
		apply, writeOnly, nonInt bool
		accessible               bool
		root                     string
	)
	cmd := edgecli.New("onboard",
		"Onboard this machine to a hub with an onboarding credential (checks, facts, CA, cloud-init)")
	cmd.Long = `Turn this machine into a node of a hub, run as root on the machine itself.

It checks the prerequisites (root, systemd, a machine UUID, serial, clock
skew against the hub, free disk, not onboarded already) and prints a table
with what to do for each failure; asks for the proxy (pre-filled from
HTTPS_PROXY), the hub's address, the credential and optional name, site and
labels, validating each before the next; shows the hub's CA fingerprint for
confirmation (or checks --ca-pin); collects hardware and OS facts, each with
its source; makes the node key here (the hub only sees a CSR) and receives
the node's certificate and cloud-init user-data.

The form asks whether to apply it now or at the next boot, unless --apply
or --write-only is given. --write-only writes that user-data and meta-data
to the NoCloud seed dir, applied by cloud-init at the next boot. --apply
(the default) applies it now:
its files, then its commands (systemctl enable --now tether-edge), and waits
until the agent is connected. Without systemd (containers, tests) it starts
and supervises 'tether-edge run' itself instead of running systemctl (pid in
STATE_DIR/agent.pid, log in STATE_DIR/agent.log); that agent does not survive
a reboot.

Every network step is retried with backoff. The key is kept in --state-dir
before the hub is asked, so re-running after any failure (a timeout, a crash,
ctrl+c) finishes the same node instead of making a second one.

With --non-interactive (required without a terminal) every input comes from
flags and the environment, with the same checks and the same result; --ca-pin
is then required.`
	cmd.Example = `  tether-edge onboard
  tether-edge onboard --hub hub.example:7443 --ca-pin sha256:… --credential @/root/cred \
      --non-interactive --apply -o json`
	cmd.Run = func(ctx context.Context, cmd *edgecli.Command, _ []string) error {
		if apply && writeOnly {
			return errors.New("--apply and --write-only exclude each other")
		}
		if writeOnly {
			c.Mode = onboard.ModeWriteOnly
		}
		c.AskMode = !apply && !writeOnly
		if output != "" && output != "json" && output != "text" {
			return fmt.Errorf("-o %q: want json or text", output)
		}
		var err error
		if c.Credential, err = readCredential(cred); err != nil {
			return err
		}
		if c.Labels, err = onboard.ParseLabels(labels); err != nil {
			return fmt.Errorf("--labels: %w", err)
		}
		if c.Exe, err = agentExe(); err != nil {
			return err
		}
		c.Machine = onboard.LocalMachine(c.Machine.StateDir)
		c.Machine.Root = root
		c.Out = os.Stderr
		// The environment's proxy is the form's default; --https-proxy wins.
		env := onboard.ProxyFromEnv(os.Getenv)
		if !cmd.Changed("https-proxy") {
			c.Proxy.HTTPS = env.HTTPS
		}
		c.Proxy.HTTP, c.Proxy.NoProxy = env.HTTP, env.NoProxy
		if !nonInt {
			if !term.IsTerminal(int(os.Stdin.Fd())) {
				return errors.New("no terminal to ask on: pass --non-interactive with --hub, --ca-pin and --credential")
			}
			if err := interactive(ctx, &c, accessible); err != nil {
				return err
			}
		}
		res, err := onboard.Run(ctx, c)
		if output == "json" {
			enc := json.NewEncoder(os.Stdout)
			enc.SetIndent("", "  ")
			_ = enc.Encode(res)
		} else if err == nil {
			fmt.Fprintf(os.Stderr, "onboarded as %s (node id %s)\n", res.Name, res.NodeID)
		}
		return err
	}
	f := &cmd.Flags
	f.StringVar(&c.Hub, "hub", os.Getenv("TETHER_HUB"), "hub address HOST[:PORT] (default port 7443; env TETHER_HUB)")
	f.StringVar(&c.CAPin, "ca-pin", os.Getenv("TETHER_CA_PIN"), "the hub CA's fingerprint sha256:HEX "+
		"(ca_pin in `tether onboarding create -o json` on the hub); required with --non-interactive (env TETHER_CA_PIN)")
	f.StringVar(&cred, "credential", "", "onboarding credential: @FILE or the value "+
		"(default: env TETHER_ONBOARD_CREDENTIAL, which keeps it out of the process list)")
	f.StringVar(&c.Name, "name", "", "node name (default: the hub derives it from the hostname)")
	f.StringVar(&c.Site, "site", "",
		"site, sent as the label site=… (a reported label: the node's own word, written to its labels file)")
	f.StringVar(&labels, "labels", "", "labels KEY=VALUE,… this machine reports "+
		"(its labels file; never selected on: the hub's labels are the credential's)")
	f.StringVar(&c.Proxy.HTTPS, "https-proxy", "", "proxy to the hub (default: HTTPS_PROXY from the environment)")
	f.BoolVar(&apply, "apply", false, "apply the cloud-init now and wait until the agent is connected (the default)")
	f.BoolVar(&writeOnly, "write-only", false, "only write the cloud-init to --cloud-init-dir, for the next boot")
	f.StringVar(&c.CloudInitDir, "cloud-init-dir", onboard.DefaultSeedDir, "NoCloud seed dir for --write-only")
	f.StringVar(&c.Machine.StateDir, "state-dir", edgecli.DefaultStateDir(),
		"the agent's state dir (env TETHER_STATE_DIR)")
	f.BoolVar(&c.Force, "force", false,
		"onboard again although the state dir holds an identity (same key: the hub returns the same node)")
	f.BoolVar(&nonInt, "non-interactive", false, "take every input from flags and the environment; never prompt")
	f.BoolVar(&accessible, "accessible", false, "plain line prompts instead of the full-screen form (also when TERM=dumb)")
	f.DurationVar(&c.Timeout, "timeout", 0, "with --apply: how long to wait for the agent to connect (default 2m)")
	f.IntVar(&c.Attempts, "attempts", 6,
		"tries of each network step before giving up (backoff doubles from 1s, capped at 30s)")
	f.StringVar(&output, "output", "text", "text or json (the result on stdout; tables and progress on stderr)")
	f.StringVar(&root, "root", cmp.Or(os.Getenv("TETHER_ONBOARD_ROOT"), "/"), "the machine's root filesystem: "+
		"facts are read and cloud-init files written under it (for image builds and tests; env TETHER_ONBOARD_ROOT)")
	cmd.Alias("o", "output")
	return cmd
}

// agentExe is the agent executable onboarding installs and starts: this
// one, or the agent that ran this sibling (EnvAgentExe, an absolute path
// to a file that exists).
func agentExe() (string, error) {
	if p := os.Getenv(EnvAgentExe); p != "" {
		if !strings.HasPrefix(p, "/") {
			return "", fmt.Errorf("%s=%q: want the absolute path of tether-edge", EnvAgentExe, p)
		}
		if _, err := os.Stat(p); err != nil {
			return "", fmt.Errorf("%s: %w", EnvAgentExe, err)
		}
		return p, nil
	}
	return os.Executable()
}

// readCredential takes --credential @FILE or the value, else
// TETHER_ONBOARD_CREDENTIAL.
func readCredential(flag string) (string, error) {
	if flag == "" {
		return strings.TrimSpace(os.Getenv("TETHER_ONBOARD_CREDENTIAL")), nil
	}
	if path, ok := strings.CutPrefix(flag, "@"); ok {
		b, err := os.ReadFile(path)
		if err != nil {
			return "", fmt.Errorf("--credential: %w", err)
		}
		return strings.TrimSpace(string(b)), nil
	}
	return strings.TrimSpace(flag), nil
}
