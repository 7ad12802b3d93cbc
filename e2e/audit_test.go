package e2e

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	gossh "golang.org/x/crypto/ssh"

	"github.com/tether-dev/tether/internal/testenv"
)

// TestWithdrawnSessionToldWhy: an operator with a live session through
// the bastion on a node whose agent serves SSH itself is removed, or the
// node is relabelled out of their roles: their ssh prints why on stderr
// (not just "Connection closed by remote host") and exits within seconds;
// the hub's jump row reads "ended: access withdrawn", and the node's
// report is one ssh_session_revoked row for the one ended session,
// however many access pushes (keys, then trust) reach the node.
func TestWithdrawnSessionToldWhy(t *testing.T) {
	t.Parallel()
	h := startHub(t)
	h.cli("role", "create", "lab", "--nodes", "site=lab", "--logins", loginUser)
	for _, n := range []string{"w1", "w2"} {
		startAgent(t, h.token("--label", "site=lab"), n, "--ssh", "embedded")
		h.waitOnline(n, "")
	}
	for i, c := range []struct {
		name, node string
		withdraw   func(op string)
		reason     string // in the jump row's detail
	}{
		{"operator removed", "w1", func(op string) { h.cli("operator", "rm", op) }, "was removed"},
		{"node relabelled", "w2", func(string) { h.cli("nodes", "label", "w2", "site=elsewhere") }, "do not select node"},
	} {
		t.Run(c.name, func(t *testing.T) {
			op := fmt.Sprintf("op%d", i)
			key := testenv.NewKeyFile(t, filepath.Join(t.TempDir(), op))
			fp := gossh.FingerprintSHA256(key.Pub())
			h.cli("operator", "add", op, "--key", key.Path+".pub", "--role", "lab")
			cl := newSSHClientAs(t, h, op, key.Path)
			// The loop would run for a minute.
			s := cl.startSession(c.node,
				"echo started; i=0; while [ $i -lt 600 ]; do sleep 0.1; i=$((i+1)); done; echo finished")
			waitFor(t, op+"'s loop to start", 30*time.Second, func() bool { return strings.Contains(s.out.String(), "started") })

			at := time.Now()
			c.withdraw(op)
			waitFor(t, op+"'s ssh to exit after the withdrawal", 10*time.Second, s.exited)
			took := s.ended.Sub(at)
			t.Logf("ssh exited %s after the withdrawal command started; stderr: %q",
				took.Round(time.Millisecond), s.err.String())
			if strings.Contains(s.out.String(), "finished") {
				t.Fatalf("the loop ran to its end: %s", s.out.String())
			}
			if took > 5*time.Second {
				t.Errorf("ssh took %s to exit after the withdrawal", took)
			}
			if errOut := s.err.String(); !strings.Contains(errOut, "tether: your access to this node was withdrawn (") ||
				!strings.Contains(errOut, fp) || !strings.Contains(errOut, "); session ended") {
				t.Errorf("ssh's stderr does not say why the session ended: %q", errOut)
			}

			var revoked, ended int
			count := func() {
				revoked, ended = 0, 0
				for _, e := range h.audit("--node", c.node) {
					switch {
					case e.Kind == "ssh_session_revoked" && e.KeyFP == fp:
						revoked++
					case e.Kind == "jump" && e.Operator == op && e.Result == "ended: access withdrawn" &&
						strings.Contains(e.Detail, c.reason):
						ended++
					}
				}
			}
			waitFor(t, "the node's report and the jump's row", 20*time.Second, func() bool {
				count()
				return revoked > 0 && ended > 0
			})
			// Further pushes of the same change come within milliseconds.
			time.Sleep(time.Second)
			count()
			if revoked != 1 || ended != 1 {
				t.Errorf("%d ssh_session_revoked and %d ended jump rows for one session, want 1 and 1: %+v",
					revoked, ended, h.audit("--node", c.node))
			}
		})
	}
}
