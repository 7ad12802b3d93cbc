package main

import (
	"fmt"
	"net"
	"os"
	"os/user"
	"path/filepath"
	"slices"
	"strings"

	"github.com/spf13/cobra"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/pki"
)

type inventoryOptions struct {
	cf           clientFlags
	selector     string
	ansible      bool
	host         string
	login        string
	operator     string
	knownHosts   string
	identityFile string
	certFile     string
	sshConfig    string
}

func newInventoryCmd() *cobra.Command {
	var o inventoryOptions
	cmd := &cobra.Command{
		Use:   "inventory [-l SELECTOR] [--ansible]",
		Short: "Print the nodes you may reach as a dynamic inventory (Ansible's --list JSON with --ansible)",
		Long: `Print the nodes you may reach (all for the admin; for an operator or an API
token, the nodes their roles select) with how to reach them through the hub.

With --ansible the output is Ansible's dynamic inventory format ('--list'):
every node is a host named after it, with ansible_host NAME.SUFFIX (the names
the hub's host certificates carry) and ansible_ssh_common_args that jump
through the hub's bastion and verify the bastion and the node by the hub's host
CA (the known_hosts file 'tether config ssh' writes). Each hub-set label KEY=VALUE
makes a group KEY_VALUE (characters Ansible does not allow become '_'), online
nodes are also in the group tether_online. Labels a node reports about itself
are only hostvars (tether_reported_labels), never groups: a node must not be
able to put itself into a group that playbooks target.

Use it as an inventory script: a file inventory.sh containing
  #!/bin/sh
  exec tether inventory --ansible --hub HUB:7443 "$@"
then 'ansible -i inventory.sh all -m ping'. Ansible calls it with --list (the
same as no flag) or --host NAME.`,
		Example: `  tether inventory --ansible -l env=prod
  ansible-inventory -i ./inventory.sh --graph`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error { return o.run(cmd) },
	}
	f := cmd.Flags()
	f.StringVarP(&o.selector, "selector", "l", "", "only nodes whose labels match this selector")
	f.BoolVar(&o.ansible, "ansible", false, "Ansible's dynamic inventory format")
	f.Bool("list", false, "Ansible's inventory-script call: the same as no flag")
	f.StringVar(&o.host, "host", "",
		"Ansible's inventory-script call for one host's variables (answered with {}: they are all in _meta)")
	f.StringVar(&o.login, "login", "", "login on the nodes (ansible_user; default: Ansible's own)")
	f.StringVar(&o.operator, "user", "", "your operator name at the bastion (default: your login name)")
	f.StringVar(&o.knownHosts, "known-hosts", "",
		"known_hosts with the hub's host CA, from 'tether config ssh' (default ~/.tether/known_hosts)")
	f.StringVar(&o.identityFile, "identity-file", "", "private key to use for the bastion and the nodes")
	f.StringVar(&o.certFile, "certificate-file", "", "user certificate from 'tether login' to offer")
	f.StringVar(&o.sshConfig, "ssh-config", "",
		"an ssh config from 'tether config ssh' to use (-F) instead of the jump settings above")
	o.cf.register(cmd)
	return cmd
}

func (o *inventoryOptions) run(cmd *cobra.Command) error {
	if o.host != "" {
		// Everything is in _meta.hostvars, so Ansible never asks; answer
		// as the format says anyway.
		_, err := fmt.Fprintln(os.Stdout, "{}")
		return err
	}
	c, err := o.cf.client()
	if err != nil {
		return err
	}
	defer c.Close()
	nodes, err := c.ListNodesMatching(cmd.Context(), o.selector)
	if err != nil {
		return err
	}
	trust, err := c.SSHTrust(cmd.Context())
	if err != nil {
		return err
	}
	sshArgs, err := o.sshArgs(trust)
	if err != nil {
		return err
	}
	hosts := inventoryHosts(nodes, trust.NodeSuffix)
	if !o.ansible {
		for i := range hosts {
			hosts[i].SSHArgs = sshArgs
		}
		return printJSON(os.Stdout, hosts)
	}
	return printJSON(os.Stdout, ansibleInventory(hosts, sshArgs, o.login))
}

