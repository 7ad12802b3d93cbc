package e2e

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
)

// TestWithdrawnAccessEndsJumps: an operator holds a long command open on a
// node through `ssh -J`; withdrawing their access (removing them, revoking
// the key they jumped with, narrowing or deleting their role, editing their
// roles) ends the jump within seconds, and the audit log records it as
// "ended: access withdrawn" with the reason. The node runs stock sshd that
// accepts the operators' keys itself, so only the hub can end the session.
func TestWithdrawnAccessEndsJumps(t *testing.T) {
	t.Parallel()
	h := startHub(t)
	dir := t.TempDir()
	h.cli("role", "create", "lab", "--nodes", "site=lab", "--logins", loginUser)
	h.cli("role", "create", "elsewhere", "--nodes", "site=elsewhere", "--logins", loginUser)

	type step struct {
		name     string
		roles    []string // the operator's roles; each case may own one role it changes
		ownRole  string   // created for this case, selecting the node
		withdraw func(op string, keys []*testenv.Key)
		reason   string // in the ended jump's audit detail
	}
	cases := []step{
		{name: "operator removed", roles: []string{"lab"},
			withdraw: func(op string, _ []*testenv.Key) { h.cli("operator", "rm", op) },
			reason:   "was removed"},
		{name: "key revoked", roles: []string{"lab"},
			withdraw: func(op string, keys []*testenv.Key) {
				h.cli("operator", "key", "rm", op, gossh.FingerprintSHA256(keys[0].Pub()))
			},
			reason: "was revoked"},
		{name: "role narrowed", ownRole: "narrowed",
			withdraw: func(string, []*testenv.Key) {
				h.cli("role", "create", "narrowed", "--nodes", "site=elsewhere", "--logins", loginUser)
			},
			reason: "do not select node"},
		{name: "role deleted", ownRole: "deleted",
			withdraw: func(string, []*testenv.Key) { h.cli("role", "rm", "deleted") },
			reason:   "do not select node"},
		{name: "roles edited", roles: []string{"lab"},
			withdraw: func(op string, _ []*testenv.Key) { h.cli("operator", "edit", op, "--role", "elsewhere") },
			reason:   "do not select node"},
	}
	// Every case's operator has two keys; the node's sshd accepts them all.
	var authorized []byte
	keys := map[string][]*testenv.Key{}
	for i := range cases {
		op := fmt.Sprintf("op%d", i)
		for j := range 2 {
			k := testenv.NewKeyFile(t, filepath.Join(dir, fmt.Sprintf("%s-%d", op, j)))
			keys[op] = append(keys[op], k)
			authorized = append(authorized, gossh.MarshalAuthorizedKey(k.Pub())...)
		}
	}
	sd := testenv.StartSSHD(t, testenv.SSHDConfig{Dir: filepath.Join(dir, "sshd"), AuthorizedKeys: authorized})
	startAgent(t, h.token("--label", "site=lab"), "w1", "--ssh", sd.Addr)
	h.waitOnline("w1", "")

	for i, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			op := fmt.Sprintf("op%d", i)
			ks := keys[op]
			roles := c.roles
			if c.ownRole != "" {
				h.cli("role", "create", c.ownRole, "--nodes", "site=lab", "--logins", loginUser)
				roles = []string{c.ownRole}
			}
			args := []string{"add", op, "--key", ks[0].Path + ".pub", "--key", ks[1].Path + ".pub"}
			for _, r := range roles {
				args = append(args, "--role", r)
			}
			h.cli(append([]string{"operator"}, args...)...)
			cl := newSSHClientAs(t, h, op, ks[0].Path)
			cl.trust("w1.tether", sd.HostKey.Pub())

			// The loop would run for a minute.
			s := start(t, "ssh-loop-"+op, "ssh",
				append(cl.jumpArgs("w1", "-T"),
					"echo started; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; echo finished")...)
			waitFor(t, op+"'s loop to start", 30*time.Second, func() bool { return strings.Contains(s.Log(), "started") })

			at := time.Now()
			c.withdraw(op, ks)
			waitFor(t, op+"'s ssh to exit after the withdrawal", 10*time.Second, s.Exited)
			took := time.Since(at)
			t.Logf("ssh exited %s after the withdrawal command started", took.Round(time.Millisecond))
			if strings.Contains(s.Log(), "finished") {
				t.Fatalf("the loop ran to its end: %s", s.Log())
			}
			if took > 5*time.Second {
				t.Errorf("ssh took %s to exit after the withdrawal", took)
			}
			var ended *auditJSON
			for _, e := range h.audit("--operator", op) {
				if e.Kind == "jump" && e.Result == "ended: access withdrawn" {
					ended = &e
				}
			}
			if ended == nil || !strings.Contains(ended.Detail, c.reason) || ended.Node != "w1" ||
				ended.KeyFP != gossh.FingerprintSHA256(ks[0].Pub()) {
				t.Fatalf("audit of %s: want a jump ended by access withdrawal (%q), got %+v", op, c.reason,
					h.audit("--operator", op))
			}
			if c.name == "key revoked" {
				// The operator's other key still jumps.
				other := newSSHClientAs(t, h, op, ks[1].Path)
				other.trust("w1.tether", sd.HostKey.Pub())
				if out, errOut, code := other.run(30*time.Second, "w1", "echo other-key"); code != 0 ||
					strings.TrimSpace(out) != "other-key" {
					t.Fatalf("jump with the operator's remaining key: exit %d %q %q", code, out, errOut)
				}
				if _, errOut, code := cl.run(30*time.Second, "w1", "true"); code == 0 {
					t.Fatalf("jump with the revoked key succeeded: %q", errOut)
				}
			}
		})
	}
}

