package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/api/apiclient"
	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/pki"
	"github.com/tether-dev/tether/tunnel/siteproto"
)

func newConfigCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "config", Short: "Generate client configuration"}
	cmd.AddCommand(newConfigSSHCmd())
	return cmd
}

func newConfigSSHCmd() *cobra.Command {
	var cf clientFlags
	var p sshProfile
	var sshConfig string
	cmd := &cobra.Command{
		Use:   "ssh",
		Short: "Write an OpenSSH config profile for reaching a hub's nodes as NAME.SUFFIX (no host-key prompts)",
		Long: `Make an OpenSSH client config profile that jumps through the hub for every
host NODE.<suffix> (default: the hub's --node-suffix, "tether"), and add the
hub's host CA as an @cert-authority line to a known_hosts file, so the hub and
every node are verified by certificate: no trust-on-first-use prompt, ever.
Each site hub below it adds a line of its own host CA for names below that
site only ("@cert-authority *.berlin,*.berlin.SUFFIX …"), so nodes below
sites (ssh root@n7.berlin.SUFFIX) are verified the same way.

Each hub gets its own profile (--name, default its node suffix): the bastion is
"Host NAME-hub", its nodes "Host *.SUFFIX". With --ssh-config FILE only that
profile's block (between "# BEGIN tether profile NAME" and "# END …" lines) is
added or replaced; other hubs' profiles stay. Without it the block is printed.
known_hosts lines are only ever added (once), never replaced, so several hubs'
CAs live side by side. Give each hub its own suffix (tether hub --node-suffix).

'tether login' writes its hub's profile to ~/.tether/ssh_config itself.`,
		Example: `  tether config ssh --data-dir ./hub --ssh-config ~/.tether/ssh_config
  ssh -F ~/.tether/ssh_config root@n1.tether
  tether config ssh --hub prod.example.com:7443 --name prod --ssh-config ~/.tether/ssh_config   ` +
			`# a hub started with --node-suffix prod
  echo 'Include ~/.tether/ssh_config' >> ~/.ssh/config   # then plain: ssh root@n1.prod`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := cf.client()
			if err != nil {
				return err
			}
			defer c.Close()
			trust, err := c.SSHTrust(cmd.Context())
			if err != nil {
				return err
			}
			if sshConfig == "" {
				block, err := p.write(trust)
				if err != nil {
					return err
				}
				fmt.Print(block)
				return nil
			}
			return p.writeConfig(trust, sshConfig)
		},
	}
	cf.register(cmd)
	p.register(cmd)
	cmd.Flags().StringVar(&p.Login, "user", "", "your operator name at the bastion (default: your login name)")
	cmd.Flags().StringVar(&p.IdentityFile, "identity-file", "",
		"private key to use (adds IdentityFile; default: ssh's own choice)")
	cmd.Flags().StringVar(&p.CertificateFile, "certificate-file", "",
		"user certificate from tether login to offer (adds CertificateFile)")
	cmd.Flags().StringVar(&sshConfig, "ssh-config", "",
		"add or update this hub's profile in FILE (e.g. ~/.tether/ssh_config) instead of printing it")
	return cmd
}

// sshProfile is one hub's block in an OpenSSH client config: the bastion
// as Host NAME-hub, its nodes as Host *.SUFFIX.
type sshProfile struct {
	Name            string // profile name (default: the hub's node suffix)
	Suffix          string // node host suffix (default: Name)
	Login           string // operator name at the bastion (default: the local user)
	KnownHosts      string // known_hosts file the hub's host CA is added to
	IdentityFile    string // optional IdentityFile
	CertificateFile string // optional CertificateFile
}

// register adds the profile flags (tether config ssh, tether login).
func (p *sshProfile) register(cmd *cobra.Command) {
	f := cmd.Flags()
	f.StringVar(&p.Name, "name", "",
		`ssh profile name for this hub: its bastion is "Host NAME-hub" (default: the hub's node suffix)`)
	f.StringVar(&p.Suffix, "suffix", "",
		"host suffix of this hub's nodes, NODE.SUFFIX (default: --name; must be the hub's --node-suffix)")
	f.StringVar(&p.KnownHosts, "known-hosts", "",
		"known_hosts file the hub's @cert-authority line is added to (default ~/.tether/known_hosts)")
}