// sshArgs are the OpenSSH options that reach a node through the hub: a
// ProxyCommand to the bastion (what ProxyJump does, but with the bastion
// verified by the hub's host CA, which options given to ProxyJump would not
// reach), and the node verified by the same CA.
func (o *inventoryOptions) sshArgs(trust apitype.SSHTrust) (string, error) {
	if o.sshConfig != "" {
		abs, err := filepath.Abs(o.sshConfig)
		if err != nil {
			return "", err
		}
		return "-F " + shellQuote(abs), nil
	}
	if o.operator == "" {
		u, err := user.Current()
		if err != nil {
			return "", fmt.Errorf("--user is required: %w", err)
		}
		o.operator = u.Username
	}
	if err := pki.ValidateName(o.operator); err != nil {
		return "", fmt.Errorf("--user: operator %w", err)
	}
	if o.knownHosts == "" {
		home, err := os.UserHomeDir()
		if err != nil {
			return "", fmt.Errorf("--known-hosts is required: %w", err)
		}
		o.knownHosts = filepath.Join(home, ".tether", "known_hosts")
	}
	host, port, err := net.SplitHostPort(trust.Bastion)
	if err != nil {
		return "", fmt.Errorf("hub reported bastion %q: %w", trust.Bastion, err)
	}
	common := []string{"-o", "UserKnownHostsFile=" + o.knownHosts, "-o", "StrictHostKeyChecking=yes"}
	for _, f := range []struct{ path, opt string }{{o.identityFile, "IdentityFile="}, {o.certFile, "CertificateFile="}} {
		if f.path == "" {
			continue
		}
		abs, err := filepath.Abs(f.path)
		if err != nil {
			return "", err
		}
		common = append(common, "-o", f.opt+abs)
	}
	proxy := append([]string{"ssh", "-p", port, "-o", "HostKeyAlias=" + trust.BastionAlias}, common...)
	proxy = append(proxy, "-W", "%h:%p", o.operator+"@"+host)
	args := append([]string{"-o", "ProxyCommand=" + strings.Join(quoteAll(proxy), " ")}, common...)
	return strings.Join(quoteAll(args), " "), nil
}

// inventoryHost is one node of `tether inventory` (without --ansible).
type inventoryHost struct {
	Name           string            `json:"name"`
	Host           string            `json:"host"` // NAME.SUFFIX, as the node's host certificate names it
	Online         bool              `json:"online"`
	Labels         map[string]string `json:"labels"`
	ReportedLabels map[string]string `json:"reported_labels,omitempty"`
	SSHArgs        string            `json:"ssh_args,omitempty"`
}

// inventoryHosts are the reachable (not revoked) nodes.
func inventoryHosts(nodes []apitype.Node, suffix string) []inventoryHost {
	out := []inventoryHost{}
	for _, n := range nodes {
		if !n.RevokedAt.IsZero() {
			continue
		}
		labels := n.Labels
		if labels == nil {
			labels = map[string]string{}
		}
		out = append(out, inventoryHost{
			Name:           n.Name,
			Host:           n.Name + "." + suffix,
			Online:         n.Online,
			Labels:         labels,
			ReportedLabels: n.ReportedLabels,
		})
	}
	return out
}

// ansibleGroup is a group of Ansible's inventory JSON.
type ansibleGroup struct {
	Hosts    []string `json:"hosts,omitempty"`
	Children []string `json:"children,omitempty"`
}

// ansibleInventory is Ansible's `--list` document: groups by name, and
// _meta.hostvars with every host's variables, so Ansible never calls
// --host.
func ansibleInventory(hosts []inventoryHost, sshArgs, login string) map[string]any {
	groups := map[string]*ansibleGroup{}
	add := func(group, host string) {
		g := groups[group]
		if g == nil {
			g = &ansibleGroup{}
			groups[group] = g
		}
		g.Hosts = append(g.Hosts, host)
	}
	hostvars := map[string]map[string]any{}
	var ungrouped []string
	for _, h := range hosts {
		vars := map[string]any{
			"ansible_host":            h.Host,
			"ansible_ssh_common_args": sshArgs,
			"tether_labels":           h.Labels,
			"tether_online":           h.Online,
		}
		if len(h.ReportedLabels) > 0 {
			vars["tether_reported_labels"] = h.ReportedLabels
		}
		if login != "" {
			vars["ansible_user"] = login
		}
		hostvars[h.Name] = vars
		for k, v := range h.Labels {
			add(ansibleGroupName(k, v), h.Name)
		}
		if h.Online {
			add("tether_online", h.Name)
		}
		if len(h.Labels) == 0 {
			ungrouped = append(ungrouped, h.Name)
		}
	}
	if len(ungrouped) > 0 {
		groups["ungrouped"] = &ansibleGroup{Hosts: ungrouped}
	}
	out := map[string]any{"_meta": map[string]any{"hostvars": hostvars}}
	children := []string{}
	for name, g := range groups {
		slices.Sort(g.Hosts)
		out[name] = g
		children = append(children, name)
	}
	slices.Sort(children)
	out["all"] = map[string]any{"children": children} // present even when empty
	return out
}

// ansibleGroupName is the group of label KEY=VALUE: KEY_VALUE (KEY for an
// empty value), with every character Ansible warns about in group names
// (anything but letters, digits and '_') replaced by '_', and a leading
// digit prefixed with '_'.
func ansibleGroupName(k, v string) string {
	name := k
	if v != "" {
		name += "_" + v
	}
	b := []byte(name)
	for i, c := range b {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
			b[i] = '_'
		}
	}
	if len(b) > 0 && b[0] >= '0' && b[0] <= '9' {
		return "_" + string(b)
	}
	return string(b)
}

func quoteAll(args []string) []string {
	out := make([]string, len(args))
	for i, a := range args {
		out[i] = shellQuote(a)
	}
	return out
}

// shellQuote quotes s for a POSIX shell (and Python's shlex, which Ansible
// splits ansible_ssh_common_args with) when it needs quoting.
func shellQuote(s string) string {
	if s != "" && strings.IndexFunc(s, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' ||
			strings.ContainsRune("@%+=:,./_-", r))
	}) < 0 {
		return s
	}
	return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'"
}