// TestOperatorKeysSurviveKill: several keys, a revoked key and replaced
// roles are stored before the CLI returns: after kill -9 of the hub the
// operator has exactly those keys and roles, the remaining keys log in and
// the revoked one does not.
func TestOperatorKeysSurviveKill(t *testing.T) {
	t.Parallel()
	h := startHub(t)
	dir := t.TempDir()
	var keys []*testenv.Key
	for i := range 3 {
		keys = append(keys, testenv.NewKeyFile(t, filepath.Join(dir, fmt.Sprintf("k%d", i))))
	}
	h.cli("role", "create", "lab", "--nodes", "site=lab", "--logins", loginUser)
	h.cli("operator", "add", "bob", "--key", keys[0].Path+".pub", "--key", keys[1].Path+".pub")
	h.cli("operator", "key", "add", "bob", "--key", keys[2].Path+".pub")
	h.cli("operator", "key", "rm", "bob", gossh.FingerprintSHA256(keys[0].Pub()))
	h.cli("operator", "edit", "bob", "--role", "lab", "--role", "all")
	h.p.Stop(syscall.SIGKILL, stopWait)
	h.start()

	var ops []struct {
		Name  string   `json:"name"`
		Roles []string `json:"roles"`
		Keys  []struct {
			Fingerprint string `json:"fingerprint"`
		} `json:"keys"`
	}
	if err := json.Unmarshal([]byte(h.cli("operator", "list", "-o", "json")), &ops); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, k := range ops[0].Keys {
		got = append(got, k.Fingerprint)
	}
	want := []string{gossh.FingerprintSHA256(keys[1].Pub()), gossh.FingerprintSHA256(keys[2].Pub())}
	if len(ops) != 1 || !slices.Equal(got, want) || !slices.Equal(ops[0].Roles, []string{"all", "lab"}) {
		t.Fatalf("after kill -9: %+v, want keys %v and roles [all lab]", ops, want)
	}
	login := func(k *testenv.Key) int {
		_, _, code := runCmd(t, 30*time.Second, filepath.Join(binDir, "tether"), "login", "--data-dir", h.dataDir,
			"--user", "bob", "--key", k.Path, "--out-dir", t.TempDir())
		return code
	}
	if login(keys[1]) != 0 || login(keys[2]) != 0 {
		t.Error("a remaining key does not log in after the restart")
	}
	if login(keys[0]) == 0 {
		t.Error("the revoked key logs in after the restart")
	}
}
