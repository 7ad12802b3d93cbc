package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/hub/api/apitype"
	"github.com/tether-dev/tether/internal/testenv"
)

func fakeTrust(t *testing.T, suffix, bastion string) apitype.SSHTrust {
	t.Helper()
	ca := testenv.NewKey(t)
	return apitype.SSHTrust{Bastion: bastion, BastionAlias: suffix + "-hub", NodeSuffix: suffix,
		HostCAs: []string{strings.TrimSpace(string(gossh.MarshalAuthorizedKey(ca.Pub())))}}
}

// TestSSHProfilesForTwoHubs writes the profiles of two hubs into one ssh
// config and one known_hosts: both profiles and both CA lines stay, a
// rewrite replaces only its own block and adds no duplicate line, and
// OpenSSH (ssh -G) resolves each hub's nodes through that hub's bastion.
func TestSSHProfilesForTwoHubs(t *testing.T) {
	dir := t.TempDir()
	cfgPath, known := filepath.Join(dir, "ssh_config"), filepath.Join(dir, "known_hosts")
	// Something the user wrote before stays untouched.
	testenv.WriteFile(t, cfgPath, []byte("Host mine\n  User me\n"), 0o600)
	testenv.WriteFile(t, known,
		[]byte("github.com ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOMqqnkVzrm0SdG6UOoqKLsabgH5C9okWi0dh2l9GKJl\n"), 0o644)
	dev := fakeTrust(t, "tether", "127.0.0.1:2222")
	prod := fakeTrust(t, "prod", "127.0.0.1:2223")

	write := func(trust apitype.SSHTrust, name string) {
		t.Helper()
		p := sshProfile{Name: name, Login: "alice", KnownHosts: known}
		if err := p.writeConfig(trust, cfgPath); err != nil {
			t.Fatalf("profile %q: %v", name, err)
		}
	}
	write(dev, "")
	write(prod, "prod")
	write(dev, "") // again: replaced in place, not appended

	cfg, _ := os.ReadFile(cfgPath)
	kh, _ := os.ReadFile(known)
	for _, want := range []string{
		"Host mine\n", "Host tether-hub\n", "Host *.tether\n", "Host prod-hub\n", "Host *.prod\n", "  ProxyJump prod-hub\n",
	} {
		if strings.Count(string(cfg), want) != 1 {
			t.Errorf("ssh config has %q %d times, want once:\n%s", want, strings.Count(string(cfg), want), cfg)
		}
	}
	for _, want := range []string{"github.com ssh-ed25519",
		"@cert-authority *.tether,tether-hub,[127.0.0.1]:2222 " + dev.HostCAs[0],
		"@cert-authority *.prod,prod-hub,[127.0.0.1]:2223 " + prod.HostCAs[0]} {
		if strings.Count(string(kh), want) != 1 {
			t.Errorf("known_hosts has %q %d times, want once:\n%s", want, strings.Count(string(kh), want), kh)
		}
	}

	if _, err := exec.LookPath("ssh"); err != nil {
		t.Skip("no ssh client for ssh -G")
	}
	for host, want := range map[string][]string{
		"root@n1.prod":   {"proxyjump prod-hub", "user root", "userknownhostsfile " + known},
		"root@n1.tether": {"proxyjump tether-hub"},
		"prod-hub":       {"hostname 127.0.0.1", "port 2223", "user alice", "hostkeyalias prod-hub"},
		"tether-hub":     {"port 2222", "hostkeyalias tether-hub"},
	} {
		out, err := exec.Command("ssh", "-G", "-F", cfgPath, host).CombinedOutput()
		if err != nil {
			t.Fatalf("ssh -G %s: %v\n%s", host, err, out)
		}
		for _, w := range want {
			if !strings.Contains(string(out), "\n"+w+"\n") {
				t.Errorf("ssh -G %s: no %q line", host, w)
			}
		}
	}
}

func TestSSHProfileRefusesSuffixTheHubDoesNotCertify(t *testing.T) {
	p := sshProfile{Name: "prod", Login: "alice", KnownHosts: filepath.Join(t.TempDir(), "kh")}
	_, err := p.write(fakeTrust(t, "tether", "127.0.0.1:2222"))
	if err == nil || !strings.Contains(err.Error(), "--node-suffix prod") {
		t.Fatalf("profile prod for a hub with suffix tether: %v, want advice to use --node-suffix prod", err)
	}
}

func TestReplaceProfile(t *testing.T) {
	block := func(name, body string) string {
		return profileBegin(name) + "\n" + body + "\n" + profileEnd(name) + "\n"
	}
	tests := []struct {
		name, in, profile, want string
		wantErr                 bool
	}{
		{name: "empty", in: "", profile: "a", want: block("a", "new")},
		{name: "append after text without newline", in: "Host x", profile: "a", want: "Host x\n" + block("a", "new")},
		{
			name:    "replace only its own",
			in:      block("a", "old") + block("b", "keep"),
			profile: "a",
			want:    block("a", "new") + block("b", "keep"),
		},
		{
			name:    "a name that is a prefix of another",
			in:      block("ab", "keep"),
			profile: "a",
			want:    block("ab", "keep") + block("a", "new"),
		},
		{name: "begin without end", in: profileBegin("a") + "\nHost x\n", profile: "a", wantErr: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := replaceProfile(tt.in, tt.profile, block(tt.profile, "new"))
			if (err != nil) != tt.wantErr {
				t.Fatalf("err = %v, want error %v", err, tt.wantErr)
			}
			if err == nil && got != tt.want {
				t.Errorf("got\n%s\nwant\n%s", got, tt.want)
			}
		})
	}
}

// TestSiteKnownHosts: each site's host CA is written for names below that
// site only; a suffix that is no site path, or a site named like the hub's
// node suffix, is trusted for nothing.
func TestSiteKnownHosts(t *testing.T) {
	trust := fakeTrust(t, "tether", "127.0.0.1:2222")
	trust.Sites = []apitype.SiteHostCA{
		{Suffix: "berlin", HostCAs: []string{"ssh-ed25519 AAAAberlin"}},
		{Suffix: "sub.berlin", HostCAs: []string{"ssh-ed25519 AAAAsub"}},
		{Suffix: "*", HostCAs: []string{"ssh-ed25519 AAAAevil"}},
		{Suffix: "x,*", HostCAs: []string{"ssh-ed25519 AAAAevil"}},
		// Named like the hub's suffix: trusted for *.tether, every node
		// of the hub, and, below it, for another site's names.
		{Suffix: "tether", HostCAs: []string{"ssh-ed25519 AAAAevil"}},
		{Suffix: "berlin.tether", HostCAs: []string{"ssh-ed25519 AAAAevil"}},
	}
	got := strings.Join(siteKnownHosts(trust, "tether"), "\n")
	want := "@cert-authority *.berlin,*.berlin.tether ssh-ed25519 AAAAberlin\n" +
		"@cert-authority *.sub.berlin,*.sub.berlin.tether ssh-ed25519 AAAAsub"
	if got != want {
		t.Fatalf("lines:\n%s\nwant\n%s", got, want)
	}
}