// defaults fills the profile's unset fields from trust and the local user,
// and checks them.
func (p *sshProfile) defaults(trust apitype.SSHTrust) error {
	if p.Name == "" {
		p.Name = trust.NodeSuffix
	}
	if p.Suffix == "" {
		p.Suffix = p.Name
	}
	if err := pki.ValidateName(p.Name); err != nil {
		return fmt.Errorf("--name: profile %w", err)
	}
	if p.Suffix != trust.NodeSuffix {
		// The nodes' host certificates name NODE.<hub suffix>: OpenSSH
		// verifies the name typed, so no other suffix can be checked.
		return fmt.Errorf("this hub names its nodes NODE.%s, not NODE.%s: start that hub with --node-suffix %s (each hub "+
			"its own suffix), or pass --suffix %s",
			trust.NodeSuffix, p.Suffix, p.Suffix, trust.NodeSuffix)
	}
	if p.Login == "" {
		u, err := user.Current()
		if err != nil {
			return fmt.Errorf("--user is required: %w", err)
		}
		p.Login = u.Username
	}
	if err := pki.ValidateName(p.Login); err != nil {
		return fmt.Errorf("--user: operator %w", err)
	}
	if p.KnownHosts == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return fmt.Errorf("--known-hosts is required: %w", err)
		}
		p.KnownHosts = filepath.Join(home, ".tether", "known_hosts")
	}
	for _, f := range []*string{&p.KnownHosts, &p.IdentityFile, &p.CertificateFile} {
		if *f == "" {
			continue
		}
		abs, err := filepath.Abs(*f)
		if err != nil {
			return err
		}
		*f = abs
	}
	return nil
}

// write adds the hub's host CA to the profile's known_hosts file and
// returns the profile's config block.
func (p *sshProfile) write(trust apitype.SSHTrust) (string, error) {
	if err := p.defaults(trust); err != nil {
		return "", err
	}
	host, port, err := net.SplitHostPort(trust.Bastion)
	if err != nil {
		return "", fmt.Errorf("hub reported bastion %q: %w", trust.Bastion, err)
	}
	// The bastion is matched by its alias (config below) and by its
	// address, so plain `ssh -J user@HOST:PORT` is verified too.
	bastion := host
	if port != "22" {
		bastion = "[" + host + "]:" + port
	}
	var lines []string
	for _, ca := range trust.HostCAs {
		lines = append(lines, fmt.Sprintf("@cert-authority *.%s,%s,%s %s", p.Suffix, trust.BastionAlias, bastion, ca))
	}
	lines = append(lines, siteKnownHosts(trust, p.Suffix)...)
	added, err := addKnownHosts(p.KnownHosts, lines)
	if err != nil {
		return "", err
	}
	fmt.Fprintf(os.Stderr, "%s: %d hub host CA line(s) added, %d already there\n", p.KnownHosts, added, len(lines)-added)
	idLines := ""
	if p.IdentityFile != "" {
		idLines = "  IdentityFile " + p.IdentityFile + "\n  IdentitiesOnly yes\n"
	}
	if p.CertificateFile != "" {
		idLines += "  CertificateFile " + p.CertificateFile + "\n"
	}
	alias := p.Name + "-hub"
	return fmt.Sprintf(`%s
# Generated by "tether config ssh" at %s. Usage: ssh root@NODE.%s
Host %s
  HostName %s
  Port %s
  User %s
  HostKeyAlias %s
  UserKnownHostsFile %s
  StrictHostKeyChecking yes
%sHost *.%s
  ProxyJump %s
  UserKnownHostsFile %s
  StrictHostKeyChecking yes
%s%s
`, profileBegin(p.Name), time.Now().UTC().Format(time.RFC3339), p.Suffix,
		alias, host, port, p.Login, trust.BastionAlias, p.KnownHosts, idLines,
		p.Suffix, alias, p.KnownHosts, idLines, profileEnd(p.Name)), nil
}

