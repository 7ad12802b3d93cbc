package e2e

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestAttackJumpRefusalsAudited: the bastion forwards only to node names,
// and only to nodes the operator's roles select, and the node forwards
// only to its allow-listed ports. Every other direct-tcpip target — an IP
// address, localhost, the hub's own API and SSH ports, another role's
// node, a port the node does not allow (SSRF) — is refused with a clear
// error and an audit event.
func TestAttackJumpRefusalsAudited(t *testing.T) {
	t.Parallel()
	h := startHubArgs(t, 0)
	h.cli("operator", "add", "alice", "--key", opPub)
	bobKey := filepath.Join(t.TempDir(), "bob")
	runCmd(t, 10*time.Second, "ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", bobKey)
	h.cli("role", "create", "elsewhere", "--nodes", "site=elsewhere", "--logins", loginUser)
	h.cli("operator", "add", "bob", "--key", bobKey+".pub", "--role", "elsewhere")
	startAgent(t, h.token("--label", "site=lab"), "target1", "--ssh", "embedded", "--allow-port", "1")
	h.waitOnline("target1", "")
	alice := newSSHClient(t, h)
	bob := newSSHClientAs(t, h, "bob", bobKey)
	sshPort := strconv.Itoa(h.sshPort)

	cases := []struct {
		name   string
		c      *sshClient
		target string // for ssh -W
		stderr string
		result string // audit result
		node   string // audit node
		detail string
	}{
		{"loopback IP", alice, "127.0.0.1:22", "tether forwards only to node names", "not_a_node", "127.0.0.1",
			"is an address"},
		{"private IP", alice, "10.0.0.7:22", "tether forwards only to node names", "not_a_node", "10.0.0.7", "is an address"},
		{"IPv6 loopback", alice, "[::1]:22", "tether forwards only to node names", "not_a_node", "::1", "is an address"},
		{"localhost", alice, "localhost:22", "tether forwards only to node names", "not_a_node", "localhost",
			"is an address"},
		{"hub API port", alice, h.apiAddr(), "tether forwards only to node names", "not_a_node", "127.0.0.1",
			"is an address"},
		{"hub SSH port", alice, h.sshAddr(), "tether forwards only to node names", "not_a_node", "127.0.0.1",
			"is an address"},
		{"hub by name", alice, "tether-hub:" + sshPort, `no node named "tether-hub"`, "dial_failed", "tether-hub",
			"no node named"},
		{"DNS name", alice, "example.com:443", "not a node", "not_a_node", "example.com", "invalid name"},
		{"port not allowed on the node", alice, "target1.tether:8080", "port 8080 is not in this node's allow-list",
			"dial_failed", "target1", "allow-list"},
		{"node outside the role", bob, "target1.tether:22", `roles (elsewhere) do not select node "target1"`,
			"denied", "target1", "do not select"},
	}
	for _, tc := range cases {
		op := tc.c.operator
		_, errOut, code := runCmd(t, 30*time.Second, "ssh", "-F", tc.c.cfg, "-W", tc.target, "-p", sshPort, op+"@127.0.0.1")
		if code == 0 || !strings.Contains(errOut, tc.stderr) {
			t.Errorf("%s: ssh -W %s: exit %d, %q; want %q", tc.name, tc.target, code, errOut, tc.stderr)
		}
	}
	// The allow-listed port is forwarded (nothing listens there, so the
	// node says that instead): the refusals above are policy, not plumbing.
	_, errOut, _ := runCmd(t, 30*time.Second, "ssh", "-F", alice.cfg, "-W", "target1.tether:1", "-p", sshPort,
		"alice@127.0.0.1")
	if !strings.Contains(errOut, "local port at 127.0.0.1:1 unreachable") {
		t.Errorf("allowed port: %q", errOut)
	}

	events := h.audit("--since", "1h")
	for _, tc := range cases {
		found := false
		for _, e := range events {
			if e.Kind == "jump" && e.Operator == tc.c.operator && e.Result == tc.result && e.Node == tc.node &&
				strings.Contains(e.Detail, tc.detail) {
				found = true
			}
		}
		if !found {
			t.Errorf("%s: no audit event (jump, %s, node %q, detail %q)", tc.name, tc.result, tc.node, tc.detail)
		}
	}
	if t.Failed() {
		for _, e := range events {
			t.Log(fmt.Sprintf("%+v", e))
		}
	}
}
