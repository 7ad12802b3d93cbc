package main

import (
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/crypto/ssh"
	"golang.org/x/crypto/ssh/agent"
	"golang.org/x/term"

	"github.com/tether-dev/tether/cmd/tether/internal/bulkonboard"
)

// newOnboardCmd groups onboarding run from the admin's side.
func newOnboardCmd() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "onboard",
		Short: "Onboard machines that are not managed yet, from this machine over SSH",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(newOnboardBulkCmd())
	return cmd
}

func newOnboardBulkCmd() *cobra.Command {
	var inventory, credential, output, agentBin, namePattern string
	var keys, knownHosts []string
	cfg := bulkonboard.Config{}
	home, _ := os.UserHomeDir()
	cmd := &cobra.Command{
		Use:   "bulk --inventory FILE --credential @FILE",
		Short: "Onboard many machines at once over plain SSH (tether-edge onboard on each)",
		Long: `Connect to every machine of the inventory with your own SSH identity (ssh-agent
through SSH_AUTH_SOCK, and keys given with -i), copy tether-edge to it if it
has none, and run the non-interactive onboarding there:

  tether-edge onboard --non-interactive --apply -o json --credential @TMPFILE \
      --hub HUB --ca-pin PIN [--name NODE] [--labels K=V,...]

with the credential in a private temporary file it removes afterwards (the
credential travels on the SSH channel, never on a command line). Hosts run
in parallel (--parallel); a progress bar is drawn on a terminal, then a
table (or -o json) with one row per host: onboarded, already-onboarded, or
failed with the step and the reason.

Host keys are checked against known_hosts (--known-hosts; default
~/.ssh/known_hosts and /etc/ssh/ssh_known_hosts). There is no trust on
first use: a host whose key is not there fails, saying the key's
fingerprint, and the others go on.

The inventory has one machine per line, [USER@]HOST[:PORT] followed by
an optional name=NODE, the node's name, and optional labels KEY=VALUE that
the machine reports (onboarding writes them to its labels file; the hub's own
labels come from the credential); # starts a comment:

  # Berlin shops
  root@10.0.0.7 name=shop-7 site=berlin
  admin@shop-8.example:2222 site=berlin rack=2
  [2001:db8::9]:22

A host without name= is named by --name-pattern when given: {host} is its
HOST with every character a node name cannot hold as '-' (pi-{host}: 10.0.0.7
becomes pi-10-0-0-7), {n} its position in the inventory (1, 2, ...). Without
either the hub names the node after the machine's host name, so machines that
share one (every Raspberry Pi is "raspberrypi") need name= or --name-pattern:
the second is refused as "name taken". The names are checked, and two hosts
asking for the same name refused, before any host is contacted.

Running the same command again finishes the hosts that failed: hosts
already onboarded are left as they are. The exit status is 0 when no host
failed, 1 otherwise.`,
		Example: `  tether onboard bulk --inventory hosts.txt --credential @cred --parallel 20
  tether onboard bulk --inventory pis.txt --credential @cred --name-pattern 'pi-{host}'
  tether onboard bulk --inventory hosts.txt --credential @cred --ssh-user admin -i ~/.ssh/fleet_ed25519 -o json`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if output != "table" && output != "json" {
				return codedError{2, fmt.Sprintf("-o %q: want table or json", output)}
			}
			f, err := os.Open(inventory)
			if err != nil {
				return fmt.Errorf("--inventory: %w", err)
			}
			cfg.Hosts, err = bulkonboard.ParseInventory(f)
			f.Close()
			if err == nil {
				err = bulkonboard.NameHosts(cfg.Hosts, namePattern)
			}
			if err != nil {
				return fmt.Errorf("%s: %w", inventory, err)
			}
			if cfg.Credential, err = readCredential(credential); err != nil {
				return err
			}
			for _, k := range keys {
				s, err := loadSSHKey(k)
				if err != nil {
					return err
				}
				cfg.SSH.Signers = append(cfg.SSH.Signers, s)
			}
			if sock := os.Getenv("SSH_AUTH_SOCK"); sock != "" {
				conn, err := net.Dial("unix", sock)
				if err != nil {
					return fmt.Errorf("ssh-agent at SSH_AUTH_SOCK=%s: %w (unset it to use only -i keys)", sock, err)
				}
				defer conn.Close()
				cfg.SSH.Agent = agent.NewClient(conn)
			}
			cfg.SSH.KnownHosts = knownHosts
			if agentBin == "" {
				agentBin = defaultAgentBinary()
			}
			if agentBin != "" {
				if cfg.Agent, err = os.ReadFile(agentBin); err != nil {
					return fmt.Errorf("--agent-binary: %w (the tether-edge to copy to hosts without one)", err)
				}
			}
			var progress *bulkonboard.Progress
			if term.IsTerminal(int(os.Stderr.Fd())) {
				progress = bulkonboard.NewProgress(os.Stderr, len(cfg.Hosts))
				cfg.OnResult = progress.Add
			}
			results, err := bulkonboard.Run(cmd.Context(), cfg)
			if progress != nil {
				progress.Finish()
			}
			if err != nil {
				return err
			}
			if output == "json" {
				err = printJSON(os.Stdout, results)
			} else {
				err = bulkonboard.WriteTable(os.Stdout, results)
			}
			if err != nil {
				return err
			}
			if bulkonboard.Summarize(results).Failed > 0 {
				return codedError{1, ""}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&inventory, "inventory", "",
		"file with one host per line: [USER@]HOST[:PORT] [name=NODE] [KEY=VALUE...] (required)")
	f.StringVar(&namePattern, "name-pattern", "", "node name of each host whose line has no name=: "+
		"{host} (its HOST, as a name) and {n} (its position) are replaced, e.g. pi-{host} "+
		"(default: the hub names it after the machine's host name)")
	f.StringVar(&credential, "credential", "",
		"onboarding credential from `tether onboarding create`: @FILE (keeps it out of the process list) or the credential "+
			"itself (required)")
	f.IntVar(&cfg.Parallel, "parallel", bulkonboard.DefaultParallel, "hosts onboarded at the same time")
	f.StringVar(&cfg.User, "ssh-user", bulkonboard.DefaultUser, "SSH login for hosts whose line names none")
	f.StringVar(&cfg.Hub, "hub", os.Getenv("TETHER_HUB"),
		"hub address HOST[:PORT] the machines dial, passed to tether-edge onboard --hub (required; env TETHER_HUB)")
	f.StringVar(&cfg.CAPin, "ca-pin", os.Getenv("TETHER_CA_PIN"),
		"the hub CA's pin sha256:HEX (ca_pin of `tether onboarding create -o json`), "+
			"passed to tether-edge onboard --ca-pin (required; env TETHER_CA_PIN)")
	f.StringVarP(&output, "output", "o", "table", "table or json")
	f.StringSliceVarP(&keys, "identity-file", "i", nil,
		"SSH private key to log in with (repeatable; offered before ssh-agent's keys; "+
			"encrypted keys: add them to ssh-agent instead)")
	f.StringSliceVar(&knownHosts, "known-hosts", []string{
		filepath.Join(home, ".ssh", "known_hosts"), "/etc/ssh/ssh_known_hosts",
	}, "known_hosts files the hosts' keys are checked against (repeatable)")
	f.StringVar(&agentBin, "agent-binary", "",
		"local tether-edge copied to hosts that have none (default: tether-edge next to this tether binary)")
	f.StringVar(&cfg.RemotePath, "remote-path", bulkonboard.DefaultRemotePath,
		"where tether-edge is looked for on a host when it is not on its PATH, and copied to")
	f.DurationVar(&cfg.HostTimeout, "timeout", bulkonboard.DefaultHostTimeout,
		"time one host may take, connect to onboarded")
	f.DurationVar(&cfg.SSH.ConnectTimeout, "connect-timeout", 15*time.Second, "time to connect and log in to one host")
	cmd.MarkFlagRequired("inventory")
	cmd.MarkFlagRequired("credential")
	return cmd
}

// readCredential takes --credential: @FILE or the credential itself.
func readCredential(v string) ([]byte, error) {
	if file, ok := strings.CutPrefix(v, "@"); ok {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("--credential: %w", err)
		}
		return b, nil
	}
	return []byte(v), nil
}

// loadSSHKey reads an unencrypted private key (-i).
func loadSSHKey(path string) (ssh.Signer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("-i: %w", err)
	}
	s, err := ssh.ParsePrivateKey(b)
	var pm *ssh.PassphraseMissingError
	if errors.As(err, &pm) {
		return nil, fmt.Errorf("-i %s: the key is encrypted: add it to ssh-agent (ssh-add %s) and leave out -i", path, path)
	}
	if err != nil {
		return nil, fmt.Errorf("-i %s: %w", path, err)
	}
	return s, nil
}

// defaultAgentBinary is the tether-edge next to this tether binary, or ""
// when there is none.
func defaultAgentBinary() string {
	self, err := os.Executable()
	if err != nil {
		return ""
	}
	p := filepath.Join(filepath.Dir(self), "tether-edge")
	if _, err := os.Stat(p); err != nil {
		return ""
	}
	return p
}