// siteKnownHosts are the @cert-authority lines of the sites below the hub:
// each site's host CA for names below that site only (NODE.SITE, and
// NODE.SITE.SUFFIX through the profile), never for the hub's own nodes.
func siteKnownHosts(trust apitype.SSHTrust, suffix string) []string {
	var lines []string
	for _, s := range trust.Sites {
		if validSitePath(s.Suffix) != nil {
			continue // not a name below the hub: trust nothing for it
		}
		if s.Suffix == suffix || strings.HasSuffix(s.Suffix, "."+suffix) {
			// A site named as the hub's suffix (which hubs now refuse at
			// join): its CA would be trusted for *.SUFFIX, every node of
			// the hub, or for the names of another site.
			fmt.Fprintf(os.Stderr, "site %q is named like this hub's node suffix %q: its host CA is not trusted; "+
				"rejoin that site hub under another --site name\n", s.Suffix, suffix)
			continue
		}
		for _, ca := range s.HostCAs {
			if strings.ContainsAny(ca, "\n\r") {
				continue
			}
			lines = append(lines, fmt.Sprintf("@cert-authority *.%s,*.%s.%s %s", s.Suffix, s.Suffix, suffix, ca))
		}
	}
	return lines
}

func validSitePath(s string) error { return siteproto.ValidPath(s) }

// writeConfig adds or replaces the profile's block in the ssh config file
// path, leaving everything else in it as it was.
func (p *sshProfile) writeConfig(trust apitype.SSHTrust, path string) error {
	block, err := p.write(trust)
	if err != nil {
		return err
	}
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	updated, err := replaceProfile(string(old), p.Name, block)
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return err
	}
	if err := pki.WriteFileAtomic(path, []byte(updated), 0o600); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "%s: profile %q written (ssh -F %s root@NODE.%s, or Include it from ~/.ssh/config)\n", path,
		p.Name, path, p.Suffix)
	return nil
}

func profileBegin(name string) string { return "# BEGIN tether profile " + name }
func profileEnd(name string) string   { return "# END tether profile " + name }

// replaceProfile returns config with name's profile block replaced by block
// (appended when there is none).
func replaceProfile(config, name, block string) (string, error) {
	begin, end := profileBegin(name)+"\n", profileEnd(name)+"\n"
	i := strings.Index(config, begin)
	if i > 0 && config[i-1] != '\n' {
		i = -1 // the marker must start a line
	}
	if i < 0 {
		if config != "" && !strings.HasSuffix(config, "\n") {
			config += "\n"
		}
		return config + block, nil
	}
	j := strings.Index(config[i:], end)
	if j < 0 {
		return "", fmt.Errorf("profile %q has a %q line but no %q line; fix or delete the block by hand", name,
			strings.TrimSpace(begin), strings.TrimSpace(end))
	}
	return config[:i] + block + config[i+j+len(end):], nil
}

// addKnownHosts appends the lines path does not hold yet, and reports how
// many it added. Existing lines, other hubs' CAs included, are kept.
func addKnownHosts(path string, lines []string) (int, error) {
	old, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return 0, err
	}
	have := map[string]bool{}
	for _, l := range strings.Split(string(old), "\n") {
		have[strings.Join(strings.Fields(l), " ")] = true
	}
	out := bytes.NewBuffer(old)
	if len(old) > 0 && !bytes.HasSuffix(old, []byte("\n")) {
		out.WriteByte('\n')
	}
	added := 0
	for _, l := range lines {
		if key := strings.Join(strings.Fields(l), " "); !have[key] {
			have[key] = true
			out.WriteString(l + "\n")
			added++
		}
	}
	if added == 0 {
		return 0, nil
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return 0, err
	}
	return added, pki.WriteFileAtomic(path, out.Bytes(), 0o644)
}

// writeLoginProfile writes the ssh profile of the hub c talks to into
// OUT_DIR/ssh_config, for operator with the certificate tether login just
// wrote, so login and ssh config are one step.
func writeLoginProfile(
	ctx context.Context, c *apiclient.Client, p sshProfile, operator, keyPath, certPath, outDir string,
) error {
	trust, err := c.SSHTrust(ctx)
	if err != nil {
		return fmt.Errorf("read the hub's SSH trust for %s: %w", filepath.Join(outDir, "ssh_config"), err)
	}
	p.Login, p.CertificateFile = operator, certPath
	if _, err := os.Stat(keyPath); err == nil {
		p.IdentityFile = keyPath
	}
	if p.KnownHosts == "" {
		p.KnownHosts = filepath.Join(outDir, "known_hosts")
	}
	return p.writeConfig(trust, filepath.Join(outDir, "ssh_config"))
}
